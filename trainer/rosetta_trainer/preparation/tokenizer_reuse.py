"""Whether the tokenizer in <output>/tokenizer may serve a new start instead of a new training.

A fresh start with `tokenizer.train` trains its tokenizer from the training text. When
`rosetta prepare` (the stage job of data.prepare: BeforeTraining) ran first, it already trained
one from the same files into the same directory, and prepared the training data with it: training
again would read the whole text once more, on rank 0 of the gang, while the GPUs wait, only to
arrive at the same tokenizer. So the directory records what it was trained from (the tokenizer
settings and the data files' identity, data_identity.py) and a start that would train the same
uses it. Without an identity (a file that could not be looked at) nothing is reused.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from rosetta_contract.model_fields import TokenizerTraining

RECORD = "rosetta-trained-from.json"
FORMAT_VERSION = 1


def trained_from(settings: TokenizerTraining, identity: str | None) -> dict[str, Any] | None:
    """What a tokenizer trained now would be trained from; None when it cannot be named."""
    if identity is None:
        return None
    return {"format": FORMAT_VERSION, "data": identity, "settings": settings.model_dump(mode="json", by_alias=True)}


def reusable(directory: Path, record: dict[str, Any] | None) -> bool:
    if record is None:
        return False
    try:
        return bool(json.loads((directory / RECORD).read_text()) == record)
    except (OSError, ValueError):
        return False


def forget(directory: Path) -> None:
    (directory / RECORD).unlink(missing_ok=True)


def remember(directory: Path, record: dict[str, Any] | None) -> None:
    """Written after the tokenizer's own files, renamed into place: a record names a whole tokenizer."""
    if record is None:
        return
    tmp = directory / f".{RECORD}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    tmp.rename(directory / RECORD)
