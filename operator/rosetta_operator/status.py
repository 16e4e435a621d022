"""Observation → TranslationTraining status. Pure: no I/O, no clock (callers pass `now`).

An `Observation` is what the JobSet (jobset_status.observe_jobset), the pods or the operator itself
says, in our words. The handlers fold it into the desired status with `merge_status` and patch only
when `status_patch` says something changed. Here too: the observations of a training failed for
good (a data error, a failure class the operator stops the gang for, a stall under stallAction:
fail) and the predicates on a status that say so. The condition vocabulary is conditions.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from rosetta_contract.exits import TERMINATION_PREFIX
from rosetta_contract.failures import FailureClass
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import (
    FALSE,
    TRUE,
    Cond,
    ConditionType,
    Reason,
    condition,
    is_true,
    truncate,
    upsert_conditions,
)


@dataclass(frozen=True)
class Observation:
    """What the JobSet, its pods or the operator itself says, in our words."""

    phase: str
    message: Optional[str]           # None: keep the current message
    conditions: tuple[Cond, ...]
    restarts: Optional[int] = None   # failures that counted towards maxRestarts; None: keep the count
    preemptions: Optional[int] = None  # restarts that did not (DisruptionTarget); None: keep the count
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    fields: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------- failed for good


def data_invalid_message(pods: Iterable[Mapping[str, Any]]) -> Optional[str]:
    """`pod mt-node-0-0: train.de:17: not UTF-8 text …` when a container of these pods ended with
    the trainer's data error in its termination message (data_checks.report_data_invalid)."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name") or ""):
        pod_status = pod.get("status") or {}
        # Init containers too: in mode evaluate, `rosetta stage` runs as one.
        for container in (pod_status.get("initContainerStatuses") or []) + (pod_status.get("containerStatuses") or []):
            for state in (container.get("state"), container.get("lastState")):
                message = ((state or {}).get("terminated") or {}).get("message") or ""
                if message.startswith(TERMINATION_PREFIX):
                    name = (pod.get("metadata") or {}).get("name")
                    # The trainer writes one line; whatever else the container left there, the
                    # condition, the message and the event get one line of printable text.
                    text = "".join(ch if ch.isprintable() else " " for ch in message[len(TERMINATION_PREFIX):])
                    return truncate(f"pod {name}: {' '.join(text.split())}")
    return None


def is_data_invalid(status: Mapping[str, Any]) -> bool:
    return is_true(condition(status, ConditionType.DATA_INVALID))


def is_stalled(status: Mapping[str, Any]) -> bool:
    return is_true(condition(status, ConditionType.STALLED))


# The classes the operator itself stops a gang for (decide.stop_for_good), as Failed's reason.
STOPPED_BY_OPERATOR = frozenset({Reason.STALLED, FailureClass.OOM_KILLED, FailureClass.IMAGE_PULL_FAILED,
                                 FailureClass.CONFIG_ERROR, FailureClass.NON_FINITE, FailureClass.CUDA_OUT_OF_MEMORY,
                                 FailureClass.COLLECTIVE_TIMEOUT})


def stopped_for_good(status: Mapping[str, Any]) -> bool:
    """The operator stopped the gang and failed the training (DataInvalid, a class the spec fails
    at once that only the pods tell, or a stall under stallAction: fail): nothing its suspended
    JobSet does changes that."""
    failed = condition(status, ConditionType.FAILED)
    return is_data_invalid(status) or (is_true(failed) and failed.get("reason") in STOPPED_BY_OPERATOR)


def failure_reason(failure_class: str) -> str:
    """Failed's reason (and the Warning event's) for an attempt that ended with `failure_class`."""
    return Reason.DATA_CHECK_FAILED if failure_class == FailureClass.DATA_INVALID else failure_class


