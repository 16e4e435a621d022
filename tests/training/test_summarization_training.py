"""A real summarization training on CPU: ROUGE in every output, the best checkpoint by ROUGE-L."""

import json
import os
import subprocess
import sys

import pytest

from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints, read_meta
from rosetta_trainer.commands.train import train_from_file
from support.training import read_jsonl

pytestmark = pytest.mark.slow

SUMMARIZATION = {
    "task": "summarization",
    "model": {"architecture": "t5"},
    "data": {
        "targetLangs": ["en"],
        "train": [{"format": "generated", "size": 400, "seed": 1}],
        "validation": [{"format": "generated", "size": 16, "seed": 2}],
        "test": [{"format": "generated", "size": 8, "seed": 3}],
        "maxSourceLength": 96, "maxTargetLength": 32,
    },
    "training": {"maxSteps": 30},
    "checkpoint": {"interval": 10, "keep": 1},
    "evaluation": {"interval": 10, "maxSamples": 16, "maxNewTokens": 24},
}


def test_summarization_run_scores_rouge_and_keeps_the_best_rouge_l(write_config, tmp_path, capsys):
    out = tmp_path / "run"
    summary = train_from_file(str(write_config(SUMMARIZATION)), str(out), progress=False)

    evals = [e for e in read_jsonl(out / "eval.jsonl") if e["split"] == "validation"]
    assert [e["step"] for e in evals] == [10, 20, 30]
    for e in evals:
        assert all(0 <= e[m] <= 100 for m in ("rouge1", "rouge2", "rougeL")), e
        assert "bleu" not in e and "rouge-score" in e["rouge_signature"]

    saved = json.loads((out / "summary.json").read_text())
    assert saved["primary_metric"] == "rougeL"
    assert saved["test"]["samples"] == 8 and {"rouge1", "rouge2", "rougeL"} <= set(saved["test"])
    # The first of the highest ROUGE-L wins (a later checkpoint must be strictly better).
    best = max(evals, key=lambda e: (e["rougeL"], -e["step"]))
    assert saved["best_bleu"] == summary["best_bleu"] == best["rougeL"]
    assert saved["best_step"] == best["step"]
    assert saved["final_score"] == saved["final_bleu"] == evals[-1]["rougeL"]
    kept = [p.name for p in complete_checkpoints(out / "checkpoints")]
    assert kept == sorted({f"step-{best['step']:08d}", "step-00000030"})
    best_dir = out / "checkpoints" / f"step-{best['step']:08d}"
    assert saved["best_checkpoint"] == str(best_dir)
    meta = read_meta(best_dir)
    assert (meta["metric"], meta["score"]) == ("rougeL", best["rougeL"])
    assert json.loads((out / "checkpoints" / "best.json").read_text())["step"] == best["step"]
    assert "validation ROUGE-L:" in capsys.readouterr().out

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, "-m", "rosetta_trainer", "evaluate", "--checkpoint", str(best_dir),
                          "--beams", "1", "--output", str(tmp_path / "eval")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    scores = json.loads((tmp_path / "eval" / "test.scores.json").read_text())
    assert scores["samples"] == 8 and all(0 <= scores[m] <= 100 for m in ("rouge1", "rouge2", "rougeL"))
    assert len((tmp_path / "eval" / "test.hyp.txt").read_text().splitlines()) == 8
