"""The status a training should have for what its JobSet, its pods and Kueue say now: what every
handler that mirrors the JobSet (rosetta_operator.handlers) computes before api_calls.write_status writes it.

An attempt that ended with a class the spec fails at once (failurePolicy.actions: a data error,
OOMKilled, an image that cannot be pulled, ...; attempts.py reads which from the pods) stops the
gang: the next attempt would meet the same files, memory or image. That, and a stall under
stallAction: fail (progress_round.py), is failed for good: nothing the suspended JobSet does
afterwards changes the status. Every attempt's start, end and reason go to status.attempts. A succeeded
JobSet's final figures come from rank 0's termination message, as the progress scrapes stop with
the pods.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, cast

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from rosetta_contract.failures import FAIL, FailureClass
from rosetta_contract.pod_fields import FailureActionsSpec
from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator.api_calls import get_jobset, get_workload, now, set_jobset_suspend
from rosetta_operator.attempts import SUCCEEDED, Failure, attempt_failure, record_end, record_start
from rosetta_operator.conditions import TRUE
from rosetta_operator.event_memory import Decisions
from rosetta_operator.jobset_status import observe_jobset, queue_of, restart_counts, shows_failure, workload_inactive
from rosetta_operator.names import TRAINER_CONTAINER
from rosetta_operator.node_health import exclude, max_excluded
from rosetta_operator.status import failure_reason, is_stalled, merge_status, observe_failure, stopped_for_good


def observe(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, parent: Mapping[str, Any],
            current: Mapping[str, Any], jobset: Optional[Mapping[str, Any]] = None, workload: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The desired status for what the JobSet says; `jobset` is one the caller already holds
    (None: read it here), `workload` Kueue's for it (None: listed here when the JobSet waits for it)."""
    if stopped_for_good(current):
        return dict(current)  # failed for good, its JobSet stopped: nothing it does changes that
    if jobset is None:
        jobset = get_jobset(api, namespace, jobset_name)
    if jobset is None and not current.get("jobSetName"):
        return dict(current)  # never created (invalid spec): nothing to mirror
    stamp = now()
    failure: Optional[Failure] = None
    if jobset is not None and shows_failure(jobset, current.get("restarts")):
        pods = jobset_pods(api, namespace, jobset_name, "to say why the attempt ended")
        # Without the pods the JobSet's own failure handling still applies: mirror that.
        failure = None if pods is None else attempt_failure(pods, ended_attempt(jobset, current))
        stopped = stop_for_good(api, namespace, jobset_name, parent, current, jobset, failure, stamp)
        if stopped is not None:
            return stopped
    if jobset is not None and queue_of(jobset):
        # Under a queue the user's hold is Kueue's (hold_in_queue): spec.suspend alone cannot tell
        # a held training from one created with suspend: true that waits for its turn, and a
        # JobSet that runs is one Kueue admitted.
        held = False
        if (jobset.get("spec") or {}).get("suspend"):
            if workload is None:
                workload = get_workload(api, namespace, jobset)
            held = workload_inactive(workload)
    else:
        held = bool((parent.get("spec") or {}).get("suspend"))
    observation = observe_jobset(jobset, previous_phase=current.get("phase"),
                                 previous_start_time=current.get("startTime"),
                                 previous_restarts=current.get("restarts"),
                                 previous_preemptions=current.get("preemptions"),
                                 held=held, workload=workload, now=stamp, stalled=is_stalled(current))
    desired = merge_status(current, observation, now=stamp, generation=parent["metadata"].get("generation"))
    if jobset is not None:
        desired["attempts"] = track_attempts(current, jobset, observation.phase, failure, stalled=is_stalled(current),
                                             now=stamp)
    if observation.phase == Phase.SUCCEEDED and current.get("phase") != Phase.SUCCEEDED:
        figures = final_figures(api, namespace, jobset_name)
        if figures:
            desired["progress"] = pr.final_progress(current.get("progress"), figures, stamp)
    return desired


def stop_for_good(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, parent: Mapping[str, Any],
                  current: Mapping[str, Any], jobset: Mapping[str, Any], failure: Optional[Failure],
                  stamp: str) -> Optional[dict[str, Any]]:
    """The failed-for-good status when the attempt ended with a class the spec fails at once
    (failurePolicy.actions), the gang stopped; None when the failure (if any) restarts.

    The JobSet's fail-fast rule stops the gang by itself for the trainer's exit codes; what only
    the pods say (OOMKilled, an image that cannot be pulled, a data error an older image reported
    without its code) the operator stops here, by suspending the JobSet: the next attempt would
    meet the same memory, image or files.
    """
    if failure is None or failure_action(parent, failure.failure_class) != FAIL:
        return None
    if not jobset_finished(jobset) and not fails_by_its_own_rule(jobset, failure):
        set_jobset_suspend(api, namespace, jobset_name, True)
    if STOP_EVENTS.changed(str(parent["metadata"].get("uid")), failure.failure_class):
        kopf.warn(cast(kopf.Body, parent), reason=failure_reason(failure.failure_class), message=failure.message)
    failures, preemptions = restart_counts(jobset)
    observation = observe_failure(failure.failure_class, failure.message, restarts=failures,
                                  preemptions=preemptions, start_time=current.get("startTime"), now=stamp)
    desired = merge_status(current, observation, now=stamp, generation=parent["metadata"].get("generation"))
    attempt = failure.attempt if failure.attempt is not None else ended_attempt(jobset, current)
    desired["attempts"] = record_end(current.get("attempts") or [], attempt, now=stamp,
                                     reason=failure.failure_class, failure=failure, last_step=last_step(current))
    return desired


