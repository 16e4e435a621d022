"""Preemption of a 2-rank run: after SIGTERM every rank stops at the same step, writes one complete
checkpoint and exits 0 within the pod's grace period, and a restart resumes from exactly that step.

One run is stopped three ways in turn, each attempt resuming from the last one's stop checkpoint:
SIGTERM to every rank (what each pod's processes get when the JobSet is deleted or preempted), to
one rank only (the others must agree to stop with it), and to the pod's main process, which is what
the kubelet signals: the launcher (rosetta_trainer.launch), which forwards it to torchrun, which
forwards it to its workers. The pods' env comes from the rendered JobSet, so torchrun waits the pod's
grace (not its own 30 s) before it SIGKILLs. Each attempt runs as the pod does, under the launcher,
which keeps the node's log of the attempt beside the checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rosetta_contract.failures import ATTEMPT_ENV, attempt_log_path
from rosetta_contract.spec import parse_training
from rosetta_operator.render import render
from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints
from rosetta_trainer.engine.preemption import GRACE_ENV
from support.trainer_processes import has_exited, kill_gang, lines_of, new_records, rank_pid
from support.training import TINY, deep_update

pytestmark = pytest.mark.slow

RANKS = 2
GRACE = 60
# The ranks agree to stop within ~2 steps of the signal; the rest is steps that finished between
# the test reading the metrics and sending the signal.
STEPS_TO_STOP = 4
TIMEOUT = 300
RESUMED = re.compile(r"resuming from \S+ \(step (\d+)\)")

DOCUMENT = deep_update(TINY, {"spec": {
    "terminationGracePeriodSeconds": GRACE,
    "training": {"maxSteps": 100000, "logInterval": 1},
    # no periodic checkpoints: every checkpoint in this test is a stop checkpoint
    "checkpoint": {"interval": 100000, "keep": 5},
    "evaluation": {"interval": 100000, "atEnd": False},
    "metrics": {"port": 0, "tensorboard": False},
}})


@dataclass
class Stop:
    signalled: str
    step_at_signal: int
    stop_step: int
    checkpoint_s: float  # SIGTERM → the stop checkpoint's COMPLETE marker on disk
    rank_exit_s: list[float]  # SIGTERM → each rank's exit
    launcher_code: int
    reported_s: float | None = None  # what the trainer logged (the ranks that got the signal)


def pod_env() -> dict[str, str]:
    """What the rendered pod tells its processes about the grace period."""
    training = parse_training(DOCUMENT)
    container = render("tiny", "default", training.spec).jobset["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"] in (GRACE_ENV, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")}
    assert env == {GRACE_ENV: str(GRACE), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(GRACE)}
    return env


def start_pod(cfg: Path, output: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """The pod's command, RANKS workers on one node: the launcher, running torchrun; in a new session."""
    command = ["-m", "rosetta_trainer.launch", "torchrun", "--standalone", f"--nproc-per-node={RANKS}",
               "-m", "rosetta_trainer", "train", "-f", str(cfg), "--output", str(output), "--no-progress"]
    with open(log, "w") as fh:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, *command], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                                     "ROSETTA_OUTPUT": str(output), **env})


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return out


def torchrun(launcher: subprocess.Popen, timeout: float = 60) -> SimpleNamespace:
    """The launcher's one child, as support's rank_pid wants a launcher (its workers are its children)."""
    deadline = time.monotonic() + timeout
    while not children(launcher.pid):
        assert launcher.poll() is None and time.monotonic() < deadline, "the launcher started no torchrun"
        time.sleep(0.01)
    (pid,) = children(launcher.pid)
    return SimpleNamespace(pid=pid, poll=launcher.poll)


