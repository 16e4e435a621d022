"""Weights & Biases and MLflow: optional copies of what metrics.jsonl and eval.jsonl receive.

Telemetry (rank 0 only) hands every step and evaluation record to the trackers of
spec.tracking. Neither library is a core dependency: they come with the `[tracking]` extra
(and the trainer image). Credentials never sit in the spec: the operator sets WANDB_API_KEY and
MLFLOW_TRACKING_TOKEN on the pods from the Secrets the spec names.

Both work without a network. W&B's `mode: auto` goes offline, into <output>/wandb (upload it
later with `wandb sync`), when no API key is set or its host does not answer; MLflow's default
store is the directory <output>/mlruns. A resumed run goes on logging to the run it started,
whose ids are kept in <output>/tracking.json.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any, Callable, Literal, Union
from urllib.parse import urlparse

from rosetta_contract.evaluation_fields import MlflowSpec, TrackingSpec, WandbSpec

log = logging.getLogger(__name__)

IDS_FILE = "tracking.json"
WANDB_HOST = "https://api.wandb.ai"
# step records: field -> metric name (the TensorBoard tags, so that every tool shows the same curves)
STEP_METRICS = {"loss": "loss/train", "val_loss": "loss/validation", "lr": "optim/lr", "grad_norm": "optim/grad_norm",
                "tokens_per_s": "throughput/tokens_per_s", "samples_per_s": "throughput/samples_per_s",
                "mfu": "throughput/mfu", "epoch": "progress/epoch"}
EVAL_METRICS = ("loss", "bleu", "chrf", "rouge1", "rouge2", "rougeL")


def eval_metrics(record: dict[str, Any]) -> dict[str, float]:
    """`validation/bleu`, `validation/bleu_de`, ...: the names Telemetry gives TensorBoard."""
    split = record.get("split", "validation")
    out = {f"{split}/{m}": record[m] for m in EVAL_METRICS if isinstance(record.get(m), (int, float))}
    for lang, scores in (record.get("langs") or {}).items():
        for m in EVAL_METRICS:
            if isinstance(scores.get(m), (int, float)):
                out[f"{split}/{m}_{lang}"] = scores[m]
    return out


def step_metrics(record: dict[str, Any]) -> dict[str, float]:
    return {name: record[key] for key, name in STEP_METRICS.items() if isinstance(record.get(key), (int, float))}


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """The spec as MLflow params: `training.lr: 0.0005`, lists as JSON. MLflow refuses a key with
    other characters than letters, digits, `_ - . / ` and space (a DeepSpeed override's key may
    have them) and a value over 6,000 characters."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{re.sub(r'[^0-9A-Za-z_./ -]', '_', str(key))}."))
        return out
    text = json.dumps(value) if isinstance(value, list) else str(value)
    return {prefix.rstrip(".")[:250]: text[:6000]}


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the URL's host opens: a cluster without egress answers no at once
    or after `timeout`, rather than each log call waiting on W&B's retries."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def wandb_mode(spec: WandbSpec) -> tuple[Literal["online", "offline"], str]:
    """("online" | "offline", why)."""
    if os.environ.get("WANDB_MODE") in ("offline", "dryrun", "disabled"):
        return "offline", f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if spec.mode != "auto":
        return spec.mode, "spec.tracking.wandb.mode"
    if not os.environ.get("WANDB_API_KEY"):
        return "offline", "no WANDB_API_KEY (spec.tracking.wandb.apiKeySecret)"
    host = spec.base_url or os.environ.get("WANDB_BASE_URL") or WANDB_HOST
    if not reachable(host):
        return "offline", f"{host} does not answer"
    return "online", "API key set and host reachable"


