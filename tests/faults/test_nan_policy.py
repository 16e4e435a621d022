"""Numerical faults: a non-finite loss/gradient is detected, the step is recorded, and the
policy (skip | stop) is applied; no checkpoint ever holds non-finite weights.

The fault is injected into the real trainer by nan_injection.py: rank 0's loss becomes
NaN at chosen steps, and the all-reduce spreads it to every rank's gradients.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints
from support.training import TINY, deep_update, read_jsonl

pytestmark = pytest.mark.slow

INJECT = Path(__file__).with_name("nan_injection.py")


def run(tmp_path: Path, patch: dict, steps: str, procs: int = 1) -> tuple[subprocess.CompletedProcess, Path]:
    config = tmp_path / "training.yaml"
    config.write_text(yaml.safe_dump(deep_update(TINY, {"spec": patch})))
    out = tmp_path / "run"
    launcher = [sys.executable] if procs == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([*launcher, str(INJECT), steps, "--", "train", "-f", str(config), "--output", str(out),
                          "--no-progress"], capture_output=True, text=True, env=env, timeout=1500)
    return res, out


def finite_weights(checkpoint: Path) -> bool:
    files = list((checkpoint / "model").glob("*.safetensors"))
    assert files, f"no weights in {checkpoint}"
    return all(torch.isfinite(t).all() for f in files for t in load_file(str(f)).values())


def test_skip_records_the_step_and_keeps_training(tmp_path):
    res, out = run(tmp_path, {"training": {"nanPolicy": "skip"}}, "7,8")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step 7: non-finite gradient norm" in res.stderr and "nanPolicy is 'skip'" in res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_steps"] == [7, 8] and summary["completed"]
    events = read_jsonl(out / "events.jsonl")
    assert [(e["event"], e["step"], e["policy"]) for e in events] == [("non_finite", 7, "skip"), ("non_finite", 8, "skip")]
    metrics = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
    assert metrics[6]["skipped_steps"] == 0 and metrics[8]["skipped_steps"] == 2
    assert metrics[7]["grad_norm"] is None  # NaN is written as null
    # Later steps train on finite weights: finite losses, and every checkpoint is finite.
    assert all(metrics[s]["loss"] is not None for s in range(9, 21))
    assert [c.name for c in complete_checkpoints(out / "checkpoints")] == ["step-00000010", "step-00000020"]
    assert all(finite_weights(c) for c in complete_checkpoints(out / "checkpoints"))


def test_stop_fails_clearly_and_leaves_the_last_good_checkpoint(tmp_path):
    res, out = run(tmp_path, {"training": {"nanPolicy": "stop"}}, "13")
    assert res.returncode == 3, (res.returncode, res.stderr[-3000:])
    assert "step 13: non-finite gradient norm" in res.stderr and "nanPolicy is 'stop'" in res.stderr
    assert "Traceback" not in res.stderr
    ckpts = complete_checkpoints(out / "checkpoints")
    assert [c.name for c in ckpts] == ["step-00000010"]
    assert finite_weights(ckpts[0])
    assert read_jsonl(out / "events.jsonl")[0]["step"] == 13
    # Rerunning resumes from step 10 (the fault was transient here) and finishes.
    config = tmp_path / "training.yaml"
    res = subprocess.run([sys.executable, "-m", "rosetta_trainer", "train", "-f", str(config), "--output", str(out),
                          "--no-progress"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 10 and summary["steps"] == 20


def test_zero2_skips_a_step_whose_gradients_are_not_finite(tmp_path):
    """Under DeepSpeed the ZeRO optimizer detects the non-finite norm itself and skips the
    update on every rank (NaN on rank 0 only, spread by the gradient reduction)."""
    res, out = run(tmp_path, {"training": {"nanPolicy": "skip", "maxSteps": 12},
                              "distributed": {"backend": "deepspeed", "zeroStage": 2},
                              "checkpoint": {"interval": 6}, "evaluation": {"interval": 6}}, "5", procs=2)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_steps"] == [5] and summary["steps"] == 12
    exported = load_file(str(out / "export" / "final" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in exported.values())
