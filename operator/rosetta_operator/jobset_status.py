"""JobSet (and its Kueue Workload) → an Observation: phase, the conditions that mirror the JobSet,
restart counts. Pure: no I/O, no clock (callers pass `now`).

`observe_jobset` is the one mapping; the readers it is built from (job counts, the stage job,
restart counts, the LocalQueue, Kueue's admission) serve the handlers too. status.py folds the
Observation into the training's status.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, cast

from rosetta_contract.resource import Phase
from rosetta_operator.conditions import FALSE, TRUE, Cond, ConditionType, Reason, is_true, truncate
from rosetta_operator.failure_policies import PREEMPTION_ACTION
from rosetta_operator.names import KUEUE_QUEUE_LABEL, STAGE_JOB
from rosetta_operator.status import Observation


def _jobset_condition(jobset: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cast(Mapping[str, Any], cond)
    return None



def expected_jobs(jobset: Mapping[str, Any]) -> int:
    """Child Jobs the JobSet runs when healthy: the sum of its replicatedJobs' replicas, less the
    stage job (it has finished before the gang starts)."""
    return sum(int(rj.get("replicas", 1)) for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []
               if rj.get("name") != STAGE_JOB)


def job_counts(jobset: Mapping[str, Any]) -> dict[str, int]:
    """The gang's Jobs by state (the stage job's: _stage_status)."""
    counts = {"ready": 0, "active": 0, "succeeded": 0, "failed": 0, "suspended": 0}
    for rjs in (jobset.get("status") or {}).get("replicatedJobsStatus") or []:
        if rjs.get("name") == STAGE_JOB:
            continue
        for key in counts:
            counts[key] += int(rjs.get(key) or 0)
    return counts


def _stage_status(jobset: Mapping[str, Any]) -> Mapping[str, Any]:
    """The stage job's entry of replicatedJobsStatus ({} before the controller wrote one)."""
    return next((rjs for rjs in (jobset.get("status") or {}).get("replicatedJobsStatus") or []
                 if rjs.get("name") == STAGE_JOB), {})


def staging(jobset: Mapping[str, Any]) -> bool:
    """The JobSet has a stage job (model.source, data.source) that has not completed yet."""
    if not any(rj.get("name") == STAGE_JOB for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []):
        return False
    return int(_stage_status(jobset).get("succeeded") or 0) < 1


