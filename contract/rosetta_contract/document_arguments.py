"""How every command names a TranslationTraining on its command line: -f FILE and --set PATH=VALUE.

`-f -` reads the document from standard input, as `kubectl apply -f -` does
(`envsubst < training.yaml | rosetta submit -f -`).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

STDIN = "-"
_stdin_copy: list[str] = []  # standard input can be read once; every later `-f -` gets the same copy


def document_path(text: str) -> str:
    """-f's value: the path as given, or for `-` a file holding what standard input held.

    A file rather than the text: every reader of a TranslationTraining (validate, render, submit,
    run, train) takes a path, some read it twice (the training, then every document), and the
    local runner hands it to its pods."""
    if text != STDIN:
        return text
    if not _stdin_copy:
        from rosetta_contract.strict_yaml import MAX_BYTES

        if sys.stdin is None:
            raise argparse.ArgumentTypeError("-f -: there is no standard input to read")
        folder = tempfile.mkdtemp(prefix="rosetta-stdin-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = Path(folder) / "stdin.yaml"
        # One byte over the limit is enough for the reader to refuse it with its own message.
        path.write_bytes(sys.stdin.buffer.read(MAX_BYTES + 1))
        _stdin_copy.append(str(path))
    return _stdin_copy[0]


def add_document_arguments(p: argparse.ArgumentParser, *, required: bool = True,
                           file_help: str = "TranslationTraining YAML") -> None:
    """-f FILE and --set PATH=VALUE (applied by config.apply_overrides), the same for every command."""
    p.add_argument("-f", "--file", required=required, type=document_path, metavar="FILE",
                   help=f"{file_help} ('-': read it from standard input)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field, e.g. --set spec.training.maxSteps=100 (repeatable)")
