"""The hostile corpus: TranslationTraining documents that must be refused, and edge cases that must pass.

    corpus/bad/<theme>/<case>.yaml    one defect each; refused by `rosetta validate` and by the cluster
    corpus/valid/<case>.yaml          unusual but valid; accepted by both
    generated.py                      documents written at test time: not UTF-8, over 1 MiB, thousands of
                                      levels deep, hundreds of KiB (nothing a reader wants in a diff)

Every file starts with comment lines that say what it tests (a file kubectl can still apply as is):

    # expect: spec.resources.cpu          what the refusal must name: a field path, or for a document
                                          that is not read, where ("line 9") or what ("duplicate key 'kind'")
    # why: a negative CPU request         what is wrong with it, for the reader
    # exit: 65                            `rosetta validate`'s exit status when it is not 2 (65: a data file)
    # cluster: skip (reason)              not applied in the cluster tier, and why
    # cluster-expect: line 9              what kubectl or the apiserver names instead, when it words it otherwise
    # valid: why it is worth accepting    (valid documents only)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

CORPUS = Path(__file__).resolve().parent / "corpus"
HEADER_KEYS = ("expect", "why", "exit", "cluster", "cluster-expect", "valid")
CONFIG_ERROR_EXIT = 2  # rosetta_contract.exits: a ConfigError
# A refusal is read by a person: a few lines, not a page (a message quotes at most 1000 characters of a value).
MAX_LINES = 12
MAX_CHARS = 6000
# Anything but newlines: an ESC in a message is a terminal escape sequence the document chose.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Case:
    id: str                      # bad/<theme>/<case> or valid/<case>
    why: str
    expect: str = ""             # bad documents: what the refusal must name
    exit: int = CONFIG_ERROR_EXIT
    cluster_skip: str = ""       # why the cluster tier does not apply it ("" = it does)
    cluster_expect: str = ""     # what kubectl or the apiserver must name, when not `expect`
    file: Optional[Path] = None  # a committed document ...
    make: Optional[Callable[[], bytes]] = None  # ... or one written at test time

    @property
    def valid(self) -> bool:
        return self.id.startswith("valid/")

    @property
    def theme(self) -> str:
        return "valid" if self.valid else self.id.split("/")[1]

    def content(self) -> bytes:
        return self.file.read_bytes() if self.file else self.make()

    def materialize(self, folder: Path) -> Path:
        """The document as a file: its own, or one written into `folder`."""
        if self.file is not None:
            return self.file
        path = folder / (self.id.replace("/", "--") + ".yaml")
        path.write_bytes(self.make())
        return path


def headers(content: bytes) -> dict[str, str]:
    """The `# key: value` lines a document starts with (a comment of the document itself ends them)."""
    found = {}
    for line in content.split(b"\n"):
        key, sep, value = line.decode(errors="replace").removeprefix("# ").partition(": ")
        if not line.startswith(b"# ") or not sep or key not in HEADER_KEYS:
            break
        found[key] = value.strip()
    return found


def case_from_file(path: Path) -> Case:
    head = headers(path.read_bytes())
    skip = head.get("cluster", "")
    if skip and not (skip.startswith("skip (") and skip.endswith(")")):
        raise ValueError(f"{path}: write '# cluster: skip (reason)'")
    return Case(id=path.relative_to(CORPUS).with_suffix("").as_posix(), why=head.get("valid") or head.get("why", ""),
                expect=head.get("expect", ""), exit=int(head.get("exit", CONFIG_ERROR_EXIT)),
                cluster_skip=skip[len("skip ("):-1] if skip else "", cluster_expect=head.get("cluster-expect", ""),
                file=path)


def committed() -> list[Case]:
    return [case_from_file(p) for p in sorted(CORPUS.rglob("*.yaml"))]


def all_cases() -> list[Case]:
    from hostile.generated import GENERATED

    return sorted(committed() + GENERATED, key=lambda c: c.id)


def names_field(message: str, field: str) -> bool:
    """Whether `message` names `field`: the whole path, or a path the error is reported on followed by
    the rest of it in the message (`spec.data: targetLangs must not contain ...` names
    spec.data.targetLangs; `spec: tokenizer.train needs data.train` names spec.data.train)."""
    if field in message:
        return True
    parts = field.split(".")
    return any(f"{'.'.join(parts[:i])}: " in message and ".".join(parts[i:]) in message for i in range(1, len(parts)))


def refusal_problems(message: str, field: str) -> list[str]:
    """What is wrong with `message` as the refusal of a document that must name `field`."""
    problems = []
    if "Traceback" in message:
        problems.append("a traceback")
    if not names_field(message, field):
        problems.append(f"it does not name {field!r}")
    lines = message.rstrip("\n").split("\n")
    if len(lines) > MAX_LINES or len(message) > MAX_CHARS:
        problems.append(f"{len(lines)} lines, {len(message)} characters (at most {MAX_LINES} and {MAX_CHARS})")
    control = CONTROL.search(message)
    if control:
        problems.append(f"a control character ({ord(control.group()):#x}) from the document")
    return problems