def observe_failure(failure_class: str, message: str, *, restarts: Optional[int] = None,
                    preemptions: Optional[int] = None, start_time: Optional[str] = None,
                    now: str = "") -> Observation:
    """Failed for good with the class as the reason: the gang is stopped, not retried."""
    if failure_class == FailureClass.DATA_INVALID:
        return observe_data_invalid(message, restarts=restarts, preemptions=preemptions, start_time=start_time, now=now)
    summary = " ".join(w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]*", failure_class)) or failure_class
    return _failed_for_good(failure_class, summary, message, (), restarts, preemptions, start_time, now)


def _failed_for_good(reason: str, summary: str, message: str, extra: tuple[Cond, ...], restarts: Optional[int],
                     preemptions: Optional[int], start_time: Optional[str], now: str) -> Observation:
    return Observation(
        Phase.FAILED, truncate(f"{summary}: {message}"),
        (Cond(ConditionType.RUNNING, FALSE, reason, message),
         Cond(ConditionType.SUSPENDED, FALSE, Reason.NOT_SUSPENDED),
         Cond(ConditionType.SUCCEEDED, FALSE, Reason.NOT_FINISHED),
         Cond(ConditionType.FAILED, TRUE, reason, message), *extra),
        restarts, preemptions, start_time, now or None,
    )


def observe_stall_failure(message: str, *, restarts: Optional[int] = None, preemptions: Optional[int] = None,
                          start_time: Optional[str] = None, now: str = "") -> Observation:
    """stallAction: fail: failed for good, the gang stopped as for a data error."""
    return _failed_for_good(Reason.STALLED, "stalled", message, (), restarts, preemptions, start_time, now)


def observe_data_invalid(message: str, *, restarts: Optional[int] = None, preemptions: Optional[int] = None,
                         start_time: Optional[str] = None, now: str = "") -> Observation:
    """Failed for good: the same data fails every restart, so the gang is stopped, not retried."""
    reason = Reason.DATA_CHECK_FAILED
    return _failed_for_good(reason, "data invalid", message, (Cond(ConditionType.DATA_INVALID, TRUE, reason, message),),
                            restarts, preemptions, start_time, now)


# -------------------------------------------------------------------------------- merge


def merge_status(current: Mapping[str, Any], observation: Observation, *, now: str,
                 generation: Optional[int] = None) -> dict[str, Any]:
    """The whole desired status: `current` with the observation folded in.

    A Scheduled=False condition (the pod watch's) shows in the message while pods should be
    starting, and turns True once every job is ready: no pod can be waiting for a node then.
    """
    desired = dict(current or {})
    desired["phase"] = observation.phase
    if observation.message is not None:
        desired["message"] = observation.message
    updates = list(observation.conditions)
    unscheduled = condition(desired, ConditionType.SCHEDULED)
    if unscheduled is not None and unscheduled.get("status") == FALSE:
        if observation.phase == Phase.RUNNING:
            updates.append(Cond(ConditionType.SCHEDULED, TRUE, Reason.SCHEDULED, "every pod is scheduled"))
        elif observation.phase in (Phase.PENDING, Phase.RESTARTING) and observation.message is not None:
            desired["message"] = truncate(f"{observation.message}; unschedulable: {unscheduled.get('message')}")
    if updates:
        desired["conditions"] = upsert_conditions(
            desired.get("conditions") or [], updates, now=now, generation=generation)
    if observation.restarts is not None:
        desired["restarts"] = observation.restarts
    if observation.preemptions is not None:
        desired["preemptions"] = observation.preemptions
    if observation.start_time:
        desired["startTime"] = observation.start_time
    if observation.completion_time and not desired.get("completionTime"):
        desired["completionTime"] = observation.completion_time
    desired.update(observation.fields)
    return desired


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The merge patch turning `current` into `desired`, or None when nothing changed.

    Only keys in `desired` are compared: fields other writers own (progress, filled by the trainer's
    reporter) are left alone. Lists are replaced whole, as a JSON merge patch does.
    """
    patch = {k: v for k, v in desired.items() if (current or {}).get(k) != v}
    return patch or None
