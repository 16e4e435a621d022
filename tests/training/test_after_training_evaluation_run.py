"""The CNN/DailyMail example's CPU-sized twin, run to the end: a tiny T5 summarization training,
then the evaluation Job's own command (as the operator renders it, paths mapped onto a temporary
directory) on the CPU, and its termination message read back into status.evaluation."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rosetta_contract.spec import parse_training
from rosetta_operator import evaluation_status as es
from rosetta_operator.evaluation_job import render_evaluation_job
from rosetta_operator.names import CONFIG_KEY
from rosetta_operator.render import render
from rosetta_trainer.checkpoints.checkpoint import read_meta
from rosetta_trainer.commands.train import train_from_file

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "t5-cnn-dailymail-cpu-eval.yaml"
MOUNT = "/runs"  # the example's checkpoints volume


def cpu_twin() -> dict:
    """The example with what a laptop can run: a tiny T5 from scratch on generated pairs, one CPU process."""
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    spec = doc["spec"]
    spec.update(gpusPerNode=0, resources={"cpu": 2, "memory": "4Gi", "shmSize": "1Gi"}, scheduling={},
                volumes=[v for v in spec["volumes"] if v["purpose"] == "checkpoints"])
    spec["model"] = {"architecture": "t5", "size": "tiny", "dModel": 32, "encoderLayers": 1, "decoderLayers": 1,
                     "heads": 2, "ffnDim": 64}
    spec["tokenizer"] = {"train": {"type": "unigram", "vocabSize": 300}}
    spec["data"] = {"sourceLang": "en",
                    "train": [{"format": "generated", "size": 300, "seed": 1}],
                    "validation": [{"format": "generated", "size": 12, "seed": 2}],
                    "test": [{"format": "generated", "size": 10, "seed": 3}],
                    "maxSourceLength": 64, "maxTargetLength": 24}
    spec["training"].update(epochs=None, maxSteps=12, batch={"sentences": 16}, gradientAccumulation=1,
                            precision="fp32", device="cpu", logInterval=4, learningRate=3e-3, warmupSteps=2)
    spec["training"] = {k: v for k, v in spec["training"].items() if v is not None}
    spec["checkpoint"] = {"interval": 6, "keep": 2}
    spec["evaluation"].update(interval=6, maxSamples=12, maxNewTokens=16, beams=2)
    spec["metrics"] = {"port": 0}
    return doc


def test_the_twin_trains_then_its_evaluation_job_scores_the_best_checkpoint_on_cpu(tmp_path):
    doc = cpu_twin()
    training = parse_training(doc)
    name = training.metadata.name
    root = tmp_path / "runs"
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(doc))
    summary = train_from_file(str(path), str(root / name), progress=False)
    assert summary["steps"] == 12 and summary["primary_metric"] == "rougeL"

    job = render_evaluation_job(name, "default", training.spec)
    configmap = render(name, "default", training.spec).configmap
    config = tmp_path / CONFIG_KEY
    config.write_text(configmap["data"][CONFIG_KEY])  # what the pod reads at /etc/rosetta
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["python", "-m", "rosetta_trainer", "evaluate"]
    command = [sys.executable, *container["command"][1:]]
    command = [str(config) if arg == f"/etc/rosetta/{CONFIG_KEY}" else
               arg.replace(MOUNT, str(root), 1) if arg.startswith(MOUNT + "/") else arg for arg in command]
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"] if "value" in e},
           "ROSETTA_TERMINATION_LOG": str(tmp_path / "termination-log"), "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]

    scores = json.loads((root / name / "evaluation" / "test.scores.json").read_text())
    assert scores["samples"] == 10 and {"rouge1", "rouge2", "rougeL", "rougeLsum"} <= set(scores)
    best = Path(summary["best_checkpoint"])
    message = (tmp_path / "termination-log").read_text()
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 0, "message": message}}}]}}
    finished = {"metadata": {"name": f"{name}-eval"},
                "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    evaluation, cond = es.observe_evaluation(finished, [pod], {"checkpoint": "best"})
    assert evaluation["phase"] == "Succeeded" and cond.status == "True"
    assert evaluation["checkpointPath"] == best.name and evaluation["step"] == read_meta(best)["step"]
    assert evaluation["rougeL"] == pytest.approx(scores["rougeL"], abs=1e-4) and evaluation["samples"] == 10
