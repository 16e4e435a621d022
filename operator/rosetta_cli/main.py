"""`rosetta` (and `kubectl rosetta`): every command, one exit-code table (rosetta_contract.exits)."""

from __future__ import annotations

import argparse

from rosetta_cli import validate
from rosetta_contract import __version__
from rosetta_operator import cli as operator_cli
from rosetta_trainer import cli as trainer_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rosetta", description="Rosetta: train translation models from one YAML, "
                                     "on a Kubernetes cluster or on this machine.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    trainer_cli.add_commands(sub)
    validate.add_command(sub)
    operator_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return int(trainer_cli.dispatch(build_parser().parse_args(argv)))
