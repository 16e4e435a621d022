"""How every command names a TranslationTraining on its command line: -f FILE and --set PATH=VALUE."""

from __future__ import annotations

import argparse


def add_document_arguments(p: argparse.ArgumentParser, *, required: bool = True,
                           file_help: str = "TranslationTraining YAML") -> None:
    """-f FILE and --set PATH=VALUE (applied by config.apply_overrides), the same for every command."""
    p.add_argument("-f", "--file", required=required, help=file_help)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field, e.g. --set spec.training.maxSteps=100 (repeatable)")
