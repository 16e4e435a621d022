"""Kueue's decisions on a queued JobSet (admitted, queued, evicted) in the training's status at once."""

from __future__ import annotations

import copy
from typing import Any, Mapping

import kopf

from rosetta_operator.act import act
from rosetta_operator.api_calls import (
    JOBSET_GROUP,
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSION,
    WORKLOAD_PLURAL,
    first_attempt_only,
    jobset_and_training,
    now,
    settle_status,
)
from rosetta_operator.decide import decide_status
from rosetta_operator.jobset_status import workload_admission
from rosetta_operator.observation import gather
from rosetta_operator.operator_metrics import (
    instrumented,
    record_outcome,
)

# ------------------------------------------------------------------ Kueue and the scheduler


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL, labels={KUEUE_JOB_UID_LABEL: kopf.PRESENT})
@instrumented("workload_changed")
def workload_changed(event: Mapping[str, Any], body: kopf.Body, namespace: str, uid: str, memo: kopf.Memo,
                     **_: Any) -> None:
    """Kueue admitted, queued or evicted a JobSet: say so now, not at the JobSet's next event
    (a queued JobSet has none while it waits)."""
    decisions = memo.workload_decisions
    ref = next((r for r in body.metadata.get("ownerReferences") or []
                if r.get("kind") == "JobSet" and r.get("apiVersion", "").startswith(f"{JOBSET_GROUP}/")), None)
    if event.get("type") == "DELETED" or ref is None:
        decisions.forget(uid)
        record_outcome("ignored")
        return
    workload = copy.deepcopy(dict(body))
    if not decisions.changed(uid, workload_admission(workload, dict(body.spec or {}).get("queueName") or "")):
        record_outcome("ignored")  # Kueue's bookkeeping, not a new decision
        return
    api = memo.api_client
    try:
        jobset, owner = jobset_and_training(api, namespace, ref["name"], ref.get("uid"))
        if owner is None:
            record_outcome("ignored")
            return
        known = first_attempt_only(jobset)
        act(api, settle_status(
            api, namespace, owner["name"], owner["uid"],
            lambda training: gather(api, namespace, ref["name"], training, known(), workload),
            lambda seen, training, current: decide_status(seen, training, current, now=now()), gather_again=True))
    except Exception:
        decisions.forget(uid)  # the next event of this Workload tries again
        raise

