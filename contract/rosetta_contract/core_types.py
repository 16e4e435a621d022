"""Free-form Kubernetes objects in a spec (a pod's affinity) checked against the core/v1 types.

The CRD keeps `affinity` schemaless, so the apiserver stores any JSON there, and the JobSet (or the
pod) refuses it later, on every retry; an unknown field is worse: dropped without a word. Each
type's fields and their types, as the kubernetes client's generated models give them, are enough to
say which key is wrong, and where, before anything is created. The client itself is not imported:
the trainer's image, which checks the spec too, does not install it. core_types.json holds the
table, written from the client by rosetta_operator/core_types_table.py (`make generate`).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

# The types whose fields the spec carries free-form; the table holds these and every type they reach.
ROOTS = ("V1Affinity",)

_LIST = re.compile(r"^[Ll]ist\[(.+)\]$")
_DICT = re.compile(r"^[Dd]ict\((?:str|String), ?(.+)\)$|^[Dd]ict\[str, ?(.+)\]$")
_SCALARS: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "bool": bool, "float": (int, float)}
_SHOWN = {"str": "a string", "int": "an integer", "bool": "true or false", "float": "a number"}


def problems(value: Any, model: str) -> list[str]:
    """Every place where `value` is not a `model` (e.g. "V1Affinity"), as "path: what is wrong"."""
    out: list[str] = []
    _check(value, model, "", out)
    return out


def _check(value: Any, type_name: str, path: str, out: list[str]) -> None:
    here = path or "(top)"
    if type_name == "object":
        return
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            out.append(f"{here}: expected a list, not {_kind(value)}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{path}[{i}]", out)
        return
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            out.append(f"{here}: expected a mapping, not {_kind(value)}")
            return
        for key, item in value.items():
            _check(item, m.group(1) or m.group(2), f"{path}.{key}" if path else str(key), out)
        return
    if type_name in _SCALARS:
        if isinstance(value, bool) != (type_name == "bool") or not isinstance(value, _SCALARS[type_name]):
            out.append(f"{here}: expected {_SHOWN[type_name]}, not {_kind(value)}")
        return
    fields = _types().get(type_name)
    if fields is None:  # a type the table does not hold: leave it to the apiserver
        return
    if not isinstance(value, dict):
        out.append(f"{here}: expected an object ({type_name[2:]}), not {_kind(value)}")
        return
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            known = ", ".join(sorted(fields))
            out.append(f"{where}: {type_name[2:]} has no field '{key}' (it has: {known})")
        else:
            _check(item, fields[key], where, out)


@functools.cache
def _types() -> dict[str, dict[str, str]]:
    """{type: {JSON field name: type}} from core_types.json."""
    text = resources.files(__package__).joinpath("core_types.json").read_text(encoding="utf-8")
    loaded: dict[str, dict[str, str]] = json.loads(text)
    return loaded


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__)
