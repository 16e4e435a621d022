"""Exit codes: how a trainer pod tells the operator why it stopped (with the termination message),
and which error ends a `rosetta` command with which status."""

import sys

# sysexits.h EX_DATAERR: "the input data was incorrect in some way". The JobSet's pod failure policy
# turns it into a failed training without restarts (render.py).
DATA_INVALID_EXIT = 65
# The operator matches this prefix in a pod's termination message (status.py).
TERMINATION_PREFIX = "DataInvalid: "
TERMINATION_LOG_ENV = "ROSETTA_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
MAX_TERMINATION_MESSAGE = 4096

# A document, a policy or a place the run cannot use: fix the input and run again.
CONFIG_EXIT = 2
# spec.training.nanPolicy: stop ended the run (a fault of the numbers, not of the input).
NON_FINITE_EXIT = 3
# sysexits.h EX_TEMPFAIL, "try again later": a collective waited spec.faultTolerance.collectiveTimeoutSeconds
# for a rank that never came. Nothing is wrong with the input; the next attempt resumes from the last
# checkpoint. Under torchrun the pod itself exits 1 (torchrun's own status) and its log names this code.
COLLECTIVE_TIMEOUT_EXIT = 75

# Which error ends a `rosetta` command (and a trainer pod) with which status: one table for every
# entry point. Classes are named, not imported, so that this package imports neither side; an error
# whose module was never imported cannot have been raised, so looking in sys.modules is enough.
# tests/unit/test_exit_codes.py checks that every row names a real exception class.
ERROR_EXITS: tuple[tuple[str, str, int], ...] = (
    ("rosetta_contract.strict_model", "ConfigError", CONFIG_EXIT),  # PolicyViolation too
    ("rosetta_operator.policy", "PolicyError", CONFIG_EXIT),  # an admin policy file that cannot be used
    ("rosetta_trainer.data", "DataError", DATA_INVALID_EXIT),
    ("rosetta_trainer.checkpoint", "SharedStorageError", CONFIG_EXIT),  # where the job runs
    ("rosetta_trainer.checkpoint", "UnsafeCheckpointError", CONFIG_EXIT),  # a checkpoint that would run code
    ("rosetta_trainer.averaging", "AveragingError", CONFIG_EXIT),  # what the checkpoints are
    ("rosetta_trainer.export", "ExportError", CONFIG_EXIT),
    ("rosetta_trainer.loop", "NonFiniteError", NON_FINITE_EXIT),
    ("rosetta_trainer.distributed", "CollectiveTimeout", COLLECTIVE_TIMEOUT_EXIT),
)


def exit_status(exc: BaseException) -> int | None:
    """The status `exc` ends a command with, or None: a bug, whose traceback is shown."""
    for module, name, status in ERROR_EXITS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return status
    return None
