"""A tiny real training: a from-scratch model built from a config, generated data, CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rosetta_contract.documents import deep_merge

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"

TINY = {
    "apiVersion": "rosetta.dev/v1alpha1",
    "kind": "TranslationTraining",
    "metadata": {"name": "tiny"},
    "spec": {
        "model": {"architecture": "transformer", "size": "tiny", "dModel": 32, "encoderLayers": 1,
                  "decoderLayers": 1, "heads": 2, "ffnDim": 64},
        "tokenizer": {"train": {"type": "unigram", "vocabSize": 300}},
        "data": {
            "sourceLang": "en", "targetLangs": ["de"],
            "train": [{"format": "generated", "size": 800, "seed": 1}],
            "validation": [{"format": "generated", "size": 24, "seed": 2}],
            "maxSourceLength": 48, "maxTargetLength": 48,
        },
        "training": {"maxSteps": 20, "batch": {"sentences": 16}, "learningRate": 3e-3, "schedule": "noam",
                     "warmupSteps": 5, "seed": 7, "logInterval": 1},
        "checkpoint": {"interval": 10, "keep": 5},
        "evaluation": {"interval": 10, "beams": 1, "maxSamples": 24, "maxNewTokens": 24},
        "metrics": {"port": 0, "tensorboard": True},
    },
}


deep_update = deep_merge  # the name the tests patch TINY with

# What a training on more than one node needs: its checkpoints on a volume every pod shares (on a
# cluster a ReadWriteMany PVC; `rosetta run` makes it one directory, <output>/volumes/runs/).
SHARED_CHECKPOINTS = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints",
                       "persistentVolumeClaim": {"claimName": "runs"}}]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def torchrun_training(config: dict, out: Path, nproc: int | None, *extra: str, env: dict | None = None) -> dict:
    """`rosetta train` of `config` (written next to `out`) under torchrun with `nproc` workers,
    one thread each (None: the trainer alone, a world of one without a launcher or process group);
    returns the run's summary."""
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    res = subprocess.run([sys.executable, *launcher, "-m", "rosetta_trainer", "train", "-f", str(path),
                          "--output", str(out), "--no-progress", *extra], capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def logged_losses(out: Path) -> dict[int, float]:
    """step -> loss, from a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl")}
