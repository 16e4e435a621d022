"""A training's document as a run keeps it: written once from the parsed model (the ConfigMap,
every checkpoint's training.yaml) and read back with the pod's own parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import BaseModel

from rosetta_contract.config import TrainingDocument
from rosetta_contract.document_io import read_yaml, validate_document
from rosetta_contract.resource import API_VERSION, KIND
from rosetta_contract.spec import CLUSTER_FIELDS, TranslationTraining, parse_for_trainer
from rosetta_contract.strict_model import ConfigError


def load_saved(path: str | Path) -> TranslationTraining | TrainingDocument:
    """A document a run saved (a checkpoint's training.yaml), read with parse_for_trainer. Earlier
    versions saved the raw document they started with, judged by their own cluster rules: where
    today's refuse one, its trainer's fields are read alone, as those versions read them."""
    raw = read_yaml(path)
    try:
        return parse_for_trainer(raw, str(path))
    except ConfigError:
        return cast(TrainingDocument, validate_document(raw, str(path), TrainingDocument, CLUSTER_FIELDS))


def _drop_unset_nones(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """Drop `key: null` where null is the field's default; a null that overrides a
    default (clipGradNorm: null disables clipping) must stay."""
    out: dict[str, Any] = {}
    for field_name, field in type(model).model_fields.items():
        key = field.alias or field_name
        value = getattr(model, field_name)
        if value is None and field.default is None:
            continue
        if isinstance(value, BaseModel):
            out[key] = _drop_unset_nones(value, dumped[key])
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            out[key] = [_drop_unset_nones(v, d) for v, d in zip(value, dumped[key])]
        else:
            out[key] = dumped[key]
    return out


# libyaml when present: the pure-Python emitter made the ConfigMap's YAML most of a reconcile's CPU time.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_training(training: TranslationTraining) -> str:
    """The YAML of a parsed document that parse_for_trainer reads back into an equal model: the
    whole resolved spec, defaults included, so that what runs (the ConfigMap) and what a checkpoint
    records do not depend on a later release's defaults."""
    spec = training.spec
    resolved = _drop_unset_nones(spec, spec.model_dump(mode="json", by_alias=True))
    if spec.mode == "evaluate" and "training" not in spec.model_fields_set:
        del resolved["training"]  # placeholders, not a training the trainer would accept
    metadata = training.metadata.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": resolved}
    return str(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
