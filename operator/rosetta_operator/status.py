"""JobSet state → TranslationTraining status. Pure: no I/O, no clock (callers pass `now`).

The handlers read a JobSet, call `observe_jobset` and `merge_status`, and patch only when
`status_patch` says something changed. Everything a user can `kubectl wait --for=condition=…` on is
named in `ConditionType`, and every reason is a constant in `Reason`, so scripts and alerts can
match on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, TypeGuard, cast

from rosetta_contract.exits import TERMINATION_PREFIX
from rosetta_contract.failures import FailureClass
from rosetta_contract.resource import Phase
from rosetta_operator.render import KUEUE_QUEUE_LABEL, PREEMPTION_ACTION, STAGE_JOB


class ConditionType:
    VALID = "Valid"                # the spec passed validation
    CREATED = "Created"            # the ConfigMap and JobSet exist and are ours
    SPEC_APPLIED = "SpecApplied"   # the running JobSet matches the spec (False: a change was refused)
    RUNNING = "Running"            # every node's job is ready
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DATA_INVALID = "DataInvalid"   # the trainer rejected the training data; set only when True
    ADMITTED = "Admitted"          # Kueue admitted the JobSet; set only with scheduling.queueName
    SCHEDULED = "Scheduled"        # no pod waits for a node; set once a pod was unschedulable
    EVALUATED = "Evaluated"        # the after-training evaluation finished; set only with afterTraining
    STALLED = "Stalled"            # rank 0's heartbeat stopped (stall.py); set once a training stalled

    # The conditions that mirror the JobSet; always all present so `kubectl wait` never sees a gap.
    FROM_JOBSET = (RUNNING, SUSPENDED, SUCCEEDED, FAILED)


class Reason:
    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    FORBIDDEN_BY_POLICY = "ForbiddenByPolicy"  # valid, but the admin's policy (policy.py) does not allow it
    JOBSET_CREATED = "JobSetCreated"
    EVALUATION_JOB_CREATED = "EvaluationJobCreated"  # mode evaluate: a Job, no JobSet
    NAME_CONFLICT = "NameConflict"
    CREATE_REJECTED = "CreateRejected"    # the API refused the ConfigMap or JobSet for good (422, 400, 413, …)
    QUOTA_EXCEEDED = "QuotaExceeded"      # a ResourceQuota refused it for now; retried
    JOBSET_DELETED = "JobSetDeleted"
    SPEC_IN_SYNC = "SpecInSync"
    SPEC_CHANGE_REFUSED = "SpecChangeRefused"
    JOBS_STARTING = "JobsStarting"
    ALL_JOBS_READY = "AllJobsReady"
    RESTARTING = "Restarting"
    SUSPEND_REQUESTED = "SuspendRequested"
    RESUMING = "Resuming"
    NOT_SUSPENDED = "NotSuspended"
    JOBSET_COMPLETED = "JobSetCompleted"
    JOBSET_FAILED = "JobSetFailed"
    NOT_FINISHED = "NotFinished"
    DATA_CHECK_FAILED = "DataCheckFailed"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULED = "Scheduled"
    EVALUATION_PENDING = "EvaluationPending"
    EVALUATION_RUNNING = "EvaluationRunning"
    EVALUATION_SUCCEEDED = "EvaluationSucceeded"
    EVALUATION_FAILED = "EvaluationFailed"
    STALLED = "Stalled"            # the Warning event of a stall, and Failed's reason under stallAction: fail
    NO_HEARTBEAT = "NoHeartbeat"   # Stalled=True
    HEARTBEAT = "Heartbeat"        # Stalled=False: rank 0 beats again
    NODE_EXCLUDED = "NodeExcluded"  # the Warning event of a node kept out of the next attempts (node_health.py)


TRUE, FALSE = "True", "False"

# Event and condition messages are read by humans in `kubectl describe`; a pydantic error list for a
# large spec can run to kilobytes, and the apiserver rejects events over 1 KiB of message anyway.
MAX_MESSAGE = 1024


def truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def invalid_spec_message(errors: Iterable[tuple[str, str]]) -> str:
    """`spec.nodes: must be ≥ 1; spec.image: field required` — field first, so a reader sees which."""
    return truncate("; ".join(f"{path}: {message}" for path, message in errors) or "invalid spec")


@dataclass(frozen=True)
class Cond:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Observation:
    """What the JobSet says, in our words."""

    phase: str
    message: Optional[str]           # None: keep the current message
    conditions: tuple[Cond, ...]
    restarts: Optional[int] = None   # failures that counted towards maxRestarts; None: keep the count
    preemptions: Optional[int] = None  # restarts that did not (DisruptionTarget); None: keep the count
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    fields: Mapping[str, Any] = field(default_factory=dict)


def changed_fields(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two specs differ, at the deepest mapping level (lists count as one value:
    `spec.env` rather than a guess at which item moved)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += changed_fields(old.get(key), new.get(key), path)
        return out
    return [] if old == new else [prefix or "(root)"]


def refused_message(fields: list[str]) -> str:
    return truncate(
        f"cannot change {', '.join(fields)} of an existing training (only spec.suspend can change); "
        "revert the change, or delete and recreate the TranslationTraining")


# ----------------------------------------------------------------------------- JobSet


def _jobset_condition(jobset: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cast(Mapping[str, Any], cond)
    return None


def _is_true(cond: Optional[Mapping[str, Any]]) -> TypeGuard[Mapping[str, Any]]:
    return cond is not None and cond.get("status") == TRUE


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
    if _is_true(admitted):
        return _admitted(queue)
    reserved = _kueue_condition(workload, "QuotaReserved")
    evicted = _kueue_condition(workload, "Evicted")
    candidates = ((reserved or {}).get("status") == FALSE and reserved,
                  _is_true(evicted) and evicted,
                  admitted)
    why = next((c.get("message") for c in candidates if c and c.get("message")), "waiting for Kueue")
    return Cond(ConditionType.ADMITTED, FALSE, Reason.QUEUED, truncate(f"queued in {where}: {why}"))


def observe_jobset(jobset: Optional[Mapping[str, Any]], *, previous_phase: Optional[str] = None,
                   previous_start_time: Optional[str] = None, previous_restarts: Optional[int] = None,
                   previous_preemptions: Optional[int] = None, held: bool = False,
                   workload: Optional[Mapping[str, Any]] = None, now: str = "", stalled: bool = False) -> Observation:
    """Map a JobSet (spec + status, as read from the API) to our phase and conditions.

    Precedence follows what a user would want to know first: finished beats suspended beats
    queued beats restarting beats running. `jobset=None` means it is gone: after a finish that is
    the JobSet's own ttlSecondsAfterFinished and changes nothing; before, somebody deleted it and
    training is lost. `held` says the user holds the training: its spec.suspend, or under a queue
    its Workload held inactive (see handlers.observe); Kueue's decision is `workload` (None: not
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
    if _is_true(completed):
        message = completed.get("message") or "all jobs completed"
        return Observation(
            Phase.SUCCEEDED, message,
            _jobset_conditions(Cond(ConditionType.RUNNING, FALSE, Reason.JOBSET_COMPLETED, message),
                               not_suspended,
                               Cond(ConditionType.SUCCEEDED, TRUE, Reason.JOBSET_COMPLETED, message),
                               not_failed),
            failures, preemptions, start_time, completed.get("lastTransitionTime") or now or None,
        )
    if _is_true(failed):
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
    if suspend_requested or (_is_true(_jobset_condition(jobset, "Suspended")) and not kueue_resumed):
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


