"""A tiny real training: a from-scratch model built from a config, generated data, CPU."""

import json
from pathlib import Path

from rosetta_trainer.config import deep_merge


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


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
