"""Where a run reports: metrics.jsonl, eval.jsonl, summary.json, TensorBoard, Prometheus and the
experiment trackers of spec.tracking (tracking.py: Weights & Biases, MLflow).

Only rank 0 reports. The same figures go to every sink so that a dashboard, a
script reading the JSON lines and TensorBoard never disagree. The Prometheus
names are listed in rosetta_contract.metric_names.TRAINER_METRICS (the operator
reads this endpoint to fill status.progress; dashboards and alerts use it too).
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from rosetta_contract.evaluation_fields import TrackingSpec
from rosetta_trainer.telemetry.tracking import Trackers, eval_metrics

if TYPE_CHECKING:
    from prometheus_client import Gauge, Info
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)

PREFIX = "rosetta_"
# What rank 0 is doing (rosetta_phase{phase}): the step stands still while it evaluates or saves a
# checkpoint, and the no-progress alert must tell such a pause from a hang.
PHASES = ("train", "evaluate", "checkpoint")
# rosetta_heartbeat_timestamp_seconds: the operator calls a training stalled when this stops moving
# (spec.faultTolerance.stallTimeoutSeconds). Rank 0 beats after each unit of work that may take long:
# an optimizer step, an evaluation batch, a phase's start and end (a whole checkpoint save). Never
# from a timer thread: a thread would go on beating through the very hang it should reveal.


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead of an invalid document."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Drop lines logged after `after_step`: a resumed run will log those steps again."""
    if not path.exists():
        return
    kept: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the half-written last line of a killed process
        if record.get("step", 0) <= after_step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class Telemetry:
    def __init__(self, output: Path, *, name: str, namespace: str | None, port: int, tensorboard: bool,
                 enabled: bool, resumed_step: int = 0, tracking: TrackingSpec | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.enabled = enabled
        self.output = output
        self.metrics_path = output / "metrics.jsonl"
        self.eval_path = output / "eval.jsonl"
        self._tb: SummaryWriter | None = None
        # A labelled gauge, or (gauge, its base labels) for one with a further label (lang, rank, node).
        self._gauges: dict[str, Any] = {}
        self._checkpoint_info: Info | None = None
        self._phase: Gauge | None = None
        self._heartbeat: Gauge | None = None
        self.port: int | None = None
        self._trackers: Trackers | None = None
        if not enabled:
            return
        output.mkdir(parents=True, exist_ok=True)
        for path in (self.metrics_path, self.eval_path):
            truncate_jsonl(path, resumed_step) if resumed_step else path.unlink(missing_ok=True)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(output / "tensorboard"), purge_step=resumed_step + 1)
        if port:
            self._start_prometheus(port, name, namespace or "")
        if tracking is not None and (tracking.wandb or tracking.mlflow):
            self._trackers = Trackers.start(tracking, output=output, name=name, config=config or {},
                                            resumed=resumed_step > 0)

    # ------------------------------------------------------------- Prometheus
    def _start_prometheus(self, port: int, name: str, namespace: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Info, start_http_server

        self.registry = CollectorRegistry()
        labels = {"training": name, "namespace": namespace}
        specs = {
            "step": "Optimizer steps taken",
            "total_steps": "Optimizer steps planned",
            "epoch": "Fractional epoch",
            "loss": "Training loss (label-smoothed cross-entropy per target token)",
            "learning_rate": "Current learning rate",
            "tokens_per_second": "Training tokens (source+target, no padding) per second, all ranks",
            "samples_per_second": "Sentence pairs per second, all ranks",
            "grad_norm": "Gradient norm before clipping",
            "mfu": "Model FLOPs utilisation (0-1) against the accelerator's peak",
            "flops_per_second": "Achieved model FLOP/s, all ranks",
            "step_seconds": "Mean wall seconds per optimizer step",
            "last_checkpoint_step": "Step of the newest complete checkpoint",
            "world_size": "Processes in the run",
            "dataloader_wait_seconds": "Mean seconds per optimizer step spent waiting for the next batch",
            "step_compute_seconds": "Mean seconds per optimizer step in forward and backward (GPU time on a GPU). "
                                    "Under DDP the gradient all-reduce overlaps backward: the part of it that "
                                    "backward cannot hide is counted here",
            "step_optimizer_seconds": "Mean seconds per optimizer step in the optimizer step (GPU time on a GPU): "
                                      "gradient clipping with its norm, the update, the LR schedule; under "
                                      "DeepSpeed engine.step with the communication ZeRO does there",
            "checkpoint_save_seconds": "Wall seconds the last checkpoint save took (all ranks, barriers included)",
            "checkpoint_bytes": "Size on disk of the last checkpoint",
            "restarts": "Gang restarts before this attempt (ROSETTA_RESTART_ATTEMPT)",
            "resumed_from_step": "Step this attempt resumed from (0: started fresh)",
            "bleu": "Latest validation BLEU over all languages",
            "best_bleu": "Best validation score of the primary metric so far (BLEU; ROUGE-L for summarization)",
            "validation_loss": "Latest validation loss (the training criterion, teacher-forced, per target token)",
        }
        for key, doc in specs.items():
            g = Gauge(PREFIX + key, doc, list(labels), registry=self.registry)
            # NaN until reported: a 0 would read as a measurement (MFU on CPU, BLEU before evaluation).
            self._gauges[key] = g.labels(**labels)
            self._gauges[key].set(math.nan)
        for key, doc in {"eval_bleu": "Validation BLEU", "eval_chrf": "Validation chrF",
                         "eval_gender_gap_bleu": "Masculine minus feminine BLEU (MT-GenEval)",
                         "eval_gender_gap_accuracy": "Masculine minus feminine MT-GenEval accuracy, percentage points",
                         "eval_gender_accuracy": "MT-GenEval accuracy: percent of translations with no word of "
                                                 "the wrong gender, both genders"}.items():
            self._gauges[key] = (Gauge(PREFIX + key, doc, [*labels, "lang"], registry=self.registry), labels)
        for key, doc in {"eval_gender_bleu": "BLEU of the masculine and of the feminine half of MT-GenEval",
                         "eval_gender_accuracy_by_gender": "MT-GenEval accuracy of each gender's half, percent"}.items():
            self._gauges[key] = (Gauge(PREFIX + key, doc, [*labels, "lang", "gender"], registry=self.registry),
                                 labels)
        # Every rank's figure, gathered by rank 0 (the only process that serves metrics).
        self._gauges["node_tokens_per_second"] = (Gauge(
            PREFIX + "node_tokens_per_second", "Training tokens per second of the ranks on each node "
            "(node: rank // ranks per node, the JobSet's node index)", [*labels, "node"], registry=self.registry),
            labels)
        self._gauges["gpu_memory_bytes"] = (Gauge(
            PREFIX + "gpu_memory_bytes", "Peak GPU memory allocated by PyTorch on each rank (absent on CPU)",
            [*labels, "rank"], registry=self.registry), labels)
        self._phase = Gauge(PREFIX + "phase", "1 for what rank 0 is doing now (train, evaluate, checkpoint), "
                            "0 for the others", [*labels, "phase"], registry=self.registry)
        self._phase_labels = labels
        self._heartbeat = Gauge(PREFIX + "heartbeat_timestamp_seconds", "Unix time of rank 0's last sign of "
                                "progress: an optimizer step, an evaluation batch, the start or end of an "
                                "evaluation or checkpoint save", list(labels), registry=self.registry).labels(**labels)
        self._set_phase("train")
        self._checkpoint_info = Info(PREFIX + "last_checkpoint", "Path of the newest complete checkpoint",
                                     list(labels), registry=self.registry).labels(**labels)
        server, _thread = start_http_server(port, addr="0.0.0.0", registry=self.registry)
        self._server = server
        self.port = server.server_port
        log.info("metrics on :%d/metrics", self.port)

    def _set(self, key: str, value: float | None) -> None:
        g = self._gauges.get(key)
        if g is not None and value is not None and not isinstance(g, tuple):
            g.set(value)

    def _set_phase(self, current: str) -> None:
        if self._phase is not None:
            for phase in PHASES:
                self._phase.labels(**self._phase_labels, phase=phase).set(1 if phase == current else 0)
        self.beat()

    def beat(self) -> None:
        """Rank 0 got a unit of work done: move rosetta_heartbeat_timestamp_seconds (no-op on other ranks)."""
        if self._heartbeat is not None:
            self._heartbeat.set_to_current_time()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """rosetta_phase says `name` while the block runs, then `train` again."""
        self._set_phase(name)
        try:
            yield
        finally:
            self._set_phase("train")

    # ------------------------------------------------------------------ sinks
    def log_step(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(_clean(record)) + "\n")
        step = record["step"]
        if self._tb is not None:
            for key, tag in (("loss", "loss/train"), ("lr", "optim/lr"), ("grad_norm", "optim/grad_norm"),
                             ("tokens_per_s", "throughput/tokens_per_s"), ("samples_per_s", "throughput/samples_per_s"),
                             ("mfu", "throughput/mfu")):
                if record.get(key) is not None:
                    self._tb.add_scalar(tag, record[key], step)
        if self._trackers is not None:
            self._trackers.log_step(record)
        for key, field in (("step", "step"), ("epoch", "epoch"), ("loss", "loss"), ("learning_rate", "lr"),
                           ("tokens_per_second", "tokens_per_s"), ("samples_per_second", "samples_per_s"),
                           ("grad_norm", "grad_norm"), ("mfu", "mfu"), ("flops_per_second", "flops_per_s"),
                           ("step_seconds", "step_time_s"), ("dataloader_wait_seconds", "data_wait_s"),
                           ("step_compute_seconds", "compute_s"), ("step_optimizer_seconds", "optimizer_s")):
            self._set(key, record.get(field))
        if record.get("node_tokens_per_s") and "node_tokens_per_second" in self._gauges:
            gauge, labels = self._gauges["node_tokens_per_second"]
            for node, value in record["node_tokens_per_s"].items():
                gauge.labels(**labels, node=node).set(value)

    def log_event(self, record: dict[str, Any]) -> None:
        """Something a person must be able to find later (a skipped non-finite step): events.jsonl."""
        if not self.enabled:
            return
        with (self.output / "events.jsonl").open("a") as fh:
            fh.write(json.dumps(_clean(record)) + "\n")

    def log_eval(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.eval_path.open("a") as fh:
            fh.write(json.dumps(_clean(record)) + "\n")
        step = record["step"]
        split = record.get("split", "validation")
        if self._tb is not None:
            # loss, BLEU, chrF, ROUGE: validation/loss, validation/bleu, validation/bleu_de, ...
            for tag, value in eval_metrics(record).items():
                self._tb.add_scalar(tag, value, step)
            if split == "validation" and record.get("loss") is not None:
                self._tb.add_scalar("loss/validation", record["loss"], step)  # beside loss/train
            self._tb.flush()
        if self._trackers is not None:
            self._trackers.log_eval(record)
        if split == "validation":
            self._set("validation_loss", record.get("loss"))
            bleu = record.get("bleu")
            if bleu is not None:
                self._set("bleu", bleu)
            # rosetta_best_bleu has one writer, the loop's set_static: the best of the primary
            # metric, which is ROUGE-L for summarization, not the best BLEU seen here.
            for lang, s in record.get("langs", {}).items():
                for metric, key in (("bleu", "eval_bleu"), ("chrf", "eval_chrf")):
                    if key in self._gauges and s.get(metric) is not None:
                        gauge, labels = self._gauges[key]
                        gauge.labels(**labels, lang=lang).set(s[metric])
                self._log_gender(lang, s.get("gender") or {})

    def _log_gender(self, lang: str, gender: dict[str, Any]) -> None:
        """MT-GenEval's figures for one target language (scoring.gender_scores), where people look."""
        for key, field in (("eval_gender_gap_bleu", "gender_gap_bleu"), ("eval_gender_gap_accuracy", "gender_gap_accuracy"),
                           ("eval_gender_accuracy", "accuracy")):
            if key in self._gauges and gender.get(field) is not None:
                gauge, labels = self._gauges[key]
                gauge.labels(**labels, lang=lang).set(gender[field])
        for key, prefix in (("eval_gender_bleu", "bleu_"), ("eval_gender_accuracy_by_gender", "accuracy_")):
            for g in ("masculine", "feminine"):
                if key in self._gauges and gender.get(prefix + g) is not None:
                    gauge, labels = self._gauges[key]
                    gauge.labels(**labels, lang=lang, gender=g).set(gender[prefix + g])

    def set_static(self, **values: float | None) -> None:
        for key, value in values.items():
            self._set(key, value)

    def log_checkpoint(self, *, step: int, path: Path | str, seconds: float | None = None,
                       size_bytes: int | None = None) -> None:
        """A complete checkpoint is on disk (or, on resume, the one this attempt started from)."""
        self.set_static(last_checkpoint_step=step, checkpoint_save_seconds=seconds, checkpoint_bytes=size_bytes)
        if self._checkpoint_info is not None:
            self._checkpoint_info.info({"path": str(path)})

    def log_rank_values(self, key: str, values: Sequence[float | None]) -> None:
        """One figure per rank (index = rank), e.g. gpu_memory_bytes; None: nothing to report."""
        entry = self._gauges.get(key)
        if entry is None:
            return
        gauge, labels = entry
        for rank, value in enumerate(values):
            if value is not None:
                gauge.labels(**labels, rank=str(rank)).set(value)

    def write_summary(self, summary: dict[str, Any]) -> Path | None:
        if not self.enabled:
            return None
        path = self.output / "summary.json"
        path.write_text(json.dumps(_clean(summary), indent=2) + "\n")
        if self._trackers is not None:
            self._trackers.summary({k: summary.get(k) for k in ("steps", "final_loss", "final_score", "best_score",
                                                                "best_step", "primary_metric", "wall_seconds")})
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