def stage_work(jobset: Mapping[str, Any]) -> str:
    """What the stage job does, read from its command (`rosetta stage [--prepare OUTPUT]`)."""
    stage: Mapping[str, Any] = next((rj for rj in (jobset.get("spec") or {}).get("replicatedJobs") or [] if rj.get("name") == STAGE_JOB), {})
    containers = ((((stage.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}) \
        .get("containers") or [{}]
    command = containers[0].get("command") or []
    copying = "copying model.source/data.source onto the shared volume"
    if "--prepare" not in command:
        return copying
    env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
    return (f"tokenizing the training data into {env.get('ROSETTA_OUTPUT', 'the output')}/prepared "
            "(after copying model.source/data.source, where the spec has them)")


def _jobset_conditions(running: Cond, suspended: Cond, succeeded: Cond, failed: Cond) -> tuple[Cond, ...]:
    return (running, suspended, succeeded, failed)


def restart_counts(jobset: Mapping[str, Any]) -> tuple[int, int]:
    """(failures, preemptions): the JobSet's restarts that counted towards failurePolicy.maxRestarts,
    and those its preemption rule (RestartJobSetAndIgnoreMaxRestarts) let through for free.

    restartsCountTowardsMax is omitted when 0, and a JobSet controller older than the field never
    writes it; only a JobSet that has a rule which ignores maxRestarts can have restarts that did
    not count, so without one every restart is a failure.
    """
    status = jobset.get("status") or {}
    restarts = int(status.get("restarts") or 0)
    counted = status.get("restartsCountTowardsMax")
    if counted is None:
        rules = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("rules") or []
        counted = 0 if any(r.get("action") == PREEMPTION_ACTION for r in rules) else restarts
    failures = min(int(counted), restarts)
    return failures, restarts - failures


def _restart_message(jobset: Mapping[str, Any], failures: int, preemptions: int, previous_restarts: Optional[int],
                     previous_preemptions: Optional[int], ready_text: str, stalled: bool = False) -> str:
    """`restart 3 after a preemption: 0/1 jobs ready (failures 1/3, preemptions 2)`. The cause is
    the one counter that grew since the previous status, else the only kind there has been; when
    neither tells (both kinds, no growth seen) it is left out rather than guessed. A failure while
    the training is Stalled is the operator's own end of the stalled attempt: "after a stall"."""
    grew_preemptions = preemptions > int(previous_preemptions or 0)
    grew_failures = failures > int(previous_restarts or 0)
    failure = " after a stall" if stalled else " after a failure"
    if grew_preemptions != grew_failures:
        cause = " after a preemption" if grew_preemptions else failure
    elif not (failures and preemptions):
        cause = " after a preemption" if preemptions else failure
    else:
        cause = ""
    limit = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts")
    budget = f"{failures}/{limit}" if limit is not None else str(failures)
    return f"restart {failures + preemptions}{cause}: {ready_text} (failures {budget}, preemptions {preemptions})"


# ------------------------------------------------------------------------------------------ Kueue


def queue_of(jobset: Mapping[str, Any]) -> Optional[str]:
    """The Kueue LocalQueue the JobSet was submitted to (the label render.py sets)."""
    return ((jobset.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)


def workload_inactive(workload: Optional[Mapping[str, Any]]) -> bool:
    """Kueue holds a Workload whose spec.active is false: nothing of it is admitted or queued."""
    return workload is not None and (workload.get("spec") or {}).get("active") is False


def waits_for_kueue(jobset: Mapping[str, Any], held: bool) -> bool:
    """Suspended under a queue without the user asking: Kueue has not admitted it (or took it back)."""
    return bool(queue_of(jobset)) and not held and bool((jobset.get("spec") or {}).get("suspend"))


def _kueue_condition(workload: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cast(Mapping[str, Any], cond)
    return None


def _admitted(queue: str) -> Cond:
    # The same words whether a Workload or a running JobSet said it: one status, no flip-flop.
    return Cond(ConditionType.ADMITTED, TRUE, Reason.ADMITTED, f"admitted by Kueue (LocalQueue {queue})")


def workload_admission(workload: Optional[Mapping[str, Any]], queue: str) -> Cond:
    """Kueue's decision on a JobSet's Workload (kueue.x-k8s.io/v1beta1) as our Admitted condition.

    While it waits, the message is Kueue's own reason, preferring what it waits for now (no quota
    reserved: which resource and how much is missing) over how it got there (evicted, preempted).
    """
    where = f"LocalQueue {queue}"
    if workload is None:
        return Cond(ConditionType.ADMITTED, FALSE, Reason.QUEUED, f"queued in {where}: waiting for Kueue")
    admitted = _kueue_condition(workload, "Admitted")
    if is_true(admitted):
        return _admitted(queue)
    reserved = _kueue_condition(workload, "QuotaReserved")
    evicted = _kueue_condition(workload, "Evicted")
    candidates = ((reserved or {}).get("status") == FALSE and reserved,
                  is_true(evicted) and evicted,
                  admitted)
    why = next((c.get("message") for c in candidates if c and c.get("message")), "waiting for Kueue")
    return Cond(ConditionType.ADMITTED, FALSE, Reason.QUEUED, truncate(f"queued in {where}: {why}"))


# ------------------------------------------------------------------------------------ the mapping


def observe_jobset(jobset: Optional[Mapping[str, Any]], *, previous_phase: Optional[str] = None,
                   previous_start_time: Optional[str] = None, previous_restarts: Optional[int] = None,
                   previous_preemptions: Optional[int] = None, held: bool = False,
                   workload: Optional[Mapping[str, Any]] = None, now: str = "", stalled: bool = False) -> Observation:
    """Map a JobSet (spec + status, as read from the API) to our phase and conditions.

    Precedence follows what a user would want to know first: finished beats suspended beats
    queued beats restarting beats running. `jobset=None` means it is gone: after a finish that is
    the JobSet's own ttlSecondsAfterFinished and changes nothing; before, somebody deleted it and
    training is lost. `held` says the user holds the training: its spec.suspend, or under a queue
    its Workload held inactive (see decide.decide_status); Kueue's decision is `workload` (None: not
    known). `stalled`: the training's Stalled condition is True (a restart then is the stall's).
    """
    not_suspended = Cond(ConditionType.SUSPENDED, FALSE, Reason.NOT_SUSPENDED)
    not_succeeded = Cond(ConditionType.SUCCEEDED, FALSE, Reason.NOT_FINISHED)
    not_failed = Cond(ConditionType.FAILED, FALSE, Reason.NOT_FINISHED)

    if jobset is None:
        if previous_phase in Phase.TERMINAL:
            return Observation(previous_phase, None, (), start_time=previous_start_time)
        message = "the JobSet was deleted before training finished"
        return Observation(
            Phase.FAILED, message,
            _jobset_conditions(Cond(ConditionType.RUNNING, FALSE, Reason.JOBSET_DELETED, message),
                               not_suspended, not_succeeded,
                               Cond(ConditionType.FAILED, TRUE, Reason.JOBSET_DELETED, message)),
            start_time=previous_start_time, completion_time=now or None,
        )

    failures, preemptions = restart_counts(jobset)
    counts = job_counts(jobset)
    expected = expected_jobs(jobset)
    ready_text = f"{counts['ready']}/{expected} jobs ready"
    start_time = previous_start_time
    queue = queue_of(jobset)
    # A JobSet that runs under a queue was admitted; one that waits says why below.
    admitted = (_admitted(queue),) if queue else ()

    completed = _jobset_condition(jobset, "Completed")
    failed = _jobset_condition(jobset, "Failed")
    if is_true(completed):
        message = completed.get("message") or "all jobs completed"
        return Observation(
            Phase.SUCCEEDED, message,
            _jobset_conditions(Cond(ConditionType.RUNNING, FALSE, Reason.JOBSET_COMPLETED, message),
                               not_suspended,
                               Cond(ConditionType.SUCCEEDED, TRUE, Reason.JOBSET_COMPLETED, message),
                               not_failed),
            failures, preemptions, start_time, completed.get("lastTransitionTime") or now or None,
        )
    if is_true(failed):
        # JobSet reasons (FailedJobs, ReachedMaxRestarts, …) say why; keep them in our message.
        message = ": ".join(p for p in (failed.get("reason"), failed.get("message")) if p) or "the JobSet failed"
        return Observation(
            Phase.FAILED, truncate(message),
            _jobset_conditions(Cond(ConditionType.RUNNING, FALSE, Reason.JOBSET_FAILED, truncate(message)),
                               not_suspended, not_succeeded,
                               Cond(ConditionType.FAILED, TRUE, Reason.JOBSET_FAILED, truncate(message))),
            failures, preemptions, start_time, failed.get("lastTransitionTime") or now or None,
        )

    if waits_for_kueue(jobset, held):
        queued = workload_admission(workload, queue or "")
        if queued.status == FALSE:
            return Observation(
                Phase.QUEUED, queued.message,
                (*_jobset_conditions(Cond(ConditionType.RUNNING, FALSE, Reason.QUEUED, queued.message),
                                     not_suspended, not_succeeded, not_failed), queued),
                failures, preemptions, start_time,
            )
        # Admitted, and Kueue is about to unsuspend it: starting, as below.

    suspend_requested = bool((jobset.get("spec") or {}).get("suspend")) and not waits_for_kueue(jobset, held)
    kueue_resumed = bool(queue) and not held  # Kueue unsuspended it: starting, not the user's resume
    if suspend_requested or (is_true(_jobset_condition(jobset, "Suspended")) and not kueue_resumed):
        # spec.suspend is ours (we patch it); the condition is the JobSet controller catching up.
        reason = Reason.SUSPEND_REQUESTED if suspend_requested else Reason.RESUMING
        message = "suspended: jobs are stopped" if suspend_requested else "resuming: waiting for the JobSet controller"
        return Observation(
            Phase.SUSPENDED, message,
            _jobset_conditions(Cond(ConditionType.RUNNING, FALSE, reason, message),
                               Cond(ConditionType.SUSPENDED, TRUE, reason, message),
                               not_succeeded, not_failed),
            failures, preemptions, start_time,
        )

    if expected and counts["ready"] >= expected:
        message = f"running: {ready_text}"
        return Observation(
            Phase.RUNNING, message,
            (*_jobset_conditions(Cond(ConditionType.RUNNING, TRUE, Reason.ALL_JOBS_READY, message),
                                 not_suspended, not_succeeded, not_failed), *admitted),
            failures, preemptions, start_time or now or None,
        )

    if failures or preemptions:
        message = _restart_message(jobset, failures, preemptions, previous_restarts, previous_preemptions,
                                   ready_text, stalled)
        reason = Reason.RESTARTING
        phase = Phase.RESTARTING
    elif staging(jobset):
        message = f"staging: {stage_work(jobset)} before the gang starts"
        reason = Reason.JOBS_STARTING
        phase = Phase.PENDING
    else:
        message = f"starting: {ready_text}"
        reason = Reason.JOBS_STARTING
        phase = Phase.PENDING
    return Observation(
        phase, message,
        (*_jobset_conditions(Cond(ConditionType.RUNNING, FALSE, reason, message),
                             not_suspended, not_succeeded, not_failed), *admitted),
        failures, preemptions, start_time,
    )


# ---------------------------------------------------------------------- failures the pods explain


def jobset_succeeded(jobset: Mapping[str, Any]) -> bool:
    return is_true(_jobset_condition(jobset, "Completed"))


def jobset_finished(jobset: Mapping[str, Any]) -> bool:
    return jobset_succeeded(jobset) or is_true(_jobset_condition(jobset, "Failed"))


def shows_failure(jobset: Mapping[str, Any], previous_restarts: Optional[int]) -> bool:
    """A job failed, the JobSet failed, or it restarted after a failure since we last looked
    (`previous_restarts`: status.restarts, which counts failures only): the moment to ask the pods
    why (the JobSet says only that a job failed). A preemption is no data error."""
    if is_true(_jobset_condition(jobset, "Completed")):
        return False
    stage_failed = int(_stage_status(jobset).get("failed") or 0) > 0
    return (job_counts(jobset)["failed"] > 0 or stage_failed or is_true(_jobset_condition(jobset, "Failed"))
            or restart_counts(jobset)[0] > int(previous_restarts or 0))