# ------------------------------------------------------------------------ data errors


def jobset_succeeded(jobset: Mapping[str, Any]) -> bool:
    return _is_true(_jobset_condition(jobset, "Completed"))


def shows_failure(jobset: Mapping[str, Any], previous_restarts: Optional[int]) -> bool:
    """A job failed, the JobSet failed, or it restarted after a failure since we last looked
    (`previous_restarts`: status.restarts, which counts failures only): the moment to ask the pods
    why (the JobSet says only that a job failed). A preemption is no data error."""
    if _is_true(_jobset_condition(jobset, "Completed")):
        return False
    stage_failed = int(_stage_status(jobset).get("failed") or 0) > 0
    return (job_counts(jobset)["failed"] > 0 or stage_failed or _is_true(_jobset_condition(jobset, "Failed"))
            or restart_counts(jobset)[0] > int(previous_restarts or 0))


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
    return _is_true(condition(status, ConditionType.DATA_INVALID))


def is_stalled(status: Mapping[str, Any]) -> bool:
    return _is_true(condition(status, ConditionType.STALLED))


# The classes the operator itself stops a gang for (observation.stop_for_good), as Failed's reason.
STOPPED_BY_OPERATOR = frozenset({Reason.STALLED, FailureClass.OOM_KILLED, FailureClass.IMAGE_PULL_FAILED,
                                 FailureClass.CONFIG_ERROR, FailureClass.NON_FINITE, FailureClass.CUDA_OUT_OF_MEMORY,
                                 FailureClass.COLLECTIVE_TIMEOUT})


