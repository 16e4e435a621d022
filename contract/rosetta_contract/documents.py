"""The trainer's view of a TranslationTraining document: the keys the cluster's spec adds left
out, everything else validated (TrainingDocument by default), one line per error. Torch-free.

Reading the file, overrides and merging are document_io.py's, re-exported here for the callers
that read a document through this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rosetta_contract.config import TrainingDocument
from rosetta_contract.document_io import (
    apply_overrides,
    deep_merge,
    format_errors,
    pick_training,
    read_yaml,
    validate_document,
)
from rosetta_contract.spec import CLUSTER_FIELDS


def parse_document(raw: Any, source: str | None = None, model: type[BaseModel] = TrainingDocument) -> Any:
    """Validate a raw document. With the default model, cluster-only spec keys are ignored."""
    # The trainer ignores exactly the fields the cluster's spec adds to TrainerSpec, so a typo
    # anywhere else is still an error.
    return validate_document(raw, source, model, CLUSTER_FIELDS if model is TrainingDocument else frozenset())


def load_document(path: str | Path, overrides: list[str] | None = None,
                  model: type[BaseModel] = TrainingDocument) -> Any:
    """Read, override and validate a TranslationTraining file; ConfigError lists every problem."""
    raw = apply_overrides(read_yaml(path), overrides or [], str(path))
    return parse_document(raw, str(path), model)


__all__ = ["apply_overrides", "deep_merge", "format_errors", "load_document", "parse_document", "pick_training",
           "read_yaml"]
