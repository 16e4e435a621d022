"""Running a parsed command of `rosetta` or `python -m rosetta_trainer`: an expected error becomes
one line on stderr and its exit status (exits.py), never a traceback.

Each side adds its commands to the one parser (rosetta_cli); a command that must also say why it
stopped where someone else reads it (the trainer's, in a pod: the termination message the operator
and the launcher read) sets `report_failure` among its parser's defaults."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from rosetta_contract.exits import error_message, exit_status
from rosetta_contract.failures import EXIT_CLASSES

ReportFailure = Callable[[str, str], None]  # (the failure class, the message)


def dispatch(args: argparse.Namespace, report_failure: Optional[ReportFailure] = None) -> int:
    """Run args.func; an error with a known exit status is printed as one line and returned, with
    its failure class reported where the command (or the caller, as a default) asks for it."""
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        message = error_message(exc, status)
        print(f"error: {message}", file=sys.stderr)
        failure_class = EXIT_CLASSES.get(status)
        report = getattr(args, "report_failure", None) or report_failure
        if failure_class is not None and report is not None:
            report(failure_class, message)
        return status
