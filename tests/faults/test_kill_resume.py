"""SIGKILL a rank at random steps and in the middle of checkpoint writes: every run still ends with
bitwise the weights (and the per-step losses) of an uninterrupted run.

CPU, fixed seeds, dropout on (so each rank's RNG stream must be restored, not only the weights and
the optimizer), a checkpoint every INTERVAL steps, more than one epoch (so the data position crosses
an epoch boundary). The test plays the JobSet: it SIGKILLs one rank, lets the rest of the gang die,
and starts the training again, which resumes from its newest complete checkpoint.

Where and how each kill lands is drawn from a generator seeded by KILL_SEED (default below), printed
in every assertion message: `KILL_SEED=<seed> pytest tests/faults/test_kill_resume.py` replays a
failure's plan (the exact step a kill lands on still varies by a step or two with the timing).

A 2-rank start-up (torchrun and two trainers) costs about twice a 1-rank one on 2 cores, so the 1-rank
runs take 10 of the kills and one 2-rank run (DDP over gloo) 3: one of each rank and a third of
either, two of them during a save (it killed 5 times, 7 gang starts for what 5 now do). Each run's
kills during a save land in phases drawn without replacement: the two 1-rank runs kill each phase
twice, wherever their steps fall (three runs of random phases took 19 trainer starts to cover what
13 now do).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints, step_dir_name
from support.trainer_processes import kill_gang, lines_of, new_records, rank_pid, start_training
from support.training import TINY, deep_update, read_jsonl

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("KILL_SEED", "20261121"))
KILLS_PER_RUN = 5  # one rank; a 2-rank run kills TWO_RANK_KILLS times
TWO_RANK_KILLS = 3
INTERVAL = 5
POLL = 0.002
TIMEOUT = 300
RESUMED = re.compile(r"resuming from (\S+) \(step (\d+)\)")
# Where a kill during a checkpoint write lands: the directory just created, the weights written,
# the COMPLETE marker written but the directory not yet renamed into place.
SAVE_PHASES = {"created": ".", "weights written": "model/model.safetensors", "marked complete": "COMPLETE"}


def max_steps(kills: int) -> int:
    """Each kill lands within 2 intervals of the newest checkpoint, so the runs never run out of steps."""
    return 2 * INTERVAL * (kills + 1) + 4


def config(kills: int) -> dict:
    return deep_update(TINY, {"spec": {
        "model": {"dropout": 0.1},
        "data": {"train": [{"format": "generated", "size": 400, "seed": 1}]},
        "training": {"maxSteps": max_steps(kills), "logInterval": 1},
        "checkpoint": {"interval": INTERVAL, "keep": 2},
        # no evaluation: it does not touch the weights and would only lengthen every attempt
        "evaluation": {"interval": 100000, "atEnd": False},
        "metrics": {"port": 0, "tensorboard": False},
    }})


@dataclass
class Kill:
    attempt: int
    rank: int
    how: str  # "step N" or "saving step N (phase)"
    newest_at_start: int  # newest complete checkpoint when the attempt started
    landed_at_step: int | None = None  # last step the attempt logged
    resume_point: int | None = None  # newest complete checkpoint after the kill
    half_written: str | None = None  # the .tmp-step-* directory the kill left behind, if any
    resumed_from: int | None = None  # what the next attempt resumed from


@dataclass
class Run:
    ranks: int
    planned: int  # kills before the attempt that finishes
    output: Path
    kills: list[Kill] = field(default_factory=list)
    attempts: int = 0
    first_step_s: list[float] = field(default_factory=list)  # launch → first step, per attempt
    logs: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def checkpoints(self) -> Path:
        return self.output / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.output / "metrics.jsonl"


def newest_step(root: Path) -> int:
    found = complete_checkpoints(root)
    return int(found[-1].name.split("-")[1]) if found else 0


def launch(cfg: Path, run: Run) -> subprocess.Popen:
    log = run.output.parent / f"{run.output.name}-attempt-{run.attempts}.log"
    run.logs.append(log)
    env = {"ROSETTA_RESTART_ATTEMPT": str(run.attempts)}
    run.procs.append(start_training(cfg, run.output, run.ranks, log, env))
    return run.procs[-1]


def wait_until(what: str, done, proc: subprocess.Popen, run: Run) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the training ended (code {proc.returncode}) before {what}; seed {SEED}\n"
                                 + run.logs[-1].read_text()[-3000:])
        assert time.monotonic() < deadline, f"no {what} after {TIMEOUT} s; seed {SEED}"
        time.sleep(POLL)


def stop_attempt(proc: subprocess.Popen, victim: int | None) -> None:
    """SIGKILL the victim, wait for the launcher to give up, and clear what is left of the gang."""
    if victim is not None:
        os.kill(victim, signal.SIGKILL)
    try:
        proc.wait(timeout=TIMEOUT)
    finally:
        kill_gang(proc)  # data-loader workers, a worker torchrun left behind


def kill_and_resume(cfg: Path, run: Run, rng: random.Random, save_kills: int) -> None:
    """run.planned attempts each killed at a random point, then one that finishes.

    Every draw is made whatever the timing, so that a seed always gives the same plan.
    """
    kinds = ["save"] * save_kills + ["step"] * (run.planned - save_kills)
    rng.shuffle(kinds)
    phases = rng.sample(sorted(SAVE_PHASES), save_kills)  # a save kill lands in a phase of its own
    # each rank of a gang is killed at least once
    victims = [*range(run.ranks)] * (run.planned // run.ranks)
    victims += [rng.randrange(run.ranks) for _ in range(run.planned - len(victims))]
    rng.shuffle(victims)
    for kind, rank in zip([*kinds, None], [*victims, None]):
        newest = newest_step(run.checkpoints)
        stale = lines_of(run.metrics)
        proc = attempt(cfg, run, stale)
        if kind is None:
            assert proc.wait(timeout=TIMEOUT) == 0, f"seed {SEED}\n{run.logs[-1].read_text()[-3000:]}"
            return
        victim = rank_pid(proc, run.ranks, rank, TIMEOUT)
        tmp = final = None
        if kind == "step":
            target = newest + rng.randint(1, 2 * INTERVAL)
            kill = Kill(run.attempts - 1, rank, f"step {target}", newest)
            wait_until(f"step {target}", lambda: any(r["step"] >= target for r in new_records(run.metrics, stale)),
                       proc, run)
        else:
            # one of the next two checkpoints; not one whose temporary directory an earlier kill left
            # (there is at most one such), as the poll would see that one at once
            steps = [newest + INTERVAL * k for k in (1, 2)]
            step = rng.choice(steps)
            if (run.checkpoints / f".tmp-{step_dir_name(step)}").exists():
                step = next(s for s in steps if s != step)
            phase = phases.pop()
            tmp = run.checkpoints / f".tmp-{step_dir_name(step)}"
            final = run.checkpoints / step_dir_name(step) / "COMPLETE"
            kill = Kill(run.attempts - 1, rank, f"saving step {step} ({phase})", newest)
            # if the save is over before the poll sees the phase, the kill lands right after it
            wait_until(f"the save of step {step}", lambda: (tmp / SAVE_PHASES[phase]).exists() or final.exists(),
                       proc, run)
        stop_attempt(proc, victim)
        kill.landed_at_step = max((r["step"] for r in new_records(run.metrics, stale)), default=None)
        if tmp is not None and tmp.exists() and not final.exists():
            kill.half_written = tmp.name
        kill.resume_point = newest_step(run.checkpoints)  # what the next attempt must resume from
        run.kills.append(kill)


def attempt(cfg: Path, run: Run, stale: set[str]) -> subprocess.Popen:
    """Start the next attempt and wait for its first step; note what it resumed from."""
    started = time.monotonic()
    proc = launch(cfg, run)
    run.attempts += 1
    wait_until("a first step", lambda: new_records(run.metrics, stale), proc, run)
    run.first_step_s.append(time.monotonic() - started)
    if run.kills:
        match = RESUMED.search(run.logs[-1].read_text())
        run.kills[-1].resumed_from = int(match.group(2)) if match else 0
    return proc


def train_and_kill(tmp_path: Path, ranks: int, runs: int, save_kills: int, kills: int) -> tuple[Run, list[Run]]:
    cfg = tmp_path / "training.yaml"
    cfg.write_text(yaml.safe_dump(config(kills)))
    rng = random.Random(SEED * 10 + ranks)
    reference = Run(ranks, kills, tmp_path / "reference")
    interrupted = [Run(ranks, kills, tmp_path / f"run-{i}") for i in range(runs)]
    try:
        proc = attempt(cfg, reference, set())
        assert proc.wait(timeout=TIMEOUT) == 0, reference.logs[-1].read_text()[-3000:]
        for run in interrupted:
            kill_and_resume(cfg, run, rng, save_kills)
    finally:  # a failed assertion leaves nothing running
        for proc in [p for r in (reference, *interrupted) for p in r.procs if p.poll() is None]:
            kill_gang(proc)
    return reference, interrupted


def weights(run: Run) -> dict[str, torch.Tensor]:
    return load_file(run.checkpoints / step_dir_name(max_steps(run.planned)) / "model" / "model.safetensors")


def assert_same_as_uninterrupted(reference: Run, run: Run) -> None:
    story = f"seed {SEED}, {run.output.name}, kills: " + "; ".join(
        f"rank {k.rank} at {k.how} (landed after step {k.landed_at_step}, resumed from {k.resumed_from})"
        for k in run.kills)
    for kill in run.kills:
        # never a half-written checkpoint: always the newest complete one the kill left
        assert kill.resumed_from == kill.resume_point, story
    summary = json.loads((run.output / "summary.json").read_text())
    assert summary["steps"] == max_steps(run.planned) and summary["completed"] is True, story
    assert summary["restart_attempt"] == run.planned, story
    assert summary["resumed_from_step"] == run.kills[-1].resume_point, story

    # the metrics read as one run: every step once, with the loss of the uninterrupted run
    ref_steps, steps = read_jsonl(reference.metrics), read_jsonl(run.metrics)
    assert [r["step"] for r in steps] == list(range(1, max_steps(run.planned) + 1)), story
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in steps] == [r[key] for r in ref_steps], f"{key} differs; {story}"
    ref, got = weights(reference), weights(run)
    assert ref.keys() == got.keys(), story
    for name in ref:
        assert torch.equal(ref[name], got[name]), f"{name} differs from the uninterrupted run; {story}"


def report(label: str, reference: Run, runs: list[Run]) -> None:
    kills = [k for r in runs for k in r.kills]
    resumed = [s for r in runs for s in r.first_step_s[1:]]
    redone = [k.landed_at_step - k.resume_point for k in kills if k.landed_at_step is not None]
    print(f"\n{label}: {len(kills)} SIGKILLs over {len(runs)} runs (seed {SEED}); "
          f"{sum(k.half_written is not None for k in kills)} left a half-written checkpoint; "
          f"launch to first step: fresh {reference.first_step_s[0]:.1f} s, "
          f"resumed mean {sum(resumed) / len(resumed):.1f} s; steps redone per kill: mean "
          f"{sum(redone) / max(1, len(redone)):.1f}, max {max(redone, default=0)}")
    for run in runs:
        for k in run.kills:
            print(f"  {run.output.name} attempt {k.attempt}: rank {k.rank} at {k.how}, last step logged "
                  f"{k.landed_at_step}, half-written {k.half_written}, resumed from {k.resumed_from}")


def test_sigkill_at_random_steps_and_mid_checkpoint_one_rank(tmp_path):
    reference, runs = train_and_kill(tmp_path, ranks=1, runs=2, save_kills=3, kills=KILLS_PER_RUN)
    report("1 rank", reference, runs)
    for run in runs:
        assert_same_as_uninterrupted(reference, run)
    kills = [k for r in runs for k in r.kills]
    assert len(kills) == 10
    for run in runs:  # every phase of a save was killed in every run
        assert sorted(k.how.split("(")[1].rstrip(")") for k in run.kills if k.how.startswith("saving")) == \
            sorted(SAVE_PHASES), f"seed {SEED}"
    # the save kills are drawn so that they land inside a write unless the poll is far too slow
    assert any(k.half_written for k in kills), f"no kill left a half-written checkpoint; seed {SEED}"


def test_sigkill_of_either_rank_of_a_two_rank_gang(tmp_path):
    reference, (run,) = train_and_kill(tmp_path, ranks=2, runs=1, save_kills=2, kills=TWO_RANK_KILLS)
    report("2 ranks", reference, [run])
    assert_same_as_uninterrupted(reference, run)
    assert len(run.kills) == TWO_RANK_KILLS and {k.rank for k in run.kills} == {0, 1}
