"""Why an attempt ended: the classes the operator records in status.attempts and in events, what each
one does by default, and how a trainer pod says which one it was.

A trainer process that stops on an error it knows writes `<Class>: <one line>` to its termination
message file and exits with the class's code (exits.ERROR_EXITS). Under torchrun the pod would exit
with torchrun's own 1, so the pod runs `python -m rosetta_trainer.launch torchrun ...`, which exits with
the code the message names: a Job's podFailurePolicy can then fail the gang at once on the
deterministic ones (failure_policies.py). What the kubelet says (OOMKilled, an image that cannot be pulled) and
what the cluster does (a preemption, a lost node) the operator reads from the pods (attempts.py).

Torch-free, Kubernetes-free: the trainer image and the operator both import it.
"""

from __future__ import annotations

from typing import Literal, Optional

from rosetta_contract.exits import (
    COLLECTIVE_TIMEOUT_EXIT,
    CONFIG_EXIT,
    CUDA_OUT_OF_MEMORY_EXIT,
    DATA_INVALID_EXIT,
    NODE_UNHEALTHY_EXIT,
    NON_FINITE_EXIT,
    OOM_KILLED_EXIT,
)


class FailureClass:
    """Every reason an attempt can end with, as status.attempts[].reason and the Warning event's reason."""

    DATA_INVALID = "DataInvalid"                # the trainer refused the training data (exit 65)
    CONFIG_ERROR = "ConfigError"                # the document, a path or a checkpoint cannot be used (exit 2)
    NON_FINITE = "NonFinite"                    # training.nanPolicy: stop ended the run (exit 3)
    CUDA_OUT_OF_MEMORY = "CudaOutOfMemory"      # torch ran out of GPU memory (exit 80)
    COLLECTIVE_TIMEOUT = "CollectiveTimeout"    # a collective waited too long for a rank (exit 75)
    OOM_KILLED = "OOMKilled"                    # the kernel killed the container at its memory limit
    IMAGE_PULL_FAILED = "ImagePullFailed"       # the kubelet cannot pull the image (or its name is invalid)
    NODE_LOST = "NodeLost"                      # the pod's node went away (pod GC, taint manager, kubelet)
    PREEMPTED = "Preempted"                     # the cluster took the pod back (preemption, eviction, drain)
    NODE_UNHEALTHY = "NodeUnhealthy"            # the pre-flight check failed on the pod's node (exit 81)
    STALLED = "Stalled"                         # rank 0's heartbeat stopped (faultTolerance.stallTimeoutSeconds)
    ERROR = "Error"                             # anything else: a crash the trainer did not classify


Action = Literal["Fail", "Restart"]
FAIL: Action = "Fail"
RESTART: Action = "Restart"

# The classes whose action a spec may choose (failurePolicy.actions), with the default: deterministic
# errors fail at once (the next attempt would meet the same input, the same memory, the same image);
# transient ones restart. Preemptions and lost nodes always restart without counting, other crashes
# always restart and count, stalls follow faultTolerance.stallAction.
DEFAULT_ACTIONS: dict[str, Action] = {
    FailureClass.DATA_INVALID: FAIL,
    FailureClass.CONFIG_ERROR: FAIL,
    FailureClass.NON_FINITE: FAIL,
    FailureClass.CUDA_OUT_OF_MEMORY: FAIL,
    FailureClass.OOM_KILLED: FAIL,
    FailureClass.IMAGE_PULL_FAILED: FAIL,
    FailureClass.COLLECTIVE_TIMEOUT: RESTART,
}

# The trainer's classes by the code its process (and, through the launcher, its pod) exits with.
EXIT_CLASSES: dict[int, str] = {
    DATA_INVALID_EXIT: FailureClass.DATA_INVALID,
    CONFIG_EXIT: FailureClass.CONFIG_ERROR,
    NON_FINITE_EXIT: FailureClass.NON_FINITE,
    CUDA_OUT_OF_MEMORY_EXIT: FailureClass.CUDA_OUT_OF_MEMORY,
    COLLECTIVE_TIMEOUT_EXIT: FailureClass.COLLECTIVE_TIMEOUT,
    NODE_UNHEALTHY_EXIT: FailureClass.NODE_UNHEALTHY,
    OOM_KILLED_EXIT: FailureClass.OOM_KILLED,  # the launcher's, when a worker was killed and it was not
}
CLASS_EXITS: dict[str, int] = {cls: code for code, cls in EXIT_CLASSES.items()}


def termination_message(failure_class: str, message: str) -> str:
    """What a trainer writes to its termination message file: one printable line, class first."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in message).split())
    return f"{failure_class}: {text}"


def parse_termination_message(message: str) -> Optional[tuple[str, str]]:
    """(class, text) of a message termination_message wrote, or None for anything else (a log tail)."""
    head, sep, text = message.partition(": ")
    if not sep or head not in CLASS_EXITS:
        return None
    return head, " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())


# ------------------------------------------------------------------------------- attempt logs

# The JobSet controller annotates every pod with the restart it belongs to (0 for the first
# attempt); the pod reads it through the downward API (pod_template.launcher_env).
ATTEMPT_ENV = "ROSETTA_RESTART_ATTEMPT"
NODE_RANK_ENV = "ROSETTA_NODE_RANK"
# The node a pod runs on (the downward API's spec.nodeName): the pre-flight check names it.
NODE_NAME_ENV = "ROSETTA_NODE_NAME"
# Under the training's output directory (<checkpoints mount>/<name>): one file per node and attempt,
# written by the launcher as the pod runs, so that it outlives the pod.
ATTEMPT_LOG_DIR = "logs"
# The newest bytes of one node's log in one attempt that are kept: a traceback is at the end.
MAX_ATTEMPT_LOG_BYTES = 8 * 1024 * 1024


def attempt_log_path(attempt: int, node_rank: int) -> str:
    """The log of one node in one attempt, relative to the training's output directory."""
    return f"{ATTEMPT_LOG_DIR}/attempt-{attempt}/node-{node_rank}.log"
