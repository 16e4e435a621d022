"""Real trainings on CPU: the loss falls, outputs land, resume is exact, DDP works under torchrun."""

import functools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints, latest_checkpoint
from rosetta_trainer.commands.train import train_from_file
from support.training import SHARED, read_jsonl

pytestmark = pytest.mark.slow


def weights(checkpoint_dir):
    return load_file(str(checkpoint_dir / "model" / "model.safetensors"))


def test_loss_falls_and_every_output_is_written(write_config, tmp_path):
    cfg = write_config({"training": {"maxSteps": 120, "learningRate": 1e-2,
                                     "batch": {"sentences": 32}}, "checkpoint": {"interval": 40, "keep": 1},
                        "evaluation": {"interval": 40}})
    out = tmp_path / "run"
    summary = train_from_file(str(cfg), str(out), progress=False)

    steps = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 121))
    first, last = sum(r["loss"] for r in steps[:5]) / 5, sum(r["loss"] for r in steps[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    for key in ("epoch", "lr", "tokens_per_s", "samples_per_s", "grad_norm", "flops_per_s", "mfu"):
        assert key in steps[-1]
    assert steps[-1]["tokens_per_s"] > 0 and steps[-1]["flops_per_s"] > 0
    assert steps[-1]["mfu"] is None  # no accelerator peak on a CPU: achieved FLOP/s only
    # The window's sums land in their own figures: 32 sentences a step, target tokens a part of all
    # tokens, the step's seconds split into waiting, forward+backward and the optimizer.
    assert max(r["samples_per_s"] * r["step_time_s"] for r in steps) == pytest.approx(32)
    assert 0 < steps[-1]["target_tokens_per_s"] < steps[-1]["tokens_per_s"]
    assert all(steps[-1][key] >= 0 for key in ("data_wait_s", "compute_s", "optimizer_s"))
    assert steps[-1]["compute_s"] > 0

    evals = read_jsonl(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [40, 80, 120]
    assert all(0 <= e["bleu"] <= 100 and 0 <= e["chrf"] <= 100 for e in evals)
    assert "nrefs:1" in evals[0]["bleu_signature"] and "de" in evals[0]["langs"]

    saved = json.loads((out / "summary.json").read_text())
    assert saved["steps"] == summary["steps"] == 120
    assert saved["world_size"] == 1
    assert saved["best_score"] == saved["best_bleu"] == max(e["bleu"] for e in evals)
    assert saved["primary_metric"] == "bleu" and saved["final_score"] == evals[-1]["bleu"]
    # keep=1 plus the best by BLEU
    kept = [p.name for p in complete_checkpoints(out / "checkpoints")]
    best_step = saved["best_step"]
    assert kept == sorted({f"step-{best_step:08d}", "step-00000120"})
    assert json.loads((out / "checkpoints" / "best.json").read_text())["step"] == best_step
    assert any((out / "tensorboard").iterdir())


@pytest.mark.parametrize("weights_in", ["fp32", "bf16 with fp32 masters"])
def test_resume_continues_exactly_where_it_stopped(write_config, tmp_path, weights_in):
    """2N steps straight == N steps, then a new process resuming N more (noam: LR ignores the total).

    The two runs train their own tokenizers, so this also relies on tokenizer training being
    deterministic; BPE here, so that a real training covers it (the other tests use Unigram). With
    bf16Parameters the checkpoint's fp32 masters must give back both the masters and their bf16
    parameters.
    """
    n = 10
    precision = {"training": {"precision": "bf16", "bf16Parameters": True}} if weights_in != "fp32" else {}
    write_config = functools.partial(write_config, {"tokenizer": {"train": {"type": "bpe", "vocabSize": 300}},
                                                    **precision})
    straight = tmp_path / "straight"
    train_from_file(str(write_config()), str(straight), overrides=[f"spec.training.maxSteps={2 * n}"], progress=False)

    split = tmp_path / "split"
    first = train_from_file(str(write_config()), str(split), overrides=[f"spec.training.maxSteps={n}"], progress=False)
    assert first["steps"] == n
    second = train_from_file(str(write_config()), str(split), overrides=[f"spec.training.maxSteps={2 * n}"],
                             progress=False)
    assert second["resumed_from_step"] == n

    a = {r["step"]: r["loss"] for r in read_jsonl(straight / "metrics.jsonl")}
    b = {r["step"]: r["loss"] for r in read_jsonl(split / "metrics.jsonl")}
    assert sorted(b) == list(range(1, 2 * n + 1))  # the resumed run logs the same step numbers
    for step in range(n + 1, 2 * n + 1):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
    wa, wb = weights(latest_checkpoint(straight / "checkpoints")), weights(latest_checkpoint(split / "checkpoints"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5


def test_partial_checkpoints_are_ignored(write_config, tmp_path):
    out = tmp_path / "run"
    train_from_file(str(write_config()), str(out), progress=False)
    root = out / "checkpoints"
    assert latest_checkpoint(root).name == "step-00000020"
    # A newer directory without the COMPLETE marker (a crash mid-copy) and a temp dir of a crashed save.
    half = root / "step-00000030"
    shutil.copytree(root / "step-00000020", half)
    (half / "COMPLETE").unlink()
    (half / "model" / "model.safetensors").write_bytes(b"truncated")
    (root / ".tmp-step-00000040").mkdir()
    assert latest_checkpoint(root).name == "step-00000020"

    summary = train_from_file(str(write_config()), str(out), overrides=["spec.training.maxSteps=30"], progress=False)
    assert summary["resumed_from_step"] == 20 and summary["steps"] == 30
    assert (root / "step-00000030" / "COMPLETE").exists()
    weights(root / "step-00000030")  # rewritten whole: loads


def test_evaluate_and_translate_commands_use_a_checkpoint(write_config, tmp_path):
    out = tmp_path / "run"
    train_from_file(str(write_config({"data": {"test": [{"format": "generated", "size": 10, "seed": 3}]}})),
                    str(out), progress=False)
    ckpt = latest_checkpoint(out / "checkpoints")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, "-m", "rosetta_trainer", "evaluate", "--checkpoint", str(ckpt),
                          "--beams", "2", "--output", str(tmp_path / "eval")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    scores = json.loads((tmp_path / "eval" / "test.scores.json").read_text())
    assert scores["samples"] == 10 and "bleu" in scores and "chrf" in scores
    assert len((tmp_path / "eval" / "test.hyp.txt").read_text().splitlines()) == 10

    res = subprocess.run([sys.executable, "-m", "rosetta_trainer", "translate", "--checkpoint", str(ckpt),
                          "--beams", "1"], input="three red apples\nfive cars\n", capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 2


def test_checkpoint_average_at_the_end_is_evaluated_and_recorded(write_config, tmp_path, monkeypatch):
    """checkpoint.average: the last 3 checkpoints are averaged after the last step and the result is
    evaluated like the final model; metrics.peakFlops gives an MFU even on a CPU."""
    monkeypatch.setenv("ROSETTA_PEAK_FLOPS", "1e15")  # the spec's figure wins over the environment
    cfg = write_config({"training": {"maxSteps": 30},
                        "checkpoint": {"interval": 10, "keep": 3, "average": {"last": 3}},
                        "data": {"test": [{"format": "generated", "size": 10, "seed": 3}]},
                        "metrics": {"peakFlops": 1.0e+9}})
    out = tmp_path / "run"
    summary = train_from_file(str(cfg), str(out), progress=False)

    averaged = summary["averaged"]
    path = out / "checkpoints" / "averaged"
    assert averaged["path"] == str(path) and averaged["selection"] == "last 3"
    assert averaged["checkpoints"] == ["step-00000010", "step-00000020", "step-00000030"]
    assert averaged["test"]["samples"] == 10 and 0 <= averaged["test"]["bleu"] <= 100
    assert averaged["validation"]["samples"] == 24
    assert json.loads((out / "summary.json").read_text())["averaged"]["test"] == averaged["test"]
    splits = [e["split"] for e in read_jsonl(out / "eval.jsonl")]
    assert splits[-2:] == ["validation-averaged", "test-averaged"]
    # Not a checkpoint (never resumed from, never pruned), but loads as one.
    assert [p.name for p in complete_checkpoints(out / "checkpoints")][-1] == "step-00000030"
    res = subprocess.run([sys.executable, "-m", "rosetta_trainer", "translate", "--checkpoint", str(path),
                          "--beams", "1", "five cars"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr

    steps = read_jsonl(out / "metrics.jsonl")
    assert steps[-1]["mfu"] == pytest.approx(steps[-1]["flops_per_s"] / 1e9)
    assert summary["peak_flops"] == 1e9


def test_too_few_checkpoints_to_average_leave_the_run_successful(write_config, tmp_path):
    # With `epochs` the spec cannot know how many checkpoints there will be: 0.4 epochs are 20 steps, 2 checkpoints.
    patch = {"training": {"maxSteps": None, "epochs": 0.4}, "checkpoint": {"interval": 10, "keep": 3,
                                                                          "average": {"last": 3}}}
    summary = train_from_file(str(write_config(patch)), str(tmp_path / "run"), progress=False)
    assert summary["completed"] and summary["steps"] == 20
    assert "holds only 2 complete checkpoint(s)" in summary["averaged"]["error"]
    assert not (tmp_path / "run" / "checkpoints" / "averaged").exists()


def test_gender_figures_on_mt_geneval(write_config, tmp_path):
    geneval = SHARED / "data" / "mt-geneval"
    assert geneval.is_dir(), "../shared/data/mt-geneval is part of the test environment"
    cfg = write_config({"training": {"maxSteps": 2}, "checkpoint": {"interval": 2},
                        "evaluation": {"interval": 2, "maxSamples": 16},
                        "data": {"validation": [{"format": "mtgeneval", "path": str(geneval), "limit": 8}]}})
    train_from_file(str(cfg), str(tmp_path / "run"), progress=False)
    record = read_jsonl(tmp_path / "run" / "eval.jsonl")[0]
    gender = record["langs"]["de"]["gender"]
    for key in ("bleu_feminine", "bleu_masculine", "gender_gap_bleu", "accuracy_feminine", "accuracy_masculine"):
        assert key in gender


def test_ddp_two_processes_under_torchrun(write_config, tmp_path):
    cfg = write_config({"training": {"maxSteps": 16}, "checkpoint": {"interval": 8}, "evaluation": {"interval": 8}})
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "rosetta_trainer", "train", "-f", str(cfg), "--output", str(out),
                          "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 16
    # both ranks wrote their RNG state into the one checkpoint
    ckpt = latest_checkpoint(out / "checkpoints")
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    losses = [r["loss"] for r in read_jsonl(out / "metrics.jsonl")]
    assert losses[-1] < losses[0]
    assert torch.isfinite(torch.tensor(losses)).all()