class WandbTracker:
    name = "wandb"

    def __init__(self, spec: WandbSpec, *, output: Path, run_name: str, config: dict[str, Any],
                 resume_id: str | None) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("spec.tracking.wandb needs the wandb package: pip install 'rosetta-mt[tracking]'") from None
        mode, why = wandb_mode(spec)
        log.info("W&B %s (%s)", mode, why)
        if spec.base_url:
            os.environ.setdefault("WANDB_BASE_URL", spec.base_url)
        directory = output / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=spec.project, entity=spec.entity, name=run_name, tags=spec.tags or None, config=config,
            dir=str(output), mode=mode, id=resume_id, resume="allow" if resume_id else None,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self.id = self.run.id
        self.mode = mode
        if mode == "offline":
            log.info("W&B run written to %s; upload it with: wandb sync %s", directory, directory)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns before W&B's service process has written the run file out (an offline
        # run's .wandb can still be empty); teardown waits for it and stops the service.
        wandb.teardown()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, spec: MlflowSpec, *, output: Path, run_name: str, experiment: str, params: dict[str, Any],
                 resume_id: str | None) -> None:
        try:
            import mlflow
        except ImportError:
            raise ImportError("spec.tracking.mlflow needs mlflow (or mlflow-skinny): "
                              "pip install 'rosetta-mt[tracking]'") from None
        uri = spec.tracking_uri or (output / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its directory store in maintenance mode behind this switch; the store
            # still works, needs no server and no database package (mlflow-skinny has none).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        from mlflow.entities import Metric, Param

        self._metric, self._param = Metric, Param
        name = spec.experiment or experiment
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        if resume_id:
            self.id = resume_id
            self.client.update_run(resume_id, status="RUNNING")
        else:
            self.id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            items = [Param(k, v) for k, v in flatten(params).items()]
            for start in range(0, len(items), 100):  # log_batch takes at most 100 params
                self.client.log_batch(self.id, params=items[start:start + 100])
        log.info("MLflow run %s in %s (experiment %s)", self.id, uri, name)
        self.uri = uri

    def log(self, metrics: dict[str, float], step: int) -> None:
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[self._metric(k, float(v), now, step) for k, v in metrics.items()])

    def summary(self, values: dict[str, Any]) -> None:
        tags = {k: str(v) for k, v in values.items() if v is not None}
        for key, value in tags.items():
            self.client.set_tag(self.id, key, value)

    def close(self) -> None:
        self.client.set_terminated(self.id)


Tracker = Union["WandbTracker", "MlflowTracker"]


class Trackers:
    """Every tracker of spec.tracking; a tracker that fails is logged and dropped, never the run."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    @classmethod
    def start(cls, spec: TrackingSpec, *, output: Path, name: str, config: dict[str, Any], resumed: bool) -> "Trackers":
        ids_path = output / IDS_FILE
        ids: dict[str, str] = {}
        if resumed and ids_path.is_file():
            try:
                ids = json.loads(ids_path.read_text())
            except (OSError, ValueError):
                ids = {}
        starts: list[tuple[str, Callable[[], Tracker]]] = []
        wandb_spec, mlflow_spec = spec.wandb, spec.mlflow
        if wandb_spec is not None:
            starts.append(("wandb", lambda: WandbTracker(wandb_spec, output=output, run_name=name, config=config,
                                                         resume_id=ids.get("wandb"))))
        if mlflow_spec is not None:
            starts.append(("mlflow", lambda: MlflowTracker(mlflow_spec, output=output, run_name=name, experiment=name,
                                                           params=config, resume_id=ids.get("mlflow"))))
        trackers: list[Tracker] = []
        for tracker_name, start in starts:
            try:
                trackers.append(start())
            except ImportError:
                raise  # the spec asks for a package the environment lacks: say so before any work
            except Exception as exc:  # a rejected key, an unreachable server: train without it
                log.warning("%s: could not start (%s: %s); the run goes on without it", tracker_name,
                            type(exc).__name__, exc)
        if trackers:
            ids_path.write_text(json.dumps({t.name: t.id for t in trackers}) + "\n")
        return cls(trackers)

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # a tracker outage must not stop a training
                log.warning("%s: %s failed (%s); no more logging to it in this run", tracker.name, method, exc)
                self.trackers.remove(tracker)

    def log_step(self, record: dict[str, Any]) -> None:
        metrics = step_metrics(record)
        if metrics:
            self._each("log", metrics, record["step"])

    def log_eval(self, record: dict[str, Any]) -> None:
        metrics = eval_metrics(record)
        if metrics:
            self._each("log", metrics, record["step"])

    def summary(self, values: dict[str, Any]) -> None:
        self._each("summary", values)

    def close(self) -> None:
        self._each("close")
