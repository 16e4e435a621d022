"""What a corpus is read into, and what every reader of one shares: the example, the error that names
the file, the checks on a path.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from rosetta_contract.data_fields import DataSource, DataSpec


class DataError(ValueError):
    """A corpus that cannot be read as configured; the message names the file (and line)."""


@dataclass(frozen=True)
class Example:
    source: str
    target: str
    target_lang: str
    # MT-GenEval only: the gender of this reference, the other gender's reference for the same
    # source line, and that line's index, so evaluation can score per gender and pair up both.
    gender: str | None = None
    counterfactual: str | None = None
    pair_id: int | None = None
    # spec.task: picks the T5 prefix ("translate ...: " or "summarize: ").
    task: str = "translation"


def checked_path(name: str) -> Path:
    path = Path(name).expanduser()
    if not path.exists():
        raise DataError(f"{name}: no such file or directory (relative paths are read from {Path.cwd()})")
    return path


def required(value: str | None) -> str:
    """A DataSource field its format needs: DataSource's validator refuses a spec without it."""
    return cast(str, value)


def target_langs(data: DataSpec) -> list[str]:
    # DataSpec's validator fills targetLangs in (the source language when a spec leaves it out).
    return cast("list[str]", data.target_langs)


def file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def single_lang(src: DataSource, data: DataSpec, where: str) -> str:
    if src.target_lang is not None:
        return src.target_lang
    if len(target_langs(data)) == 1:
        return target_langs(data)[0]
    raise DataError(
        f"{where}: cannot tell the target language; set targetLang or langColumn "
        f"(targetLangs has {', '.join(target_langs(data))})"
    )