def record_pod_failure(api: kubernetes.client.ApiClient, parent: Mapping[str, Any], current: Mapping[str, Any],
                       jobset: Optional[Mapping[str, Any]], jobset_name: str, failure: Failure) -> dict[str, Any]:
    """The status after one pod said why it stopped (or cannot start): its attempt's reason in
    status.attempts, and the gang stopped when the spec fails the class at once. The pod watch
    calls it (handlers.on_pod_event) because the JobSet restarts the gang, and the pods with their
    reasons go, before a look from the JobSet's own events could see them."""
    if stopped_for_good(current) or current.get("phase") in Phase.TERMINAL or jobset is None:
        return dict(current)
    namespace = parent["metadata"]["namespace"]
    stopped = stop_for_good(api, namespace, jobset_name, parent, current, jobset, failure, now())
    if stopped is not None:
        return stopped
    if failure.failure_class == FailureClass.IMAGE_PULL_FAILED:
        return dict(current)  # Restart: the kubelet keeps trying; the attempt has not ended
    attempt = failure.attempt if failure.attempt is not None else ended_attempt(jobset, current)
    stamp = now()
    desired = {**current, "attempts": record_end(current.get("attempts") or [], attempt, now=stamp,
                                                 reason=failure.failure_class, failure=failure,
                                                 last_step=last_step(current))}
    excluded = exclude(current.get("excludedNodes") or [], failure, limit=max_excluded(parent), now=stamp)
    if excluded is not None:
        desired["excludedNodes"] = excluded
    return desired


# What each training's stop for good was said as (one Warning event): the gang's pods report at once,
# on worker threads, each computing the same stop before either status write lands.
STOP_EVENTS = Decisions()


def fails_by_its_own_rule(jobset: Mapping[str, Any], failure: Failure) -> bool:
    """The JobSet fails by itself on this failure: its Job's pod failure policy fails on the exit
    code (failure_policies.pod_failure_policy), which the fail-fast rule turns into a failed JobSet. Suspending
    it as well would race that rule and leave a suspended JobSet instead of a failed one."""
    if failure.exit_code is None:
        return False
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        policy = (((replicated.get("template") or {}).get("spec") or {}).get("podFailurePolicy") or {})
        for rule in policy.get("rules") or []:
            codes = rule.get("onExitCodes") or {}
            if rule.get("action") == "FailJob" and codes.get("operator") == "In" \
                    and codes.get("containerName") == TRAINER_CONTAINER and failure.exit_code in (codes.get("values") or []):
                return True
    return False


def failure_action(parent: Mapping[str, Any], failure_class: str) -> Optional[str]:
    """What the training's spec does with `failure_class` (failurePolicy.actions; None: not the spec's choice)."""
    raw = ((parent.get("spec") or {}).get("failurePolicy") or {}).get("actions") or {}
    try:
        actions = FailureActionsSpec.model_validate(raw)
    except ValidationError:  # the spec was refused at create; its status says so already
        actions = FailureActionsSpec()
    return actions.action(failure_class)


def ended_attempt(jobset: Mapping[str, Any], current: Mapping[str, Any]) -> int:
    """The attempt whose end the operator looks at: the one before the JobSet's latest restart that
    status has not recorded as ended yet, else the JobSet's current one (a failed JobSet's last)."""
    total = int((jobset.get("status") or {}).get("restarts") or 0)
    known = int(current.get("restarts") or 0) + int(current.get("preemptions") or 0)
    return total - 1 if total > known else total


def last_step(current: Mapping[str, Any]) -> Optional[int]:
    step = (current.get("progress") or {}).get("step")
    return int(step) if isinstance(step, (int, float)) else None


def track_attempts(current: Mapping[str, Any], jobset: Mapping[str, Any], phase: str, failure: Optional[Failure],
                   *, stalled: bool, now: str) -> list[dict[str, Any]]:
    """status.attempts after this look at the JobSet: attempts that a restart ended get a reason (the
    pods', else what the JobSet's counters say), the running one a start, the last one its end."""
    attempts: list[dict[str, Any]] = [dict(a) for a in current.get("attempts") or []]
    total = int((jobset.get("status") or {}).get("restarts") or 0)
    known = int(current.get("restarts") or 0) + int(current.get("preemptions") or 0)
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


def final_figures(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str) -> Optional[dict[str, Any]]:
    """What rank 0 reported as it finished (its termination message): the progress scrapes stop
    with the pods, usually before the last evaluation is seen."""
    pods = jobset_pods(api, namespace, jobset_name, "for the final result")
    return None if pods is None else pr.final_result(pods, jobset_name)


def jobset_pods(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str,
                purpose: str) -> Optional[list[dict[str, Any]]]:
    """The JobSet's pods as plain dicts; None (logged) when the API refuses the list."""
    try:
        pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{pr.JOBSET_NAME_LABEL}={jobset_name}")
    except ApiException as exc:
        logging.getLogger(__name__).warning("cannot list the pods of JobSet %s/%s %s: %s",
                                            namespace, jobset_name, purpose, exc.reason)
        return None
    return [api.sanitize_for_serialization(p) for p in pods.items]


def jobset_finished(jobset: Mapping[str, Any]) -> bool:
    return any(c.get("type") in ("Completed", "Failed") and c.get("status") == TRUE
               for c in (jobset.get("status") or {}).get("conditions") or [])
