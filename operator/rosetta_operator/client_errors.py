"""The errors of the Python client (client.py), each a `VerbError` carrying the exit status the
command line gives it: `TrainingNotFound`, `WaitTimeout`, `TrainingEnded`, `ClusterError` (1) and
`InvalidArgument` (2). A script catches `RosettaError` for all of them.
"""

from __future__ import annotations

from rosetta_operator.kube import INVALID, VerbError

RosettaError = VerbError


class TrainingNotFound(VerbError):
    """No training of that name in the client's namespace."""


class WaitTimeout(VerbError):
    """`wait` ran out of time."""


class TrainingEnded(VerbError):
    """The training finished in a phase other than the one waited for (`phase` says which)."""

    def __init__(self, message: str, phase: str):
        super().__init__(message)
        self.phase = phase


class InvalidArgument(VerbError):
    """An argument no cluster could satisfy (a phase that does not exist, a bad selector)."""

    def __init__(self, message: str):
        super().__init__(message, INVALID)


class ClusterError(VerbError):
    """What the apiserver said (forbidden, a conflict, the CRD missing) or that it could not be reached."""
