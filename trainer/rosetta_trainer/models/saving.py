"""Hugging Face's save_pretrained, without importing DeepSpeed to write a model that is not in it.

save_pretrained unwraps the model through accelerate's extract_model_from_parallel, which imports
DeepSpeed whenever it is installed (it is, in the trainer image) to check whether the model is a
DeepSpeedEngine: about 2 s and 100+ MB at the first checkpoint of every DDP or one-process run. A
process that has not imported DeepSpeed holds no DeepSpeedEngine, so skipping that check then
changes nothing about what is written.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def save_pretrained(model: PreTrainedModel, directory: Path, **kwargs: Any) -> None:
    with _no_deepspeed_probe():
        model.save_pretrained(directory, **kwargs)


@contextlib.contextmanager
def _no_deepspeed_probe() -> Iterator[None]:
    try:
        from accelerate.utils import other
    except ImportError:  # transformers then unwraps without accelerate, and imports nothing for it
        yield
        return
    probe = getattr(other, "is_deepspeed_available", None)
    if probe is None or "deepspeed" in sys.modules:
        yield
        return
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe
