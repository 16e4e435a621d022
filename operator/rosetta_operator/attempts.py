"""Why an attempt of a gang ended, read from its pods, and `status.attempts`, the record of every
attempt that outlives the pods. Pure: the handlers and observation.py bring the pods, decide.py the clock.

The JobSet says only that a job failed; the pods say why, and the most specific pod wins: a rank
that runs out of memory makes the others' collectives time out, a preempted pod's peers are
stopped with SIGTERM. What the trainer named in its termination message (failures.py) is the most
specific, then what the kubelet saw (OOMKilled, an image it cannot pull), then what the cluster did
(a lost node, a preemption), then any other crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, cast

from rosetta_contract.failures import EXIT_CLASSES, FailureClass, parse_termination_message
from rosetta_operator.names import COMPLETION_INDEX, RESTART_ATTEMPT, TRAINER_CONTAINER

# The kubelet's waiting reasons for an image it cannot get (or a name no registry could serve).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# DisruptionTarget reasons that mean the node is gone, rather than the pod taken back from a live node.
NODE_LOST_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})
# The newest attempts kept in status.attempts: enough for every restart of a default maxRestarts
# many times over, small enough that the status stays far below etcd's object size limit.
MAX_ATTEMPTS = 20

_PRECEDENCE = (
    FailureClass.DATA_INVALID, FailureClass.CONFIG_ERROR, FailureClass.NON_FINITE,
    FailureClass.CUDA_OUT_OF_MEMORY, FailureClass.OOM_KILLED, FailureClass.IMAGE_PULL_FAILED,
    FailureClass.NODE_UNHEALTHY, FailureClass.NODE_LOST, FailureClass.PREEMPTED, FailureClass.COLLECTIVE_TIMEOUT,
    FailureClass.STALLED, FailureClass.ERROR,
)


@dataclass(frozen=True)
class Failure:
    """One pod's account of why it (and with it the attempt) ended."""

    failure_class: str
    message: str
    pod: str
    node: Optional[str] = None
    node_rank: Optional[int] = None
    attempt: Optional[int] = None
    exit_code: Optional[int] = None

    def record(self) -> dict[str, Any]:
        """The attempt's fields this failure fills in (status.attempts[])."""
        fields = {"reason": self.failure_class, "message": self.message, "pod": self.pod, "node": self.node,
                  "nodeRank": self.node_rank, "exitCode": self.exit_code}
        return {k: v for k, v in fields.items() if v is not None}


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _one_line(text: str, limit: int = 512) -> str:
    line = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return line if len(line) <= limit else "…" + line[-(limit - 1):]  # a log tail: its end says most


def pod_attempt(pod: Mapping[str, Any]) -> Optional[int]:
    meta = pod.get("metadata") or {}
    return _int((meta.get("annotations") or {}).get(RESTART_ATTEMPT, (meta.get("labels") or {}).get(RESTART_ATTEMPT)))


def _memory_limit(pod: Mapping[str, Any], container: str) -> Optional[str]:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            return ((spec.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def _terminations(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(container, terminated state) of every container that ended, init containers first."""
    status = pod.get("status") or {}
    out = []
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        for state in (container.get("state"), container.get("lastState")):
            terminated = (state or {}).get("terminated")
            if terminated:
                out.append((container.get("name") or "", terminated))
    return out


def _disruption(pod: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cast(Mapping[str, Any], cond)
    return None


def pod_failure(pod: Mapping[str, Any]) -> Optional[Failure]:
    """Why this pod stopped or cannot start, or None while it is healthy (or succeeded)."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or "?"
    node = (pod.get("spec") or {}).get("nodeName")
    where = f"pod {name}" + (f" on node {node}" if node else "")

    def failure(cls: str, message: str, exit_code: Optional[int] = None) -> Failure:
        return Failure(cls, _one_line(f"{where}: {message}", 1024), name, node,
                       _int((meta.get("annotations") or {}).get(COMPLETION_INDEX)), pod_attempt(pod), exit_code)

    ended = [(c, t) for c, t in _terminations(pod) if _int(t.get("exitCode")) != 0]
    for _, terminated in ended:
        named = parse_termination_message(terminated.get("message") or "")
        if named is not None:
            return failure(named[0], named[1], _int(terminated.get("exitCode")))
    for container, terminated in ended:
        if terminated.get("reason") == "OOMKilled":
            limit = _memory_limit(pod, container)
            at = f"its memory limit ({limit}, spec.resources.memory)" if limit else "the node's memory"
            return failure(FailureClass.OOM_KILLED,
                           f"container {container} was killed by the kernel at {at}; raise spec.resources.memory "
                           "or lower training.batch.tokens", _int(terminated.get("exitCode")))
    disruption = _disruption(pod)
    if disruption is not None:
        cls = FailureClass.NODE_LOST if disruption.get("reason") in NODE_LOST_REASONS else FailureClass.PREEMPTED
        why = ": ".join(p for p in (disruption.get("reason"), disruption.get("message")) if p)
        return failure(cls, f"taken away by the cluster ({why or 'DisruptionTarget'})")
    for _, terminated in ended:
        code = _int(terminated.get("exitCode"))
        if code in EXIT_CLASSES:  # the launcher's code, its message lost (an older kubelet, a full disk)
            return failure(EXIT_CLASSES[code], f"the trainer exited with code {code}", code)
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = container.get("image") or "?"
            detail = waiting.get("message") or waiting.get("reason")
            return failure(FailureClass.IMAGE_PULL_FAILED, f"cannot pull image {image}: {detail}")
    if ended and ((pod.get("status") or {}).get("phase") == "Failed" or any(
            c == TRAINER_CONTAINER for c, _ in ended)):
        container, terminated = ended[0]
        code = _int(terminated.get("exitCode"))
        tail = terminated.get("message") or terminated.get("reason") or ""
        return failure(FailureClass.ERROR, f"container {container} exited with code {code}"
                       + (f": {_one_line(tail)}" if tail else ""), code)
    return None


def _rank(failure_class: str) -> int:
    return _PRECEDENCE.index(failure_class) if failure_class in _PRECEDENCE else len(_PRECEDENCE)


def most_specific(failures: Iterable[Optional[Failure]]) -> Optional[Failure]:
    """The failure that says most about why the attempt ended (ties: the lowest node rank)."""
    known = [f for f in failures if f is not None]
    return min(known, key=lambda f: (_rank(f.failure_class), f.node_rank if f.node_rank is not None else 1 << 30, f.pod),
               default=None)


def attempt_failure(pods: Iterable[Mapping[str, Any]], attempt: Optional[int] = None) -> Optional[Failure]:
    """Why attempt `attempt` ended (None: whichever attempt its pods belong to), from the pods still there."""
    return most_specific(pod_failure(p) for p in pods if attempt is None or pod_attempt(p) in (attempt, None))


# ---------------------------------------------------------------------------- status.attempts


def record_start(attempts: Iterable[Mapping[str, Any]], attempt: int, *, now: str) -> list[dict[str, Any]]:
    """status.attempts with `attempt` begun at `now` (unchanged when it is there already)."""
    out = [dict(a) for a in attempts]
    if not any(a.get("attempt") == attempt for a in out):
        out.append({"attempt": attempt, "startTime": now})
    return _bounded(out)


def record_end(attempts: Iterable[Mapping[str, Any]], attempt: int, *, now: str, reason: str,
               failure: Optional[Failure] = None, last_step: Optional[int] = None) -> list[dict[str, Any]]:
    """status.attempts with `attempt` ended. A failure seen later that says more replaces a vaguer
    reason (the pods of an attempt report one by one); an ended attempt keeps its endTime."""
    out = record_start(attempts, attempt, now=now)
    entry = next(a for a in out if a.get("attempt") == attempt)
    known = entry.get("reason")
    if failure is not None and (known is None or _rank(failure.failure_class) < _rank(known)):
        entry.update(failure.record())
    elif known is None:
        entry["reason"] = reason
    entry.setdefault("endTime", now)
    if last_step is not None and "lastStep" not in entry:
        entry["lastStep"] = last_step
    return out


def _bounded(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    attempts.sort(key=lambda a: int(a.get("attempt") or 0))
    return attempts[-MAX_ATTEMPTS:]


SUCCEEDED = "Succeeded"

