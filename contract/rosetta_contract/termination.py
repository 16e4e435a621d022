"""The termination message: the one line a pod leaves, as `<Class>: <what happened>`, for the kubelet
to keep after the container exits, the operator to read and the pod's launcher to exit with the
class's code (failures.py). Any command run in a pod leaves it (command_dispatch), whichever side's."""

from __future__ import annotations

import logging

from rosetta_contract.exits import MAX_TERMINATION_MESSAGE, termination_log
from rosetta_contract.failures import parse_termination_message, termination_message

log = logging.getLogger(__name__)


def write_termination_message(failure_class: str, message: str) -> None:
    """Leave `<failure_class>: <message>` (one line, at most the kubelet's 4096 bytes). A class some
    other rank of this pod already left is kept: the first error is the cause, and the ranks that
    fail after it mostly fail because of it."""
    path = termination_log()
    if path is None:
        return
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            if parse_termination_message(f.read(MAX_TERMINATION_MESSAGE)) is not None:
                return
    except OSError:
        pass  # not there yet, or not readable: write it
    data = termination_message(failure_class, message).encode("utf-8")[:MAX_TERMINATION_MESSAGE]
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data.decode("utf-8", errors="ignore"))
    except OSError as exc:  # the error itself still reaches the log and the exit code
        log.warning("cannot write the termination message to %s: %s", path, exc)
