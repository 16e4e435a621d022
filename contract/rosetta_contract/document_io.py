"""TranslationTraining documents in and out of YAML: reading a file (strictly), `a.b=value`
overrides, merging, validation into a model with one line per error. Torch-free.

spec.py builds on this module; documents.py, above spec.py, adds the trainer's view of a document.
"""

from __future__ import annotations

import copy
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rosetta_contract import strict_yaml
from rosetta_contract.resource import KIND
from rosetta_contract.strict_model import ConfigError, clip


def format_errors(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """pydantic errors as (dotted field path, message), list indices in brackets."""
    out = []
    for err in exc.errors():
        parts: list[str] = []
        for loc in err["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            else:
                parts.append(str(loc))
        path = ".".join(p for p in parts if p)
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        message = err["msg"].removeprefix("Value error, ")
        out.append((path or "(document)", message))
    return out


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` merged into a copy of `base`: mappings key by key, anything else replaced
    (Helm's values semantics; also how deepspeedConfig goes over the generated config)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(raw: Any, overrides: list[str], source: str | None = None) -> Any:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a raw document (read from `source`)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError([(item, "override must look like 'spec.training.maxSteps=100'")], source)
        node = raw
        parts = key.split(".")
        if not isinstance(node, dict):
            raise ConfigError([("(document)", "expected a YAML mapping with apiVersion, kind and spec")], source)
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([(key, f"'{part}' is not a mapping")], source)
        try:
            node[parts[-1]] = strict_yaml.load(value)
        except strict_yaml.YamlError as exc:
            raise ConfigError([(key, f"the value is not valid YAML: {exc}")], source) from None
    return raw


def validate_document(raw: Any, source: str | None, model: type[BaseModel],
                      ignored_spec_keys: AbstractSet[str | None] = frozenset()) -> Any:
    """Validate a raw document into `model`, the spec's keys in `ignored_spec_keys` left out."""
    if not isinstance(raw, dict):
        raise ConfigError([("(document)", "expected a YAML mapping with apiVersion, kind and spec")], source)
    if ignored_spec_keys and isinstance(raw.get("spec"), dict):
        raw = {**raw, "spec": {k: v for k, v in raw["spec"].items() if k not in ignored_spec_keys}}
    try:
        return model.model_validate(raw, by_name=False)  # camelCase only, as in the CRD
    except ValidationError as exc:
        raise ConfigError(format_errors(exc), source) from None


def read_yaml(path: str | Path) -> Any:
    """The TranslationTraining of a YAML file: its only document, or, in a file that `kubectl apply`
    takes as a whole (e.g. a PersistentVolumeClaim, then the training), the one of kind
    TranslationTraining; documents of other kinds are ignored.

    Read with strict_yaml: at most 1 MiB of UTF-8, no duplicate keys, bounded aliases and nesting.
    Every failure is a ConfigError with one line naming where ("(yaml): line 3, column 1: ...")."""
    path = Path(path)
    try:
        docs = [d for d in strict_yaml.load_all(strict_yaml.read_text(path)) if d is not None]
    except FileNotFoundError:
        raise ConfigError([("(file)", f"{path} does not exist")], str(path)) from None
    except strict_yaml.YamlError as exc:
        raise ConfigError([("(yaml)", str(exc))], str(path)) from None
    return pick_training(docs, str(path))


def pick_training(docs: list[Any], source: str | None = None) -> Any:
    """The TranslationTraining among the documents of one file (see read_yaml)."""
    if len(docs) == 1:
        return docs[0]  # validation says what is wrong with it, kind included
    trainings = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(trainings) != 1:
        kinds = ", ".join(clip(d.get("kind") or "no kind", 60) if isinstance(d, dict) else "not a mapping"
                          for d in docs[:20]) + (", …" if len(docs) > 20 else "")
        raise ConfigError([("(file)", f"expected one {KIND} document, found {len(trainings)} among "
                                      f"{len(docs)} documents ({kinds or 'none'})")], source)
    return trainings[0]
