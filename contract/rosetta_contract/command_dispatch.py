"""Running a parsed command of `rosetta` or `python -m rosetta_trainer`: an expected error becomes
one line on stderr and its exit status (exits.py), never a traceback; in a pod, its failure class
also becomes the termination message (termination.py) that the operator and the launcher read,
whichever side's command it was (`rosetta validate` checks data in pods too)."""

from __future__ import annotations

import argparse
import sys

from rosetta_contract.exits import error_message, exit_status
from rosetta_contract.failures import EXIT_CLASSES
from rosetta_contract.termination import write_termination_message


def dispatch(args: argparse.Namespace) -> int:
    """Run args.func; an error with a known exit status is printed as one line and returned."""
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        message = error_message(exc, status)
        print(f"error: {message}", file=sys.stderr)
        failure_class = EXIT_CLASSES.get(status)
        if failure_class is not None:
            write_termination_message(failure_class, message)
        return status
