"""Checkpoint averaging: one model whose weights are the mean of the last (or best) N checkpoints.

The published Transformer results (and fairseq's scripts/average_checkpoints.py, which this
follows) average the last checkpoints of a run: usually a BLEU point or so over the final one,
for free. Floating-point parameters are summed in fp32 and divided by N, then cast back to
their dtype; buffers and integer tensors are taken from the newest checkpoint (a running
statistic or a step counter has no meaningful mean).

The result is a directory `rosetta evaluate --checkpoint`, `rosetta translate` and
`rosetta export` load like a checkpoint (no optimizer state: it is not resumed from):

    averaged/
        model/          save_pretrained() weights and config (the newest checkpoint's config)
        tokenizer/      the newest checkpoint's
        training.yaml   the newest checkpoint's
        meta.json       which checkpoints, how they were chosen, their steps and scores

DeepSpeed ZeRO checkpoints hold partitioned weights: each is gathered into a whole fp32 model
first (DeepSpeed's zero_to_fp32, as `rosetta evaluate` does), one at a time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from rosetta_trainer.checkpoints.checkpoint import checkpoint_score, complete_checkpoints, read_meta
from rosetta_trainer.checkpoints.deepspeed_checkpoints import consolidated_model, is_deepspeed_checkpoint
from rosetta_trainer.models.models import load_pretrained
from rosetta_trainer.models.saving import save_pretrained
from rosetta_trainer.models.tokenization import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

AVERAGED_DIR = "averaged"  # under the checkpoint directory, for checkpoint.average


class AveragingError(ValueError):
    """The checkpoints cannot be averaged (too few, or not of one model); one line."""


def select(root: Path, *, last: int | None = None, best: int | None = None) -> list[Path]:
    """The complete checkpoints under `root` to average, oldest first.

    `best` ranks by the validation score in each checkpoint's meta.json (the primary metric:
    BLEU, or ROUGE-L for summarization); checkpoints saved without an evaluation have none.
    """
    if (last is None) == (best is None):
        raise ValueError("select: pass exactly one of last or best")
    n = cast(int, last if last is not None else best)  # exactly one, checked above
    found = complete_checkpoints(Path(root))
    if not found:
        raise AveragingError(f"{root} holds no complete checkpoint (step-NNNNNNNN directories with a COMPLETE marker)")
    if last is not None:
        if len(found) < n:
            raise AveragingError(f"last {n}: {root} holds only {len(found)} complete checkpoint(s) "
                                 f"({', '.join(p.name for p in found)}); checkpoint.keep decides how many stay")
        return found[-n:]
    candidates = [(checkpoint_score(read_meta(p)), p) for p in found]
    scored = [(score, p) for score, p in candidates if score is not None]
    if len(scored) < n:
        raise AveragingError(f"best {n}: only {len(scored)} of the {len(found)} complete checkpoints in {root} "
                             "have a validation score (checkpoints saved without an evaluation have none)")
    # Highest score first; ties go to the earlier step, as for the best checkpoint.
    chosen = sorted(scored, key=lambda item: (-item[0], item[1].name))[:n]
    return sorted(p for _, p in chosen)


def load_weights(checkpoint: Path) -> PreTrainedModel:
    """The whole model of a checkpoint (or of an exported/averaged model directory), on the CPU."""
    checkpoint = Path(checkpoint)
    if is_deepspeed_checkpoint(checkpoint):
        return consolidated_model(checkpoint)
    model_dir = checkpoint / "model" if (checkpoint / "model").is_dir() else checkpoint
    if not (model_dir / "config.json").is_file():
        raise AveragingError(f"{checkpoint} holds no model (no config.json in {model_dir})")
    return load_pretrained(str(model_dir))


def average_models(checkpoints: list[Path]) -> PreTrainedModel:
    """The newest checkpoint's model with its parameters replaced by the mean over `checkpoints`
    (oldest first). Loads one model at a time: memory is two models and an fp32 sum."""
    if not checkpoints:
        raise AveragingError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    model: PreTrainedModel | None = None
    for i, path in enumerate(checkpoints):
        model = load_weights(path)
        # Buffers and frozen parameters (sinusoidal position tables) are not averaged: constants
        # or statistics, they come from the newest checkpoint.
        fixed = {name for name, _ in model.named_buffers()}
        fixed |= {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        state = model.state_dict()
        if i == 0:
            first, shapes = path, {k: tuple(v.shape) for k, v in state.items()}
        else:
            _check_same_model(first, shapes, path, state)
        for key, value in state.items():
            if key in fixed or not value.is_floating_point():
                continue  # the newest's, below
            value = value.detach().to(torch.promote_types(value.dtype, torch.float32))
            if key in sums:
                sums[key] += value
            else:
                sums[key] = value.clone()
        if i < len(checkpoints) - 1:
            del model, state
    n = len(checkpoints)
    model = cast("PreTrainedModel", model)  # the loop ran: checkpoints is not empty
    newest = model.state_dict()
    averaged = {key: (sums[key] / n).to(newest[key].dtype) if key in sums else newest[key] for key in newest}
    model.load_state_dict(averaged)
    return model


def _check_same_model(first: Path, shapes: dict[str, tuple[int, ...]], path: Path,
                      state: dict[str, torch.Tensor]) -> None:
    if set(state) != set(shapes):
        extra, missing = sorted(set(state) - set(shapes)), sorted(set(shapes) - set(state))
        names = ", ".join(extra[:3] or missing[:3])
        raise AveragingError(f"{path.name} and {first.name} are not the same model: {path.name} "
                             f"{'has' if extra else 'lacks'} weights {names}")
    for key, value in state.items():
        if tuple(value.shape) != shapes[key]:
            raise AveragingError(f"{path.name} and {first.name} are not the same model: {key} has shape "
                                 f"{tuple(value.shape)} in {path.name} and {shapes[key]} in {first.name}")


def average_checkpoints(checkpoints: list[Path], out: Path, selection: str = "explicit") -> Path:
    """Average `checkpoints` (oldest first) into `out`, atomically: a hidden temporary directory
    renamed into place, so `out` is either the previous result or the whole new one."""
    out = Path(out)
    model = average_models(checkpoints)
    newest = checkpoints[-1]
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pretrained(model, tmp / "model", safe_serialization=True)
    tokenizer = newest / "tokenizer" if (newest / "tokenizer").is_dir() else None
    if tokenizer is not None:
        shutil.copytree(tokenizer, tmp / "tokenizer")
    else:  # an exported or averaged model directory keeps the tokenizer beside the weights
        load_tokenizer(str(newest / "model" if (newest / "model").is_dir() else newest)).save_pretrained(
            tmp / "tokenizer")
    if (newest / "training.yaml").is_file():
        shutil.copy2(newest / "training.yaml", tmp / "training.yaml")
    metas = [read_meta(p) if (p / "meta.json").is_file() else {} for p in checkpoints]
    (tmp / "meta.json").write_text(json.dumps({
        "averaged": [p.name for p in checkpoints],
        "selection": selection,
        "steps": [m.get("step") for m in metas],
        "scores": [checkpoint_score(m) for m in metas],
        "metric": next((m["metric"] for m in metas if m.get("metric")), None),
        "step": metas[-1].get("step"),
    }, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


