"""Decide: the status a training should have for what its JobSet, its pods and Kueue said (a `Seen`,
observation.py), and what the operator must do once that status is written (actions.py). Pure: no
I/O, no clock (callers pass `now`), so api_calls.settle_status may run it again after a conflict.

An attempt that ended with a class the spec fails at once (failurePolicy.actions: a data error,
OOMKilled, an image that cannot be pulled, ...; attempts.py reads which from the pods) stops the
gang: the next attempt would meet the same files, memory or image. That, and a stall under
stallAction: fail (progress_round.py), is failed for good: nothing the suspended JobSet does
afterwards changes the status. Every attempt's start, end and reason go to status.attempts. A succeeded
JobSet's final figures come from rank 0's termination message, as the progress scrapes stop with
the pods.

Events are decided on what the status turns into, so they follow the status's single writes: a
writer that loses the race to the same news re-decides on the status that says it already.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import ValidationError

from rosetta_contract.failures import FAIL, FailureClass
from rosetta_contract.pod_fields import FailureActionsSpec
from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator.actions import Action, Decision, PostEvent, Suspend
from rosetta_operator.attempts import SUCCEEDED, Failure, attempt_failure, record_end, record_start
from rosetta_operator.conditions import ConditionType, Reason, condition
from rosetta_operator.jobset_status import (
    jobset_finished,
    observe_jobset,
    queue_of,
    restart_counts,
    shows_failure,
    workload_inactive,
)
from rosetta_operator.names import TRAINER_CONTAINER
from rosetta_operator.node_health import exclude, max_excluded
from rosetta_operator.observation import Seen
from rosetta_operator.status import (
    failure_reason,
    is_data_invalid,
    is_stalled,
    merge_status,
    observe_failure,
    stopped_for_good,
)


def decide_status(seen: Seen, training: Mapping[str, Any], current: Mapping[str, Any], *, now: str) -> Decision:
    """The desired status for what `seen` says, and the stop (suspend, Warning event) of an attempt
    that ended with a class the spec fails at once."""
    if stopped_for_good(current):
        return Decision(dict(current), owed_suspend(seen, current))
    jobset = seen.jobset
    if jobset is None and not current.get("jobSetName"):
        return Decision(dict(current))  # never created (invalid spec): nothing to mirror
    failure: Optional[Failure] = None
    if jobset is not None and shows_failure(jobset, current.get("restarts")):
        # Without the pods the JobSet's own failure handling still applies: mirror that.
        failure = None if seen.pods is None else attempt_failure(seen.pods, ended_attempt(jobset, current))
        stopped = stop_for_good(seen.jobset_name, jobset, training, current, failure, now=now)
        if stopped is not None:
            return stopped
    if jobset is not None and queue_of(jobset):
        # Under a queue the user's hold is Kueue's (hold_in_queue): spec.suspend alone cannot tell
        # a held training from one created with suspend: true that waits for its turn, and a
        # JobSet that runs is one Kueue admitted.
        held = bool((jobset.get("spec") or {}).get("suspend")) and workload_inactive(seen.workload)
    else:
        held = bool((training.get("spec") or {}).get("suspend"))
    observation = observe_jobset(jobset, previous_phase=current.get("phase"),
                                 previous_start_time=current.get("startTime"),
                                 previous_restarts=current.get("restarts"),
                                 previous_preemptions=current.get("preemptions"),
                                 held=held, workload=seen.workload, now=now, stalled=is_stalled(current))
    desired = merge_status(current, observation, now=now, generation=training["metadata"].get("generation"))
    if jobset is not None:
        desired["attempts"] = track_attempts(current, jobset, observation.phase, failure, stalled=is_stalled(current),
                                             now=now)
    if observation.phase == Phase.SUCCEEDED and current.get("phase") != Phase.SUCCEEDED:
        # What rank 0 reported as it finished: the progress scrapes stop with the pods, usually
        # before the last evaluation is seen.
        figures = None if seen.pods is None else pr.final_result(seen.pods, seen.jobset_name)
        if figures:
            desired["progress"] = pr.final_progress(current.get("progress"), figures, now)
    return Decision(desired)


def decide_pod_failure(seen: Seen, failure: Failure, training: Mapping[str, Any], current: Mapping[str, Any],
                       *, now: str) -> Decision:
    """The status after one pod said why it stopped (or cannot start): its attempt's reason in
    status.attempts, its node kept out when it failed its pre-flight, and the gang stopped when the
    spec fails the class at once. The pod watch decides it (handlers.pods) because the JobSet
    restarts the gang, and the pods with their reasons go, before a look from the JobSet's own
    events could see them. A Warning event, the class as its reason, when the attempt's reason
    changed; another when the node was excluded."""
    jobset = seen.jobset
    if stopped_for_good(current) or current.get("phase") in Phase.TERMINAL or jobset is None:
        return Decision(dict(current))
    stopped = stop_for_good(seen.jobset_name, jobset, training, current, failure, now=now)
    if stopped is not None:
        return stopped
    if failure.failure_class == FailureClass.IMAGE_PULL_FAILED:
        return Decision(dict(current))  # Restart: the kubelet keeps trying; the attempt has not ended
    attempt = failure.attempt if failure.attempt is not None else ended_attempt(jobset, current)
    desired = {**current, "attempts": record_end(current.get("attempts") or [], attempt, now=now,
                                                 reason=failure.failure_class, failure=failure,
                                                 last_step=last_step(current))}
    excluded = exclude(current.get("excludedNodes") or [], failure, limit=max_excluded(training), now=now)
    if excluded is not None:
        desired["excludedNodes"] = excluded
    before = {a.get("attempt"): a.get("reason") for a in current.get("attempts") or []}
    if all(before.get(a.get("attempt")) == a.get("reason") for a in desired["attempts"]):
        return Decision(desired)
    actions: list[Action] = [PostEvent(failure.failure_class, failure.message)]
    if excluded is not None:
        actions.append(PostEvent(Reason.NODE_EXCLUDED,
                                 f"node {failure.node} is kept out of the next attempts: {failure.message}"))
    return Decision(desired, tuple(actions))


def stop_for_good(jobset_name: str, jobset: Mapping[str, Any], training: Mapping[str, Any],
                  current: Mapping[str, Any], failure: Optional[Failure], *, now: str) -> Optional[Decision]:
    """The failed-for-good status, with its Warning event, when the attempt ended with a class the
    spec fails at once (failurePolicy.actions); None when the failure (if any) restarts. Callers
    decide it only on a status not failed for good yet: the event is said once, by the write that
    turns the status.

    The JobSet's fail-fast rule stops the gang by itself for the trainer's exit codes; what only
    the pods say (OOMKilled, an image that cannot be pulled, a data error an older image reported
    without its code) the operator stops, by suspending the JobSet: the next attempt would meet the
    same memory, image or files.
    """
    if failure is None or failure_action(training, failure.failure_class) != FAIL:
        return None
    actions: list[Action] = []
    if not jobset_finished(jobset) and not fails_by_its_own_rule(jobset, failure):
        actions.append(Suspend(jobset_name))
    actions.append(PostEvent(failure_reason(failure.failure_class), failure.message))
    failures, preemptions = restart_counts(jobset)
    observation = observe_failure(failure.failure_class, failure.message, restarts=failures,
                                  preemptions=preemptions, start_time=current.get("startTime"), now=now)
    desired = merge_status(current, observation, now=now, generation=training["metadata"].get("generation"))
    attempt = failure.attempt if failure.attempt is not None else ended_attempt(jobset, current)
    desired["attempts"] = record_end(current.get("attempts") or [], attempt, now=now,
                                     reason=failure.failure_class, failure=failure, last_step=last_step(current))
    return Decision(desired, tuple(actions))


def owed_suspend(seen: Seen, current: Mapping[str, Any]) -> tuple[Action, ...]:
    """The suspend of a training the operator stopped for good whose JobSet restarted the gang since:
    the suspend after the write that said so failed, or somebody resumed the JobSet. The restart is
    the sign: a JobSet read before the suspend landed (a conflict's retry, an event in flight) has
    the restart count the stop recorded, and asks for nothing. None for a JobSet that fails by its
    own rule on the exit code status.attempts recorded for the stop."""
    jobset = seen.jobset
    if jobset is None or jobset_finished(jobset) or (jobset.get("spec") or {}).get("suspend"):
        return ()
    total, known = restart_tally(jobset, current)
    if total <= known:
        return ()
    stopped_class = FailureClass.DATA_INVALID if is_data_invalid(current) \
        else (condition(current, ConditionType.FAILED) or {}).get("reason")
    code = next((a.get("exitCode") for a in reversed(current.get("attempts") or [])
                 if a.get("reason") == stopped_class), None)
    if isinstance(code, int) and fails_on_exit_code(jobset, code):
        return ()
    return (Suspend(seen.jobset_name),)


def fails_by_its_own_rule(jobset: Mapping[str, Any], failure: Failure) -> bool:
    """The JobSet fails by itself on this failure: its Job's pod failure policy fails on the exit
    code (failure_policies.pod_failure_policy), which the fail-fast rule turns into a failed JobSet. Suspending
    it as well would race that rule and leave a suspended JobSet instead of a failed one."""
    return failure.exit_code is not None and fails_on_exit_code(jobset, failure.exit_code)


def fails_on_exit_code(jobset: Mapping[str, Any], exit_code: int) -> bool:
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        policy = (((replicated.get("template") or {}).get("spec") or {}).get("podFailurePolicy") or {})
        for rule in policy.get("rules") or []:
            codes = rule.get("onExitCodes") or {}
            if rule.get("action") == "FailJob" and codes.get("operator") == "In" \
                    and codes.get("containerName") == TRAINER_CONTAINER and exit_code in (codes.get("values") or []):
                return True
    return False


def failure_action(training: Mapping[str, Any], failure_class: str) -> Optional[str]:
    """What the training's spec does with `failure_class` (failurePolicy.actions; None: not the spec's choice)."""
    raw = ((training.get("spec") or {}).get("failurePolicy") or {}).get("actions") or {}
    try:
        actions = FailureActionsSpec.model_validate(raw)
    except ValidationError:  # the spec was refused at create; its status says so already
        actions = FailureActionsSpec()
    return actions.action(failure_class)


# ---------------------------------------------------------------------------- status.attempts


def restart_tally(jobset: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[int, int]:
    """(the JobSet's restarts, those the status has counted as failures or preemptions): the
    attempts in between ended since the status last looked."""
    total = int((jobset.get("status") or {}).get("restarts") or 0)
    known = int(current.get("restarts") or 0) + int(current.get("preemptions") or 0)
    return total, known


def ended_attempt(jobset: Mapping[str, Any], current: Mapping[str, Any]) -> int:
    """The attempt whose end the operator looks at: the one before the JobSet's latest restart that
    status has not recorded as ended yet, else the JobSet's current one (a failed JobSet's last)."""
    total, known = restart_tally(jobset, current)
    return total - 1 if total > known else total


def last_step(current: Mapping[str, Any]) -> Optional[int]:
    step = (current.get("progress") or {}).get("step")
    return int(step) if isinstance(step, (int, float)) else None


def track_attempts(current: Mapping[str, Any], jobset: Mapping[str, Any], phase: str, failure: Optional[Failure],
                   *, stalled: bool, now: str) -> list[dict[str, Any]]:
    """status.attempts after this look at the JobSet: attempts that a restart ended get a reason (the
    pods', else what the JobSet's counters say), the running one a start, the last one its end."""
    attempts: list[dict[str, Any]] = [dict(a) for a in current.get("attempts") or []]
    total, known = restart_tally(jobset, current)
    failures, preemptions = restart_counts(jobset)
    for attempt in range(known, total):
        if attempt == total - 1 and failure is not None and failure.attempt in (attempt, None):
            attempts = record_end(attempts, attempt, now=now, reason=failure.failure_class, failure=failure,
                                  last_step=last_step(current))
            continue
        grew_preemptions = preemptions > int(current.get("preemptions") or 0)
        reason = (FailureClass.STALLED if stalled else FailureClass.PREEMPTED if grew_preemptions
                  and failures <= int(current.get("restarts") or 0) else FailureClass.ERROR)
        attempts = record_end(attempts, attempt, now=now, reason=reason, last_step=last_step(current))
    if phase == Phase.RUNNING:
        attempts = record_start(attempts, total, now=now)
    elif phase == Phase.SUCCEEDED:
        attempts = record_end(attempts, total, now=now, reason=SUCCEEDED, last_step=last_step(current))
    elif phase == Phase.FAILED:
        attempts = record_end(attempts, total, now=now, reason=failure.failure_class if failure else FailureClass.ERROR,
                              failure=failure, last_step=last_step(current))
    return attempts