def kill_pod(launcher: subprocess.Popen) -> None:
    """SIGKILL the launcher's group (with torchrun) and each worker's (torchrun gives each a session)."""
    for worker in [w for t in children(launcher.pid) for w in children(t)]:
        try:
            os.killpg(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_gang(launcher)


def wait_for(what: str, done, proc: subprocess.Popen, log: Path, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"the training ended (code {proc.returncode}) before {what}:\n" \
                                    + log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.005)


def stop_with_sigterm(proc: subprocess.Popen, log: Path, output: Path, stale: set[str], target: str) -> Stop:
    """Let the attempt take a few steps, SIGTERM `target` ("ranks", "rank N" or "launcher"), and time it."""
    metrics, root = output / "metrics.jsonl", output / "checkpoints"
    ranks = [rank_pid(torchrun(proc), RANKS, r) for r in range(RANKS)]
    wait_for("3 steps", lambda: len(new_records(metrics, stale)) >= 3, proc, log)
    before = set(complete_checkpoints(root))
    step_at_signal = new_records(metrics, stale)[-1]["step"]
    victims = {"ranks": ranks, "launcher": [proc.pid]}.get(target) or [ranks[int(target.split()[1])]]
    signalled_at = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGTERM)

    exited: dict[int, float] = {}
    checkpoint_s = None
    deadline = signalled_at + GRACE
    while len(exited) < RANKS or checkpoint_s is None:
        now = time.monotonic()
        assert now < deadline, f"SIGTERM to {target}: not done within the grace period of {GRACE} s:\n" \
                               + log.read_text()[-3000:]
        if checkpoint_s is None and set(complete_checkpoints(root)) - before:
            checkpoint_s = now - signalled_at
        for rank, pid in enumerate(ranks):
            if rank not in exited and has_exited(pid):
                exited[rank] = now - signalled_at
        time.sleep(0.005)
    code = proc.wait(timeout=TIMEOUT)
    (new,) = set(complete_checkpoints(root)) - before  # one stop checkpoint, for every rank
    return Stop(target, step_at_signal, int(new.name.split("-")[1]), checkpoint_s,
                [exited[r] for r in range(RANKS)], code)


def test_sigterm_stops_every_rank_at_one_checkpoint_within_the_grace_and_a_restart_resumes_there(tmp_path):
    cfg = tmp_path / "training.yaml"
    cfg.write_text(yaml.safe_dump(DOCUMENT))
    output, env = tmp_path / "out", pod_env()
    stops: list[Stop] = []
    for attempt, target in enumerate(["ranks", "rank 1", "launcher", None]):
        log = tmp_path / f"attempt-{attempt}.log"
        stale = lines_of(output / "metrics.jsonl")
        proc = start_pod(cfg, output, log, {**env, ATTEMPT_ENV: str(attempt)})
        try:
            if stops:  # resumed from exactly where the last attempt stopped
                wait_for("a first step", lambda: new_records(output / "metrics.jsonl", stale), proc, log)
                resumed = RESUMED.search(log.read_text())
                assert resumed and int(resumed.group(1)) == stops[-1].stop_step, log.read_text()[-3000:]
                assert new_records(output / "metrics.jsonl", stale)[0]["step"] == stops[-1].stop_step + 1
            if target is None:
                break
            stop = stop_with_sigterm(proc, log, output, stale, target)
        finally:
            kill_pod(proc)
        stops.append(stop)
        text = log.read_text()
        # the launcher's copy of this attempt's output, kept where the next attempt's pod finds it
        assert (output / attempt_log_path(attempt, 0)).read_text() == text
        assert stop.step_at_signal < stop.stop_step <= stop.step_at_signal + STEPS_TO_STOP, (stop, text[-3000:])
        # every rank exited 0: torchrun exits 0 only if its workers did, and no rank wrote a traceback;
        # torchrun signalled (by the launcher) exits with the SIGTERM's exception once its workers are
        # done, and the launcher with torchrun's 1: no failure class, the stop was no error
        if target == "launcher":
            assert stop.launcher_code == 1 and text.count("Traceback") == 1 and "SignalException" in text
        else:
            assert stop.launcher_code == 0 and "Traceback" not in text, text[-3000:]
        summary = json.loads((output / "summary.json").read_text())
        assert summary["steps"] == stop.stop_step and summary["stopped_early"] is True
        if target != "rank 1":  # rank 0 got the signal: it says how much of the grace the stop used
            assert re.search(rf"checkpoint at step {stop.stop_step} written [\d.]+ s after SIGTERM "
                             rf"\(grace period {GRACE} s\)", text), text[-3000:]
            stop.reported_s = summary["stop_checkpoint_seconds"]
            assert 0 < stop.reported_s < GRACE

    print("\nSIGTERM → stop checkpoint complete / every rank exited (s), grace", GRACE, "s:")
    for s in stops:
        print(f"  {s.signalled:9} step {s.step_at_signal} → stopped at {s.stop_step}: checkpoint "
              f"{s.checkpoint_s:.2f} s, ranks exited {', '.join(f'{t:.2f}' for t in s.rank_exit_s)} s, "
              f"launcher exit {s.launcher_code}, trainer's own figure {s.reported_s}")
