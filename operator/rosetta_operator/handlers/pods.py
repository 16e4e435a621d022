"""The training pods' events: the scheduler's verdict (condition Scheduled), why a pod failed
(status.attempts, failurePolicy.actions, excluded nodes) and the pre-flight's scheduling gate."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
from typing import Any, Mapping

import kopf
import kubernetes

from rosetta_operator import node_health
from rosetta_operator import progress as pr
from rosetta_operator.act import act
from rosetta_operator.actions import Decision, PostEvent
from rosetta_operator.api_calls import (
    first_attempt_only,
    jobset_and_training,
    now,
    settle_status,
)
from rosetta_operator.attempts import Failure, pod_failure
from rosetta_operator.conditions import FALSE, Cond, ConditionType, Reason, condition, upsert_conditions
from rosetta_operator.decide import decide_pod_failure, decide_status
from rosetta_operator.names import TRAINING_LABEL
from rosetta_operator.observation import Seen, gather
from rosetta_operator.operator_metrics import (
    instrumented,
    record_outcome,
)
from rosetta_operator.scheduling_status import pod_scheduling


@kopf.on.event("v1", "pods", labels={TRAINING_LABEL: kopf.PRESENT}, id="pod_scheduling")  # type: ignore[arg-type]
async def on_pod_event(event: Mapping[str, Any], body: kopf.Body, namespace: str, uid: str, memo: kopf.Memo,
                       **_: Any) -> None:
    """Async on purpose: nearly every pod event is no news about scheduling (UnschedulablePods says
    which are), and those should not queue for a worker thread behind the reconciles."""
    waiting = memo.unschedulable_pods
    jobset_name = (body.metadata.get("labels") or {}).get(pr.JOBSET_NAME_LABEL)
    if jobset_name and event.get("type") != "DELETED" and node_health.gated(body):
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, lift_gate, memo.api_client, namespace, copy.deepcopy(dict(body)))
    failure = pod_failure(body) if jobset_name else None
    # A pod reports its failure in several events (terminated, its conditions, its deletion).
    if failure is not None and not memo.failed_pods.changed(uid, failure.failure_class):
        failure = None
    if failure is not None:
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, contextvars.copy_context().run, pod_failed, memo.api_client, namespace, jobset_name, failure)
        except Exception:
            memo.failed_pods.forget(uid)  # the pod's next event tries again
            raise
    if event.get("type") == "DELETED" or not jobset_name:
        waiting.forget(uid)
        memo.failed_pods.forget(uid)
        return
    scheduled = waiting.update(uid, (namespace, jobset_name), pod_scheduling(body))
    if scheduled is None:
        return
    try:
        # The worker thread needs this context: kopf.warn finds kopf's event poster in it.
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, scheduling_changed, memo.api_client, namespace, jobset_name,
            scheduled)
    except Exception:
        waiting.forget(uid)  # the pod's next event tries again
        raise


@instrumented("pod_scheduling")
def scheduling_changed(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str,
                       scheduled: Cond) -> None:
    """Fold a gang's Scheduled condition into its training's status; one Warning event when it
    turns False."""
    jobset, owner = jobset_and_training(api, namespace, jobset_name)
    if owner is None:
        record_outcome("ignored")
        return
    known = first_attempt_only(jobset)

    def decide(seen: Seen, parent: Mapping[str, Any], current: Mapping[str, Any]) -> Decision:
        stamp = now()
        conditions = upsert_conditions(current.get("conditions") or [], [scheduled], now=stamp,
                                       generation=parent["metadata"].get("generation"))
        decided = decide_status(seen, parent, {**current, "conditions": conditions}, now=stamp)
        before = condition(current, ConditionType.SCHEDULED) or {}
        after = condition(decided.status, ConditionType.SCHEDULED) or {}
        turned = after.get("status") == FALSE != before.get("status")
        if not turned:
            return decided
        return Decision(decided.status, (*decided.actions, PostEvent(Reason.UNSCHEDULABLE, scheduled.message)))

    act(api, settle_status(api, namespace, owner["name"], owner["uid"],
                           lambda training: gather(api, namespace, jobset_name, training, known()), decide,
                           gather_again=True))


@instrumented("pod_failed")
def pod_failed(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, failure: Failure) -> None:
    """Fold why a pod stopped into its training's status.attempts (decide.decide_pod_failure), and
    act on what that decided: a stop for good, its Warning events."""
    jobset, owner = jobset_and_training(api, namespace, jobset_name)
    if owner is None:
        record_outcome("ignored")
        return
    # The JobSet only says which attempt ran; the pod itself says why it ended.
    seen = Seen(jobset_name, jobset)
    act(api, settle_status(api, namespace, owner["name"], owner["uid"], lambda _training: seen,
                           lambda look, parent, current: decide_pod_failure(look, failure, parent, current,
                                                                            now=now())))


@instrumented("lift_gate")
def lift_gate(api: kubernetes.client.ApiClient, namespace: str, pod: Mapping[str, Any]) -> None:
    """A gang pod behind the node-health gate: keep it off the excluded nodes and let it schedule."""
    nodes = node_health.release(api, namespace, pod)
    if nodes is None:
        record_outcome("ignored")
    elif nodes:
        logging.getLogger(__name__).info("pod %s/%s kept off %s", namespace, pod["metadata"]["name"], ", ".join(nodes))


