"""The condition vocabulary of a TranslationTraining's status. Pure: no I/O, no clock.

Everything a user can `kubectl wait --for=condition=…` on is named in `ConditionType`, and every
reason is a constant in `Reason`, so scripts and alerts can match on them. `Cond` is one condition
as the pure mappings (status.py, jobset_status.py, scheduling_status.py, evaluation_status.py)
produce it; `upsert_conditions` folds them into a status's list, `condition` reads one back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, TypeGuard, cast


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


@dataclass(frozen=True)
class Cond:
    type: str
    status: str
    reason: str
    message: str = ""


def is_true(cond: Optional[Mapping[str, Any]]) -> TypeGuard[Mapping[str, Any]]:
    return cond is not None and cond.get("status") == TRUE


def condition(status: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cast(Mapping[str, Any], cond)
    return None


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


# ------------------------------------------------------------------ spec messages


def invalid_spec_message(errors: Iterable[tuple[str, str]]) -> str:
    """`spec.nodes: must be ≥ 1; spec.image: field required` — field first, so a reader sees which."""
    return truncate("; ".join(f"{path}: {message}" for path, message in errors) or "invalid spec")


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
