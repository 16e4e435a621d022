"""`rosetta run -f FILE`: render what the operator would create, then run those pods here.

    output/
      config/training.yaml      the ConfigMap, paths rewritten to local directories
      volumes/<name>/           each persistentVolumeClaim: shared by the pods, kept across restarts
                                (unless --volume NAME=DIR maps it elsewhere; a hostPath is the host's)
      pods/attempt-A/pod-I/     pod I's emptyDirs in restart attempt A, one directory per volume
                                (and config/ when its trainer config points into them); a new run
                                into the same output starts without them, as new pods do
      logs/<pod>.log            each pod's output, every attempt appended
      pods.json                 the current attempt's pods and process ids
      plots/*.png               training loss, learning rate, validation BLEU
      run.json                  the outcome: phase, restarts, exit codes, trainer summary path
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from rosetta_contract.exits import TERMINATION_PREFIX
from rosetta_contract.spec import load_training
from rosetta_operator.evaluation_job import required_evaluation_job
from rosetta_operator.evaluation_status import evaluation_run_phase
from rosetta_operator.failure_policies import fail_fast_exit_codes
from rosetta_operator.local.pods import (
    LocalPod,
    LocalRunError,
    Mounts,
    fit_hardware,
    free_port,
    gpu_count,
    mount_volumes,
    plan_evaluation,
    plan_pods,
    plan_stage,
    trainer_output,
)
from rosetta_operator.local.progress import TrainingProgress
from rosetta_operator.local.report import format_table, summary_rows, write_plots
from rosetta_operator.local.supervisor import LocalJobSet
from rosetta_operator.pod_template import grace_period_seconds
from rosetta_operator.render import render


def parse_volume_args(values: list[str]) -> dict[str, Path]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise LocalRunError(f"--volume {value!r}: expected NAME=LOCAL_DIR")
        out[name] = Path(path).expanduser().resolve()
    return out


def run_evaluation(job: dict[str, Any], mounts: Mounts, out: Path, warn: Callable[[str], None], only: bool = False) -> dict[str, Any]:
    """spec.evaluation.afterTraining, here: the evaluation Job's command as one local process on the
    CPU, after the training succeeded (`only`: spec.mode evaluate, the whole run). Its scores, as
    status.evaluation would hold them."""
    from rosetta_operator.evaluation_status import observe_evaluation

    pod = plan_evaluation(job, mounts, warn=warn, only=only)
    message_file = out / "evaluation-termination-log"
    message_file.unlink(missing_ok=True)
    env = {**os.environ, **pod.env, "ROSETTA_TERMINATION_LOG": str(message_file)}
    log = out / "logs" / f"{pod.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    what = "the pretrained model" if only else "after training on the CPU"
    print(f"[rosetta run] evaluating {what} ({pod.name}; log {log})", flush=True)
    with open(log, "a", encoding="utf-8") as f:
        code = subprocess.run(pod.argv, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    # What the operator would write into status.evaluation, from the same Job and termination message.
    message = message_file.read_text() if message_file.exists() else ""
    ended = {"type": "Complete" if code == 0 else "Failed", "status": "True", "message": f"exit code {code}"}
    evaluation, _ = observe_evaluation({**job, "status": {"conditions": [ended]}}, [
        {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": code, "message": message}}}]}}], None)
    if code != 0:
        warn(f"the evaluation exited with {code}; see {log}")
    else:
        print(f"[rosetta run] evaluation: {json.dumps(evaluation)}", flush=True)
    return evaluation


def stage_work(argv: list[str]) -> str:
    if "--prepare" in argv:
        return "staging model.source/data.source (where set), then preparing the training data"
    return "staging model.source/data.source"


def run_stage(pod: LocalPod, out: Path, warn: Callable[[str], None]) -> bool:
    """The JobSet's stage job, here: `rosetta stage` once, before the pods; whether it succeeded.
    Its refusal (a source that is not there) is what the operator would report as DataInvalid."""
    message_file = out / "stage-termination-log"
    message_file.unlink(missing_ok=True)
    log = out / "logs" / f"{pod.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[rosetta run] stage job: {stage_work(pod.argv)} ({log})", flush=True)
    with open(log, "a", encoding="utf-8") as f:
        code = subprocess.run(pod.argv, env={**os.environ, **pod.env, "ROSETTA_TERMINATION_LOG": str(message_file)},
                              stdout=f, stderr=subprocess.STDOUT).returncode
    if code == 0:
        return True
    reason = message_file.read_text().strip().removeprefix(TERMINATION_PREFIX) if message_file.exists() else ""
    warn(f"staging failed (exit code {code}){': ' + reason if reason else ''}; see {log}")
    (out / "run.json").write_text(json.dumps({"phase": "Failed", "message": f"staging failed: {reason or code}"},
                                             indent=2))
    return False


def run(file: str, *, output: str | None = None, volumes: Sequence[str] = (), overrides: Sequence[str] = (),
        allow_host_path: bool = False, progress: bool = True, quiet: bool = False) -> int:
    training = load_training(file, list(overrides), allow_host_path=allow_host_path)
    spec, name = training.spec, training.metadata.name
    namespace = training.metadata.namespace or "default"
    out = Path(output or Path("runs") / name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rendered = render(name, namespace, spec)

    def warn(msg: str) -> None:
        print(f"[rosetta run] {msg}", file=sys.stderr, flush=True)

    mounts = mount_volumes(rendered, out, parse_volume_args(list(volumes)), warn=warn)
    stage = plan_stage(rendered, mounts, warn=warn)
    if stage is not None and not run_stage(stage, out, warn):
        return 1
    if spec.mode == "evaluate":  # no pods to train: the evaluation Job is the whole run
        evaluation = run_evaluation(required_evaluation_job(name, namespace, spec), mounts, out, warn, only=True)
        phase = evaluation_run_phase(evaluation)
        (out / "run.json").write_text(json.dumps({"phase": phase, "evaluation": evaluation}, indent=2))
        return 0 if phase == "Succeeded" else 1
    hardware = fit_hardware(spec.nodes, spec.gpus_per_node, spec.procs, gpu_count())
    if hardware.note:
        warn(hardware.note)
    print(f"[rosetta run] {name}: {spec.nodes} pod(s) x {hardware.procs_per_pod} process(es), "
          f"output {out}", flush=True)
    bar = TrainingProgress(None, enabled=progress)
    trainer_out: Path | None = None

    def make_pods(attempt: int) -> list[LocalPod]:
        nonlocal trainer_out
        # A fresh rendezvous port per attempt: the last one may linger in TIME_WAIT.
        pods = plan_pods(rendered, spec.nodes, mounts, hardware, master_port=free_port(), attempt=attempt,
                         warn=warn)
        # Rank 0's output: the same every attempt on a PVC, a new emptyDir each attempt otherwise.
        trainer_out = trainer_output(rendered, pods[0].paths)
        bar.follow(trainer_out)
        return pods

    sink = (lambda line: None) if quiet else bar.write
    # The same grace the pods get on a cluster, and that the pods' env tells the trainer.
    grace = float(grace_period_seconds(spec))
    jobset = LocalJobSet(make_pods,
                         max_restarts=spec.failure_policy.max_restarts, grace_seconds=grace,
                         output=out, sink=sink, on_tick=bar.tick, fail_fast_codes=fail_fast_exit_codes(spec))

    def on_signal(signum: int, frame: Any) -> None:
        # Ctrl-C reaches the pods' process groups only through us (they run in new sessions).
        bar.write(f"[rosetta run] {signal.Signals(signum).name}: stopping every pod (SIGTERM, then SIGKILL "
                  f"after {grace:.0f}s)")
        jobset.request_stop(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcome = jobset.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        bar.close()

    if trainer_out is None:  # the supervisor starts a first attempt before anything else
        raise LocalRunError("no pod was started")
    plots = write_plots(trainer_out, out / "plots") if (trainer_out / "metrics.jsonl").exists() else []
    after_evaluation: dict[str, Any] | None = None
    if outcome.phase == "Succeeded" and spec.evaluation.after_training is not None:
        after_evaluation = run_evaluation(required_evaluation_job(name, namespace, spec), mounts, out, warn)
    (out / "run.json").write_text(json.dumps({
        "phase": outcome.phase, "restarts": outcome.restarts, "exit_codes": outcome.exit_codes,
        "message": outcome.message, "trainer_output": str(trainer_out),
        "plots": [str(p) for p in plots], "hardware_note": hardware.note,
        **({"evaluation": after_evaluation} if after_evaluation is not None else {}),
    }, indent=2))
    print(format_table(summary_rows(outcome, trainer_out, plots)), flush=True)
    if outcome.phase == "Succeeded":
        return 0
    return 130 if outcome.phase == "Stopped" else 1
