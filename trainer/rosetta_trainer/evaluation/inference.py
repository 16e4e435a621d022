"""A saved model loaded for inference: a checkpoint (DDP or DeepSpeed), an averaged or exported model
directory, a CTranslate2 export, or the spec's pretrained model; and the checkpoint `--pick` names."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_contract.saved_training import load_saved
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.checkpoints.averaging import AVERAGED_DIR
from rosetta_trainer.checkpoints.checkpoint import best_by_score, checkpoint_score, complete_checkpoints, read_meta
from rosetta_trainer.checkpoints.deepspeed_checkpoints import consolidated_model, is_deepspeed_checkpoint
from rosetta_trainer.evaluation.ctranslate2_models import is_ctranslate2_dir, load_ctranslate2
from rosetta_trainer.models.models import load_pretrained
from rosetta_trainer.models.tokenization import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# The model: a Hugging Face model, or a CTranslate2Model that translate() drives alike.
def load_checkpoint_for_inference(path: str | Path,
                                  device: torch.device) -> tuple[Any, PreTrainedTokenizerBase, TrainerSpec | None]:
    """(model, tokenizer, spec) from a checkpoint, averaged or exported model directory; a CTranslate2
    export gives an export.CTranslate2Model, which translate() drives the same way."""
    path = Path(path)
    if is_ctranslate2_dir(path):
        return load_ctranslate2(path, "auto" if device.type == "cuda" else "cpu", device.index or 0)
    model_dir = path / "model" if (path / "model").is_dir() else path
    tok_dir = path / "tokenizer" if (path / "tokenizer").is_dir() else model_dir
    if not (model_dir / "config.json").is_file():
        raise ConfigError([("--checkpoint", f"{path} holds no model (no config.json in {model_dir})")])
    spec: TrainerSpec | None = None
    if (path / "training.yaml").is_file():
        spec = load_saved(path / "training.yaml").spec
    if is_deepspeed_checkpoint(path):  # ZeRO shards: gather them (an export does this once, ahead)
        model = consolidated_model(path).to(device)  # type: ignore[arg-type]  # as below
    else:
        # transformers types PreTrainedModel.to through a decorator that loses its signature.
        model = load_pretrained(str(model_dir)).to(device)  # type: ignore[arg-type]
    return model, load_tokenizer(str(tok_dir)), spec


def load_pretrained_for_inference(spec: TrainerSpec,
                                  device: torch.device) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of spec.model.name: a hub id, or a directory saved with save_pretrained."""
    if spec.model.name is None:
        raise ConfigError([("spec.model.name", "evaluating without --checkpoint needs a pretrained model.name")])
    model = load_pretrained(spec.model.name).to(device)  # type: ignore[arg-type]  # as above
    return model, load_tokenizer(spec.tokenizer.path or spec.model.name)


def pick_checkpoint(root: str | Path, pick: str) -> Path:
    """The checkpoint of a checkpoint directory that `rosetta evaluate --pick` names: the newest
    complete one (final), the best by validation score (best; the newest when none was scored),
    or the averaged model (checkpoint.average)."""
    root = Path(root)
    if pick == "averaged":
        if not (root / AVERAGED_DIR).is_dir():
            raise ConfigError([("--pick", f"averaged: {root / AVERAGED_DIR} does not exist "
                                          "(is checkpoint.average set?)")])
        return root / AVERAGED_DIR
    found = complete_checkpoints(root)
    if not found:
        raise ConfigError([("--checkpoint", f"{root} holds no complete checkpoint (step-* with its marker)")])
    if pick == "best":
        best = best_by_score((checkpoint_score(read_meta(p)), p.name, p) for p in found)
        if best is not None:
            return best
        print(f"no checkpoint in {root} has a validation score: evaluating the newest", file=sys.stderr)
    return found[-1]
