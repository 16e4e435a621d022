"""`rosetta run` with evaluation.afterTraining: after the pods succeeded, the evaluation Job's
command runs here too, on the CPU, and its scores land in run.json."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from support.training import SHARED_CHECKPOINTS, TINY, deep_update

pytestmark = pytest.mark.slow


def test_the_evaluation_runs_after_the_training_on_the_shared_volume(tmp_path):
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {
        "volumes": SHARED_CHECKPOINTS,
        "training": {"maxSteps": 12}, "checkpoint": {"interval": 6, "keep": 2},
        "data": {"test": [{"format": "generated", "size": 10, "seed": 3}]},
        "evaluation": {"interval": 6, "atEnd": False, "afterTraining": {"checkpoint": "best", "cpu": 1, "memory": "2Gi"}},
    }})))
    volume = tmp_path / "shared-volume"
    res = subprocess.run([sys.executable, "-m", "rosetta_cli", "run", "--no-progress", "-f", str(path),
                          "--output", str(tmp_path / "run"), "--volume", f"runs={volume}"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]

    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["phase"] == "Succeeded"
    evaluation = run["evaluation"]
    assert evaluation["phase"] == "Succeeded" and evaluation["jobName"] == "tiny-eval"
    assert evaluation["samples"] == 10 and "bleu" in evaluation and evaluation["checkpointPath"].startswith("step-")
    scores = json.loads((volume / "tiny" / "evaluation" / "test.scores.json").read_text())
    assert scores["bleu"] == pytest.approx(evaluation["bleu"], abs=1e-4)
    assert (tmp_path / "run" / "logs" / "tiny-eval.log").stat().st_size > 0
