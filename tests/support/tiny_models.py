"""Tiny seq2seq models from configs (no download) and checkpoint directories laid out as the trainer writes them."""

import json
from pathlib import Path

import torch
import yaml

from rosetta_contract.model_fields import ModelSpec, TokenizerTraining
from rosetta_trainer.checkpoints.checkpoint import MARKER, step_dir_name
from rosetta_trainer.data import corpus
from rosetta_trainer.models.models import build_model
from rosetta_trainer.models.tokenization import train_tokenizer
from support.training import TINY

PAIRS = corpus.generate_pairs("de", 300, seed=1)
SOURCES = [source for source, _ in PAIRS[:10]]


def tiny_tokenizer(directory: Path):
    return train_tokenizer(TokenizerTraining.model_validate({"type": "unigram", "vocabSize": 300}), PAIRS, directory)


def tiny_model(tokenizer, architecture: str = "transformer", seed: int = 0, scale: float | None = 0.3, **dims):
    """A from-scratch model. `scale`: redraw every trainable matrix (embeddings, the pad row
    included) from N(0, scale^2), so that outputs depend on the input the way a trained model's
    do, instead of the near-constant output of a fresh initialisation; None keeps the init."""
    fields = {"architecture": architecture, "size": "tiny", "dModel": 32, "encoderLayers": 1, "decoderLayers": 1,
              "heads": 2, "ffnDim": 64, "dropout": 0.0, **dims}
    torch.manual_seed(seed)
    model = build_model(ModelSpec.model_validate(fields), vocab_size=len(tokenizer), max_length=64)
    if scale is not None:
        redraw(model, seed, scale)
    return model.eval()


@torch.no_grad()
def redraw(model, seed: int, scale: float = 0.3) -> None:
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():  # tied matrices appear once
        if param.requires_grad and param.dim() == 2:
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def save_checkpoint(root: Path, step: int, model, tokenizer, bleu: float | None = None,
                    document: dict | None = None) -> Path:
    """A complete checkpoint as CheckpointManager writes one (model/, tokenizer/, training.yaml,
    meta.json, COMPLETE), without optimizer state."""
    path = Path(root) / step_dir_name(step)
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "tokenizer")
    (path / "training.yaml").write_text(yaml.safe_dump(document or TINY))
    (path / "meta.json").write_text(json.dumps({"step": step, "epoch": 0, "bleu": bleu, "metric": "bleu",
                                                "world_size": 1}))
    (path / MARKER).write_text("")
    return path
