"""The one YAML reader for TranslationTraining files and documents: strict and bounded.

Every entry point that turns YAML text into data goes through here (`rosetta validate/render/run/
train/plan/evaluate -f`, `--set` values, the ConfigMap `rosetta run` rewrites for its pods, a
checkpoint's saved training.yaml).
PyYAML's safe loader alone accepts what a spec must not:

    size         a file over MAX_BYTES (1 MiB) is refused before it is parsed; reading stops there
                 (so `-f /dev/zero` ends too)
    encoding     bytes that are not UTF-8: the line and the byte's offset in the file
    duplicates   a mapping key given twice (PyYAML silently keeps the last), also in two spellings
                 YAML 1.1 reads alike (`on` and `yes` are both true): the key and both lines
    aliases      aliases may add at most MAX_ALIAS_NODES nodes in all ("billion laughs": nine nested
                 anchors expand to 10^9 nodes from a few hundred bytes), and may not point into the
                 collection that holds them (a recursive structure)
    depth        collections nested deeper than MAX_DEPTH (thousands of `[` would otherwise end in
                 a RecursionError)

The checks run on the parser's event stream, which PyYAML produces without recursion at any depth,
before a node is composed; only a document that passes is built (libyaml when available). Every
error is a `YamlError` whose message is one line: where (line, column), then what.

Torch-free: the operator imports it.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

MAX_BYTES = 1 << 20
MAX_DEPTH = 100
MAX_ALIAS_NODES = 10_000



# libyaml when present: parsing twice stays cheap.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SAFE_LOADER):  # type: ignore[misc]  # PyYAML ships no types: its classes are Any
    """The safe loader, with exponent-only floats (`1e-3`) read as numbers as kubectl reads them
    (YAML 1.1 says string; YAML 1.2 and JSON say number)."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))
# Python refuses to convert integers of more digits (sys.int_info.str_digits_check_threshold).
MAX_INT_DIGITS = 4300
_PLAIN_INT = re.compile(r"^[-+]?[0-9_]+$")
# YAML types with no JSON counterpart, which kubectl would turn into strings and the apiserver never sees.
NOT_JSON_TAGS = {"tag:yaml.org,2002:binary": "binary", "tag:yaml.org,2002:set": "set",
                 "tag:yaml.org,2002:omap": "ordered map", "tag:yaml.org,2002:pairs": "pairs",
                 "tag:yaml.org,2002:python/object": "Python object"}


class YamlError(ValueError):
    """A document that is not read: one line, starting with where ("line 3, column 5: ...")."""


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(somewhere)"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: yaml.YAMLError, text: str) -> str:
    """PyYAML's multi-line message (with a snippet of the text) as `line L, column C: problem`."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem == "second occurrence" and exc.context_mark:
        return f"{_at(exc.problem_mark)}: duplicate anchor (first at line {exc.context_mark.line + 1})"
    if isinstance(exc, yaml.MarkedYAMLError) and (exc.problem or "").startswith("exceeded maximum nesting depth"):
        # libyaml >= 0.2.6 (PyYAML >= 6.0.4) stops at its own limit (1,000) while scanning ahead, before
        # check() sees the 101st level; the document breaks the same rule, so it gets the same message.
        return f"{_at(exc.problem_mark)}: nested more than {MAX_DEPTH} levels deep"
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = _one_line(exc.problem or exc.context or "invalid YAML")
        where = exc.problem_mark or exc.context_mark
        text = f"{_at(where)}: {problem}"
        if exc.context and exc.problem and exc.context_mark is not None:
            text += f" ({_one_line(exc.context)} at line {exc.context_mark.line + 1})"
        return text
    if isinstance(exc, yaml.reader.ReaderError):  # an unprintable character: where, and its code point only
        position = min(max(exc.position, 0), len(text))
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        return f"line {line}, column {column}: {_one_line(exc.reason)} (code point {exc.character:#x})"
    return _one_line(str(exc))


def read_text(path: str | Path, what: str = "file") -> str:
    """A YAML file's text: at most MAX_BYTES, UTF-8 (a leading BOM is dropped). YamlError otherwise;
    FileNotFoundError is left to the caller, which knows what a missing file means there."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except OSError as exc:
        raise YamlError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_BYTES:
        raise YamlError(f"{what} is larger than {MAX_BYTES // (1 << 20)} MiB ({MAX_BYTES} bytes), "
                        "the limit for a TranslationTraining")
    return decode(data)


