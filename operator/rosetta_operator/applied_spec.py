"""The spec a JobSet was built from, kept on it: the baseline that a training's later edits are
measured against (only spec.suspend may change; any other change is refused, not applied).

Kept on the child in an annotation, not in kopf's diffbase, so that reverting a refused change is
recognised, and so that it survives operator restarts and kopf's own bookkeeping.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping, Optional

from rosetta_contract.spec import TranslationTrainingSpec, parse_spec, plain
from rosetta_contract.strict_model import ConfigError

# What the JobSet was built from, minus spec.suspend.
APPLIED_SPEC = "rosetta.dev/applied-spec"
# Changes that never need a new JobSet. Everything else would mean recreating a running gang.
MUTABLE_FIELDS = frozenset({"suspend"})


def with_default_image(spec: Mapping[str, Any], image: Optional[str]) -> dict[str, Any]:
    """The spec, with the operator's default trainer image where it names none. Rendered, not
    written back: the training keeps what its author wrote, and a new default reaches only JobSets
    created after it."""
    spec = dict(spec)
    if image and not spec.get("image"):
        spec["image"] = image
    return spec


def without_mutable(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in plain(spec).items() if k not in MUTABLE_FIELDS}


def applied_spec_of(jobset: Mapping[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    raw = (jobset["metadata"].get("annotations") or {}).get(APPLIED_SPEC)
    try:
        return json.loads(raw) if raw else default
    except ValueError:
        return default


def parsed_spec(spec: Mapping[str, Any]) -> Optional[TranslationTrainingSpec]:
    """The spec a JobSet was built from (it was valid then); None if it no longer parses. Parsed once
    per distinct spec, not once per event of its JobSet: the model is shared, to be read, not changed."""
    try:
        key = json.dumps(plain(spec), sort_keys=True, separators=(",", ":"))
    except (ConfigError, TypeError, ValueError):
        return None
    return _parsed(key)


@functools.lru_cache(maxsize=256)
def _parsed(key: str) -> Optional[TranslationTrainingSpec]:
    try:
        return parse_spec(json.loads(key), allow_host_path=True)
    except ConfigError:
        return None