def stopped_for_good(status: Mapping[str, Any]) -> bool:
    """The operator stopped the gang and failed the training (DataInvalid, a class the spec fails
    at once that only the pods tell, or a stall under stallAction: fail): nothing its suspended
    JobSet does changes that."""
    failed = condition(status, ConditionType.FAILED)
    return is_data_invalid(status) or (_is_true(failed) and failed.get("reason") in STOPPED_BY_OPERATOR)


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


# -------------------------------------------------------------------------- scheduling


def pod_scheduling(pod: Mapping[str, Any]) -> Optional[Cond]:
    """The scheduler's verdict on one pod as a Scheduled condition: False with its message
    (`0/4 nodes are available: 4 Insufficient nvidia.com/gpu.`) while no node fits, True once the
    pod is bound, None before a verdict or while a scheduling gate (Kueue's) holds it back."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") != "PodScheduled":
            continue
        if cond.get("status") == TRUE:
            return Cond(ConditionType.SCHEDULED, TRUE, Reason.SCHEDULED, "every pod is scheduled")
        if cond.get("reason") == "Unschedulable":
            return Cond(ConditionType.SCHEDULED, FALSE, Reason.UNSCHEDULABLE,
                        truncate(cond.get("message") or "no node fits the pod"))
    return None


class UnschedulablePods:
    """Pods last seen unschedulable, by uid, with their gang (namespace, JobSet) and the
    scheduler's message: what makes a pod event news, and which pods of a gang still wait.

    Only waiting pods are kept, so a gang that is scheduled at once costs nothing. Bounded, the
    oldest forgotten first: a forgotten pod's next verdict is news again. Not thread-safe: one
    event loop calls it.
    """

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._pods: dict[str, tuple[tuple[str, str], str]] = {}

    def update(self, uid: str, gang: tuple[str, str], verdict: Optional[Cond]) -> Optional[Cond]:
        """The gang's Scheduled condition after this pod's verdict; None: nothing new to write."""
        if verdict is None:
            return None
        last = self._pods.pop(uid, None)
        if verdict.status == FALSE:
            self._pods[uid] = (gang, verdict.message)  # (re)inserted last: the newest
            while len(self._pods) > self.limit:
                del self._pods[next(iter(self._pods))]
            if last == (gang, verdict.message):
                return None
            others = [m for u, (g, m) in self._pods.items() if g == gang and u != uid]
            # The gang's other pods wait for the same reason: the training says so already.
            return None if verdict.message in others else verdict
        if last is None:
            return None  # bound, and never seen waiting: nothing to take back
        return self.waiting(gang) or verdict

    def waiting(self, gang: tuple[str, str]) -> Optional[Cond]:
        """Why a pod of this gang still waits for a node, if one does."""
        for known, message in self._pods.values():
            if known == gang:
                return Cond(ConditionType.SCHEDULED, FALSE, Reason.UNSCHEDULABLE, message)
        return None

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)


# -------------------------------------------------------------------------- conditions


def upsert_conditions(existing: Iterable[Mapping[str, Any]], updates: Iterable[Cond], *, now: str,
                      generation: Optional[int] = None) -> list[dict[str, Any]]:
    """Replace conditions by type, keeping lastTransitionTime when the status did not change.

    Order is stable: existing types keep their place, new types are appended, so a status that did
    not change compares equal and is not patched.
    """
    out = [dict(c) for c in existing or []]
    index = {c.get("type"): i for i, c in enumerate(out)}
    for upd in updates:
        new: dict[str, Any] = {"type": upd.type, "status": upd.status, "reason": upd.reason, "message": upd.message}
        if generation is not None:
            new["observedGeneration"] = generation
        i = index.get(upd.type)
        if i is None:
            new["lastTransitionTime"] = now
            index[upd.type] = len(out)
            out.append(new)
            continue
        old = out[i]
        same = old.get("status") == upd.status
        new["lastTransitionTime"] = old.get("lastTransitionTime", now) if same else now
        out[i] = new
    return out


def condition(status: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cast(Mapping[str, Any], cond)
    return None


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
