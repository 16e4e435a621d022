"""Exit codes: how a trainer pod tells the operator why it stopped (with the termination message),
and which error ends a `rosetta` command with which status."""

import os
import sys
from typing import Mapping

# sysexits.h EX_DATAERR: "the input data was incorrect in some way". The JobSet's pod failure policy
# turns it into a failed training without restarts (stage_job.py, failure_policies.py).
DATA_INVALID_EXIT = 65
# The operator matches this prefix in a pod's termination message (status.py).
TERMINATION_PREFIX = "DataInvalid: "
TERMINATION_LOG_ENV = "ROSETTA_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
MAX_TERMINATION_MESSAGE = 4096


def termination_log(environ: Mapping[str, str] | None = None) -> str | None:
    """Where a pod's termination message goes, or None: only in a pod (the kubelet creates the file)
    or where $ROSETTA_TERMINATION_LOG names one, so that a laptop run never creates /dev/termination-log."""
    env = os.environ if environ is None else environ
    path = env.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG
    if TERMINATION_LOG_ENV not in env and not os.path.exists(path):
        return None
    return path

# A document, a policy or a place the run cannot use: fix the input and run again.
CONFIG_EXIT = 2
# spec.training.nanPolicy: stop ended the run (a fault of the numbers, not of the input).
NON_FINITE_EXIT = 3
# sysexits.h EX_TEMPFAIL, "try again later": a collective waited spec.faultTolerance.collectiveTimeoutSeconds
# for a rank that never came. Nothing is wrong with the input; the next attempt resumes from the last
# checkpoint. Under torchrun the pod itself exits 1 (torchrun's own status) and its log names this code.
COLLECTIVE_TIMEOUT_EXIT = 75
# torch.OutOfMemoryError on a GPU: the batch, the model or the ZeRO stage does not fit. Outside the
# sysexits range (64-78) so that no other tool's meaning is borrowed. (failures.py names the class.)
CUDA_OUT_OF_MEMORY_EXIT = 80
# The pre-flight check (spec.faultTolerance.preflight) found the pod's node unfit: no usable GPU, or a
# collective below the bandwidth floor. The operator keeps the next attempts off that node.
NODE_UNHEALTHY_EXIT = 81
# The kernel killed a process of the container at its memory limit (the cgroup's oom_kill count grew)
# while the pod's launcher lived on: it exits with this, so the pod failure policy can act on it.
OOM_KILLED_EXIT = 82

# Which error ends a `rosetta` command (and a trainer pod) with which status: one table for every
# entry point. Classes are named, not imported, so that this package imports neither side; an error
# whose module was never imported cannot have been raised, so looking in sys.modules is enough.
# tests/unit/contract/test_exit_codes.py checks that every row names a real exception class.
ERROR_EXITS: tuple[tuple[str, str, int], ...] = (
    ("rosetta_contract.strict_model", "ConfigError", CONFIG_EXIT),  # PolicyViolation too
    ("rosetta_operator.policy", "PolicyError", CONFIG_EXIT),  # an admin policy file that cannot be used
    ("rosetta_trainer.data.examples", "DataError", DATA_INVALID_EXIT),
    ("rosetta_trainer.checkpoints.checkpoint", "SharedStorageError", CONFIG_EXIT),  # where the job runs
    ("rosetta_trainer.checkpoints.checkpoint", "UnsafeCheckpointError", CONFIG_EXIT),  # a checkpoint that would run code
    ("rosetta_trainer.checkpoints.averaging", "AveragingError", CONFIG_EXIT),  # what the checkpoints are
    ("rosetta_trainer.evaluation.ctranslate2_models", "ExportError", CONFIG_EXIT),
    ("rosetta_trainer.engine.loop", "NonFiniteError", NON_FINITE_EXIT),
    ("rosetta_trainer.runtime.distributed", "CollectiveTimeout", COLLECTIVE_TIMEOUT_EXIT),
    ("rosetta_trainer.runtime.preflight", "NodeUnhealthy", NODE_UNHEALTHY_EXIT),
    ("torch", "OutOfMemoryError", CUDA_OUT_OF_MEMORY_EXIT),  # torch.cuda.OutOfMemoryError is the same class
)

# What to change, for the errors whose own words do not say it. Said before those words, which the
# 4096 bytes of a termination message may cut.
EXIT_ADVICE: dict[int, str] = {
    CUDA_OUT_OF_MEMORY_EXIT: (
        "out of GPU memory: lower spec.training.batch.tokens (or batch.sentences) and raise "
        "training.gradientAccumulation to keep the effective batch, set training.activationCheckpointing: true, "
        "or shard with distributed.backend: deepspeed and a higher distributed.zeroStage (offload.optimizer: cpu "
        "moves the optimizer state off the GPU); `rosetta plan -f FILE` estimates the memory per GPU"),
}


def exit_status(exc: BaseException) -> int | None:
    """The status `exc` ends a command with, or None: a bug, whose traceback is shown."""
    for module, name, status in ERROR_EXITS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return status
    return None


def error_message(exc: BaseException, status: int) -> str:
    """What `rosetta` prints, and a pod's termination message says, for an error `exit_status` named."""
    advice = EXIT_ADVICE.get(status)
    return f"{advice}. {exc}" if advice else str(exc)
