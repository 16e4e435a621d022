"""DeepSpeed's checkpoints: its sharded format inside our atomic step directories. `export_hf` gathers
them into a Hugging Face model with DeepSpeed's zero_to_fp32 utilities. Every file DeepSpeed reads
back from a checkpoint goes through checkpoint.load_state_file (weights_only), as ours do: see
weights_only_loads.
"""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.serialization import MAP_LOCATION
from torch.types import FileLike

from rosetta_trainer.checkpoints.checkpoint import load_state_file
from rosetta_trainer.models.models import freeze_fixed_positions, untie_output_for
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# DeepSpeed's sub-directory inside a step-NNNNNNNN checkpoint, and its config file.
TAG = "deepspeed"
CONFIG_FILE = "deepspeed_config.json"


def checkpoint_classes() -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """What DeepSpeed pickles into its checkpoints besides tensors and plain types (found by loading
    real ZeRO-1, 2 and 3 checkpoints, with and without offload, with weights_only=True), and why
    each may be unpickled: all are plain data. Unpickling one sets attributes (or, the enum, looks a
    member up by value) and runs none of its own code: none defines __setstate__, __reduce__ or
    __new__. Never add a callable that does work (functools.partial, builtins.eval, a function)."""
    import_deepspeed()
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [
        LossScaler,  # the ZeRO optimizer's loss scale: a number (1.0 unless fp16 with a static scale)
        DynamicLossScaler,  # fp16's: the scale, its window and counters (numbers, a dtype)
        ZeroStageEnum,  # the stage the optimizer shards were cut for (an int enum)
        fragment_address,  # where a parameter lies in its flat partition: a dataclass of two ints
        # Some Pythons pickle an enum member by name, as getattr(EnumClass, "name"): the name getattr
        # is answered by a lookup that only returns members of the enums above, never getattr itself.
        (_enum_member, "builtins.getattr"),
        (_enum_member, "__builtin__.getattr"),
    ]


# `cls`: whatever the pickle names (Any, so that comparing it leaves ZeroStageEnum as it is).
def _enum_member(cls: Any, name: str) -> object:
    import_deepspeed()  # loaded by checkpoint_classes already: a dictionary lookup
    from deepspeed.runtime.zero.config import ZeroStageEnum

    if cls is not ZeroStageEnum or not isinstance(name, str) or name not in ZeroStageEnum.__members__:
        raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not an enum member a checkpoint holds")
    return ZeroStageEnum[name]


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Inside the block, every torch.load is checkpoint.load_state_file with checkpoint_classes
    allowed, whatever weights_only its caller asks for: a planted pickle is refused with
    UnsafeCheckpointError instead of run.

    DeepSpeed reads checkpoints with torch.load(..., weights_only=False): the engine through its
    checkpoint engine, zero_to_fp32 (export, evaluation, averaging) and the universal-checkpoint
    loader directly, so no narrower hook covers every file. The switch lasts for the block and is
    process-wide; it can only make a load stricter, and the trainer's other threads load nothing.
    """
    allowed = checkpoint_classes()

    def load(f: FileLike, map_location: MAP_LOCATION = None, pickle_module: Any = None, *,
             weights_only: bool | None = None, **load_args: Any) -> Any:
        return load_state_file(f, map_location, allowed=allowed, pickle_module=pickle_module, **load_args)

    original = torch.load
    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def is_deepspeed_checkpoint(path: Path) -> bool:
    return (Path(path) / TAG).is_dir()


def consolidated_model(checkpoint: Path) -> PreTrainedModel:
    """The whole model of a DeepSpeed checkpoint, gathered from its ZeRO shards with
    DeepSpeed's zero_to_fp32 (fp32 master weights; no process group needed)."""
    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, GenerationConfig

    checkpoint = Path(checkpoint)
    with weights_only_loads():
        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint), tag=TAG)
    config = AutoConfig.from_pretrained(checkpoint / "model")
    model: PreTrainedModel = AutoModelForSeq2SeqLM.from_config(config)
    untie_output_for(model, state)  # flan-T5/mT5: a separate lm_head must not collapse into the embedding
    missing, unexpected = model.load_state_dict(state, strict=False)
    model.tie_weights(recompute_mapping=False)  # recomputing would re-tie an untied lm_head
    if unexpected:
        raise ValueError(f"{checkpoint}: the DeepSpeed checkpoint has weights the model lacks: {unexpected[:5]}")
    # Tied parameters (shared embeddings, the output projection) are stored once.
    shared = {p.data_ptr() for name, p in model.named_parameters() if name in state}
    untied = [n for n in missing if n not in dict(model.named_buffers())
              and model.get_parameter(n).data_ptr() not in shared]
    if untied:
        raise ValueError(f"{checkpoint}: the DeepSpeed checkpoint lacks weights: {untied[:5]}")
    if (checkpoint / "model" / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(checkpoint / "model")
    freeze_fixed_positions(model)
    return model


def export_hf(checkpoint: Path, out: Path) -> Path:
    """Write a DeepSpeed checkpoint as a Hugging Face model directory (model + tokenizer + YAML),
    atomically: `rosetta evaluate`/`translate` and from_pretrained load it."""
    import os
    import shutil

    checkpoint, out = Path(checkpoint), Path(out)
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    consolidated_model(checkpoint).save_pretrained(tmp, safe_serialization=True)
    if (checkpoint / "tokenizer").is_dir():
        shutil.copytree(checkpoint / "tokenizer", tmp, dirs_exist_ok=True)
    for name in ("training.yaml", "meta.json", CONFIG_FILE):
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
