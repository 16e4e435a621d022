"""What every model of the TranslationTraining schema shares: a base that types values as the
apiserver does, the error a bad document raises, and the limits and checks of free-form fields.

pydantic's lax mode reads `nodes: true` as 1 and `nodes: "4"` as 4; the CRD refuses both. `Model`
refuses them too, so one file gets one verdict on a laptop and on the cluster. Torch-free.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel


class ConfigError(ValueError):
    """An invalid document. `errors` lists (field path, message) for every problem.

    One problem is one line (`invalid TranslationTraining in f.yaml: spec.task: ...`; a document
    that could not be read names the line: `... in f.yaml: line 3, column 1: duplicate key 'spec'`);
    several are listed under a header. A message is cut at MAX_MESSAGE characters, so a value
    quoted from a megabyte-long field does not come back whole."""

    MAX_MESSAGE = 1000

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None):
        self.errors = [(clip(path, 200), clip(message, self.MAX_MESSAGE)) for path, message in errors]
        self.source = source
        where = f" in {source}" if source else ""
        if len(self.errors) == 1:
            path, message = self.errors[0]
            # "(file)", "(yaml)": the document was not read; its message says where.
            text = message if path in ("(file)", "(yaml)") else f"{path}: {message}"
            super().__init__(f"invalid TranslationTraining{where}: {text}")
            return
        lines = [f"invalid TranslationTraining{where} ({len(self.errors)} error{'s' * (len(self.errors) != 1)}):"]
        lines += [f"  {path}: {message}" for path, message in self.errors]
        super().__init__("\n".join(lines))


def clip(text: str, limit: int) -> str:
    # Control characters (an ESC sequence in a spec value) are shown escaped, never sent to a terminal.
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], " ".join(str(text).splitlines()))
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# Longest path or model id a spec may name (Linux's PATH_MAX), and longest column/split/region
# name: a megabyte-long "path" is a field error, not a megabyte in every message and pod config.
PATH_MAX = 4096
NAME_MAX = 253


def json_object(value: dict[str, Any]) -> dict[str, Any]:
    """Free-form fields that are copied into JSON (deepspeedConfig, a pod's affinity) hold only what
    JSON can: YAML reads `2024-01-01` as a date, `!!binary` as bytes, `!!set` as a set, `.nan` as
    NaN, none of which json.dumps (or the apiserver) takes. The error names the key inside."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                shown = clip(key, 60)
                if not isinstance(key, str):
                    raise ValueError(f"{where or '(top)'}: key {shown} is a {_yaml_kind(key)}, not a string; quote it")
                stack.append((sub, f"{where}.{shown}" if where else shown))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where}: {item} is not a JSON number")
        elif item is not None and not isinstance(item, (str, int, float)):
            raise ValueError(f"{where}: a YAML {_yaml_kind(item)} ({clip(item, 40)}) is not a JSON value; "
                             "quote it to pass it as a string")
    return value


def _yaml_kind(value: Any) -> str:
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, datetime.date):
        return "date"
    return {bytes: "binary", set: "set", bool: "boolean", int: "number", float: "number",
            tuple: "sequence"}.get(type(value), type(value).__name__)


JsonObject = Annotated[dict[str, Any], AfterValidator(json_object)]


def matches(pattern: str, expected: str) -> AfterValidator:
    """A validator that refuses a string not matching `pattern` with "'value' is not <expected>":
    pydantic's own message would print the regex."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.match(value):
            raise ValueError(f"'{value}' is not {expected}")
        return value
    return AfterValidator(check)


class IntOrString:
    """Marks a string field that also takes a whole number, as Kubernetes' int-or-string does
    (resource quantities): `cpu: 8` is fine, `cpu: 0.5` is not (the apiserver refuses it)."""


INT64 = (1 << 63) - 1


def _scalar_kinds(annotation: Any) -> set[str]:
    """The JSON scalar kinds a field's type takes: bool, int, float, str; "any" for free-form
    types (Any, mappings, models), which have their own checks."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return set()
    if origin is Annotated:
        kinds = _scalar_kinds(args[0])
        return kinds | {"int"} if any(isinstance(m, IntOrString) for m in args[1:]) else kinds
    if origin is Literal:
        return {type(a).__name__ for a in args}
    if origin in (list, tuple, set, frozenset):
        return {"list"}
    if args:  # Union / Optional
        return set().union(*(_scalar_kinds(a) for a in args))
    if annotation in (bool, int, str):
        return {annotation.__name__}
    if annotation is float:
        return {"float", "int"}
    return {"any"}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str"}.get(type(value), "other")


_SHOWN = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
          "list": "a list", "other": "a value of another type"}


def _type_problem(value: Any, annotation: Any, int_or_string: bool = False) -> str | None:
    """Why a scalar is not what the field takes, as the apiserver would judge it (pydantic's lax
    mode reads `nodes: true` as 1, `nodes: "4"` as 4 and `suspend: 1` as true; the CRD does not)."""
    kind = _json_kind(value)
    if kind == "int" and abs(value) > INT64:
        return "an integer this large does not fit in 64 bits"
    kinds = _scalar_kinds(annotation) | ({"int"} if int_or_string else set())
    if kind == "float" and value.is_integer() and "int" in kinds:
        return None  # 1e3 is 1000 to the apiserver too (a whole JSON number is an integer)
    if kind == "other" or "any" in kinds or kind in kinds or not kinds & set(_SHOWN):
        return None
    expected = " or ".join(_SHOWN[k] for k in ("bool", "int", "float", "str", "list") if k in kinds
                           and not (k == "int" and "float" in kinds))
    if kind == "float" and "str" in kinds and "int" in kinds:
        return f"expected a whole number or a string, not {value!r}; quote it (e.g. '{value}') or use milli-units"
    shown = str(value).lower() if kind == "bool" else _SHOWN[kind] + (f" ({clip(repr(value), 40)})" if kind == "str" else "")
    return f"expected {expected}, not {shown}"


class Model(BaseModel):
    # No NaN or infinity: `epochs: .inf` or `weightDecay: .nan` would pass every bound check.
    # populate_by_name lets Python code say max_steps=...; documents are read by alias only
    # (parse_document's by_name=False), so `max_steps:` in YAML is an unknown field as on the cluster.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=False, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _json_types(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None  # a field validator is always called for one field
        field = cls.model_fields[info.field_name]
        annotation = field.annotation  # pydantic keeps a field's own Annotated[...] markers in .metadata
        problem = _type_problem(value, annotation, any(isinstance(m, IntOrString) for m in field.metadata))
        if problem is None and isinstance(value, (list, tuple)):
            items = [a for a in get_args(_unwrap(annotation)) if a is not Ellipsis]
            if items and get_origin(_unwrap(annotation)) in (list, tuple):
                for i, item in enumerate(value):
                    item_problem = _type_problem(item, items[min(i, len(items) - 1)])
                    if item_problem:
                        # "name[i]: ..." is moved into the field path (spec._errors)
                        problem = f"{field.alias or info.field_name}[{i}]: {item_problem}"
                        break
        if problem:
            raise ValueError(problem)
        return value


def _unwrap(annotation: Any) -> Any:
    """Optional[X] and Annotated[X, ...] -> X."""
    while True:
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is Annotated:
            annotation = args[0]
        elif args and type(None) in args and len(args) == 2:
            annotation = next(a for a in args if a is not type(None))
        else:
            return annotation
