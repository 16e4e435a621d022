"""A small OpenAPI v3 (CRD flavour) validator and CEL runner for unit tests.

The apiserver in the integration tests is too old to enforce CEL, and jsonschema is
not a dependency; this covers what CRD schemas use: types, nullable, enums, bounds,
patterns, required, int-or-string, list-map keys, unknown fields (which the
apiserver would silently prune, so they count as errors here) and defaults.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import celpy
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envtest"))
from control_plane import jobset_crd  # noqa: E402  (the pinned release's CRD, never copied here)

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def schema_errors(schema: dict, value: Any, path: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Everything the apiserver's schema validation (or pruning) would object to."""
    if path in skip:
        return []
    where = path or "(root)"
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null is not allowed"]
    if schema.get("x-kubernetes-int-or-string"):
        if not (_TYPES["integer"](value) or _TYPES["string"](value)):
            return [f"{where}: expected an integer or a string, got {value!r}"]
    elif "anyOf" in schema:
        if all(schema_errors(option, value, path) for option in schema["anyOf"]):
            return [f"{where}: matches none of {schema['anyOf']}"]
    kind = schema.get("type")
    if kind and not _TYPES[kind](value):
        return [f"{where}: expected {kind}, got {type(value).__name__} {value!r}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 62):
            errors.append(f"{where}: length {len(value)} is out of bounds")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if _TYPES["number"](value) and not isinstance(value, str):
        if "minimum" in schema and (value < schema["minimum"] or
                                    (schema.get("exclusiveMinimum") and value == schema["minimum"])):
            errors.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and (value > schema["maximum"] or
                                    (schema.get("exclusiveMaximum") and value == schema["maximum"])):
            errors.append(f"{where}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 62):
            errors.append(f"{where}: {len(value)} items is out of bounds")
        for i, item in enumerate(value):
            errors += schema_errors(schema.get("items", {}), item, f"{path}[{i}]", skip)
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                errors.append(f"{where}: duplicate {keys} in a list-type map")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}: '{key}' is required")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in props:
                errors += schema_errors(props[key], item, sub, skip)
            elif isinstance(extra, dict):
                errors += schema_errors(extra, item, sub, skip)
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{sub}: unknown field (the apiserver would prune it)")
    return errors


def with_defaults(schema: dict, value: Any) -> Any:
    """`value` with the schema's defaults filled in, as the apiserver does before validating."""
    if isinstance(value, dict):
        out = dict(value)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = sub["default"]
            if key in out:
                out[key] = with_defaults(sub, out[key])
        return out
    if isinstance(value, list):
        return [with_defaults(schema.get("items", {}), item) for item in value]
    return value


@lru_cache(maxsize=None)
def _program(rule: str):
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_holds(rule: str, value: Any) -> bool:
    """Evaluate one rule with `self` bound to `value`; a rule that errors is a broken rule."""
    result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    if not isinstance(result, celpy.celtypes.BoolType):
        raise AssertionError(f"CEL rule did not evaluate to a bool ({result!r}): {rule}")
    return bool(result)


def cel_failures(schema: dict, value: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(path, rule, message) for every x-kubernetes-validations rule `value` breaks.

    Transition rules (oldSelf) only run on updates and are skipped.
    """
    out = []
    if value is None:
        return out
    for check in schema.get("x-kubernetes-validations", []):
        if "oldSelf" not in check["rule"] and not cel_holds(check["rule"], value):
            out.append((path or "(root)", check["rule"], check.get("message", "")))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                out += cel_failures(sub, item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += cel_failures(schema.get("items", {}), item, f"{path}[{i}]")
    return out


@lru_cache(maxsize=1)
def jobset_schema() -> dict:
    # 800 kB of YAML: the C loader reads it in a tenth of the time.
    crd = yaml.load(jobset_crd().read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return version["schema"]["openAPIV3Schema"]


def assert_valid_jobset(jobset: dict) -> None:
    """The JobSet v0.12.0 CRD's schema and its (non-transition) CEL rules accept `jobset`."""
    schema = jobset_schema()
    # the apiserver validates ObjectMeta itself; the CRD schema only says "object"
    assert schema_errors(schema, jobset, skip=("metadata",)) == []
    assert cel_failures(schema, with_defaults(schema, jobset)) == []