def decode(data: bytes) -> str:
    """UTF-8 text, or a YamlError naming the line and byte offset of the first bad byte."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlError(f"line {line}, column {column}: not UTF-8 text ({exc.reason} at byte {exc.start} "
                        "of the file)") from None


def check(text: str) -> None:
    """Walk the event stream: duplicate keys, alias expansion, recursive aliases and depth."""
    parser = _Loader(text)
    # Per open collection: [anchor, expanded size, keys seen (mappings) or None, children so far].
    stack: list[list[Any]] = []
    sizes: dict[str, int] = {}   # anchor -> nodes its alias stands for
    added = 0                    # nodes that aliases added, over the whole stream

    def child(event: Any) -> None:
        """Count a node starting in the open collection; a mapping's even children are its keys."""
        if not stack:
            return
        parent = stack[-1]
        parent[3] += 1
        keys = parent[2]
        if keys is None or parent[3] % 2 == 0 or not isinstance(event, ScalarEvent) or event.value == "<<":
            return
        key = _key_identity(parser, event)
        first, spelled = keys.setdefault(key, (event.start_mark, event.value))
        if first is not event.start_mark:
            same = "" if spelled == event.value else \
                f" as {_shown(spelled)}; YAML 1.1 reads both as {key[1]}, so one would silently replace the other"
            raise YamlError(f"{_at(event.start_mark)}: duplicate key {_shown(event.value)} "
                            f"(first at line {first.line + 1}{same})")

    def done(anchor: str | None, size: int) -> None:
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size

    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, DocumentStartEvent):
                sizes = {}  # anchors are per document
            elif isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                _json_tag(event)
                child(event)
                if len(stack) >= MAX_DEPTH:
                    raise YamlError(f"{_at(event.start_mark)}: nested more than {MAX_DEPTH} levels deep")
                stack.append([event.anchor, 1, {} if isinstance(event, MappingStartEvent) else None, 0])
            elif isinstance(event, (SequenceEndEvent, MappingEndEvent)):
                anchor, size, _, _ = stack.pop()
                done(anchor, size)
            elif isinstance(event, ScalarEvent):
                _json_tag(event)
                if not event.style and len(event.value) > MAX_INT_DIGITS and _PLAIN_INT.match(event.value):
                    raise YamlError(f"{_at(event.start_mark)}: a number of {len(event.value)} digits; "
                                    f"at most {MAX_INT_DIGITS} can be read")
                child(event)
                done(event.anchor, 1)
            elif isinstance(event, AliasEvent):
                child(event)
                if any(entry[0] == event.anchor for entry in stack):
                    raise YamlError(f"{_at(event.start_mark)}: alias *{_shown(event.anchor, quote=False)} "
                                    "refers to a collection that contains it (a recursive structure)")
                size = sizes.get(event.anchor, 1)  # undefined: the loader names it
                added += size
                if added > MAX_ALIAS_NODES:
                    raise YamlError(f"{_at(event.start_mark)}: aliases expand to more than {MAX_ALIAS_NODES} "
                                    "nodes (nested aliases, a \"billion laughs\"?); write the values out")
                done(None, size)
    except yaml.YAMLError as exc:
        raise YamlError(_describe(exc, text)) from None
    finally:
        parser.dispose()


_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"


def _key_identity(parser: Any, event: Any) -> tuple[str, str]:
    """What a mapping key becomes once loaded: plain `on`, `yes` and `true` are one key (true), as
    are `~` and `null`. Keys compared by their text alone would let them replace each other."""
    if event.implicit[0] and event.tag is None:  # a plain scalar: its tag comes from its text
        tag = parser.resolve(yaml.ScalarNode, event.value, (True, False))
        if tag == _BOOL_TAG:
            return ("bool", "true" if event.value.lower() in ("yes", "true", "on", "y") else "false")
        if tag == _NULL_TAG:
            return ("null", "null")
    return ("text", event.value)


def _json_tag(event: Any) -> None:
    kind = NOT_JSON_TAGS.get(getattr(event, "tag", None) or "")
    if kind:
        raise YamlError(f"{_at(event.start_mark)}: a YAML {kind} (!!{event.tag.rsplit(':', 1)[-1]}) has no JSON "
                        "equivalent; write a string or a list")


def _shown(value: str, quote: bool = True, limit: int = 80) -> str:
    text = value if len(value) <= limit else value[:limit] + "…"
    return repr(text) if quote else text


def load_all(text: str) -> list[Any]:
    """Every document of a stream (empty ones included as None), checked first."""
    check(text)
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        raise YamlError(_describe(exc, text)) from None
    except RecursionError:  # not reached after check(); kept so a traceback can never escape
        raise YamlError(f"nested more than {MAX_DEPTH} levels deep") from None


def load(text: str) -> Any:
    """A single document (None when empty); YamlError for a stream of several."""
    docs = load_all(text)
    if len(docs) > 1:
        raise YamlError(f"expected one YAML document, found {len(docs)}")
    return docs[0] if docs else None


__all__ = ["MAX_ALIAS_NODES", "MAX_BYTES", "MAX_DEPTH", "YamlError", "check", "decode", "load", "load_all",
           "read_text"]
