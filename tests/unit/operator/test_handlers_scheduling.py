"""The handlers around scheduling, against an in-memory API: suspend applied only on the user's edit,
Kueue's decision (phase Queued, condition Admitted), preemptions counted apart, unschedulable pods."""

from __future__ import annotations

import asyncio
import logging

import kopf

from rosetta_contract.resource import Phase
from rosetta_contract.spec import parse_spec
from rosetta_operator import event_memory, handlers
from rosetta_operator.conditions import ConditionType, Reason, condition
from rosetta_operator.render import APPLIED_SUSPEND, render
from support.handler_api import (
    JOBSET_UID,
    NAME,
    NS,
    SPEC,
    jobset_event,
    jobset_status,
    memo,
    reconcile,
    training,
)

QUOTA = ("couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor "
         "default, 8 more needed")
NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


# ------------------------------------------------------------------------------- suspend


def test_a_resume_never_resuspends_a_jobset_that_kueue_admitted(api):
    m = memo(api)
    training(api, scheduling={"queueName": "a3-training"})
    reconcile(api, m)
    assert api.get("jobsets", NAME)["spec"]["suspend"] is True   # created suspended for Kueue
    jobset_status(api, spec={"suspend": False})                   # Kueue admitted it
    api.calls.clear()
    reconcile(api, memo(api))                                     # the operator restarted: kopf resumes
    assert [c for c in api.of("jobsets") if c[0] == "patch"] == []
    assert api.get("jobsets", NAME)["spec"]["suspend"] is False


def test_an_older_operators_jobset_is_annotated_not_resuspended(api):
    m = memo(api)
    training(api, suspend=True, scheduling={"queueName": "a3-training"})   # the old Kueue pattern
    rendered = render(NAME, NS, parse_spec(SPEC | {"suspend": True, "scheduling": {"queueName": "a3-training"}}),
                      owner=api.get("translationtrainings", NAME))
    legacy = rendered.jobset
    del legacy["metadata"]["annotations"][APPLIED_SUSPEND]
    legacy["metadata"]["uid"] = JOBSET_UID
    legacy["spec"]["suspend"] = False                                        # admitted long ago
    api.put("jobsets", legacy)
    reconcile(api, m)
    (patch,) = [c[3] for c in api.of("jobsets") if c[0] == "patch"]
    assert patch == {"metadata": {"annotations": {APPLIED_SUSPEND: "true"}}}
    assert api.get("jobsets", NAME)["spec"]["suspend"] is False


def test_the_users_edit_of_suspend_is_applied_once(api):
    m = memo(api)
    training(api)
    reconcile(api, m)
    tt = api.get("translationtrainings", NAME)
    tt["spec"]["suspend"] = True
    api.put("translationtrainings", tt)
    status = reconcile(api, m)["status"]
    (patch,) = [c[3] for c in api.of("jobsets") if c[0] == "patch"]
    assert patch == {"metadata": {"annotations": {APPLIED_SUSPEND: "true"}}, "spec": {"suspend": True}}
    assert status["phase"] == Phase.SUSPENDED
    api.calls.clear()
    reconcile(api, m)
    assert [c for c in api.of("jobsets") if c[0] == "patch"] == []


# -------------------------------------------------------------------------------- Kueue


def test_a_training_waiting_for_kueue_is_queued_with_kueues_reason(api, warnings):
    m = memo(api)
    training(api, scheduling={"queueName": "a3-training"})
    status = reconcile(api, m)["status"]
    assert ("list", "workloads", f"kueue.x-k8s.io/job-uid={JOBSET_UID}") in api.calls
    assert status["phase"] == Phase.QUEUED
    assert status["message"] == "queued in LocalQueue a3-training: waiting for Kueue"

    # Kueue creates the Workload and finds no quota: its event says so without a JobSet event
    workload = api.put("workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "jobset-mt-1", "namespace": NS, "uid": "uid-wl",
                     "labels": {"kueue.x-k8s.io/job-uid": JOBSET_UID},
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                          "name": NAME, "uid": JOBSET_UID, "controller": True}]},
        "spec": {"queueName": "a3-training"},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                   "message": QUOTA}]}})

    def event():
        handlers.workload_changed(event={"type": "MODIFIED"}, body=kopf.Body(workload), namespace=NS, uid="uid-wl",
                                  memo=m)
        return api.get("translationtrainings", NAME)["status"]

    status = event()
    assert status["phase"] == Phase.QUEUED
    assert status["message"] == f"queued in LocalQueue a3-training: {QUOTA}"
    admitted = condition(status, ConditionType.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", Reason.QUEUED)
    assert condition(status, ConditionType.SUSPENDED)["status"] == "False"

    api.calls.clear()
    event()                                   # Kueue's bookkeeping, the same decision: no API call
    assert api.calls == []

    # Kueue admits it and unsuspends the JobSet
    workload["status"] = {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                                         {"type": "Admitted", "status": "True", "reason": "Admitted"}],
                          "admission": {"clusterQueue": "gpus"}}
    jobset_status(api, spec={"suspend": False})
    status = event()
    assert status["phase"] == Phase.PENDING
    assert condition(status, ConditionType.ADMITTED)["reason"] == Reason.ADMITTED
    assert warnings == []


def test_decisions_are_bounded():
    decisions = event_memory.Decisions(limit=2)
    assert decisions.changed("a", 1) and not decisions.changed("a", 1) and decisions.changed("a", 2)
    decisions.changed("b", 1)
    decisions.changed("c", 1)
    assert decisions.changed("a", 2)          # "a", the oldest, was dropped: news again
    decisions.forget("c")
    assert decisions.changed("c", 1)


def test_without_kueue_the_list_404_is_quiet(api, caplog):
    api.kueue = False
    training(api, scheduling={"queueName": "a3-training"})
    with caplog.at_level(logging.WARNING):
        status = reconcile(api, memo(api))["status"]
    assert status["phase"] == Phase.QUEUED
    assert caplog.records == []


def test_suspend_true_beside_a_queue_waits_for_kueue(api):
    """Kueue's own docs create queued jobs with suspend: true; that is no hold, Kueue starts it."""
    training(api, suspend=True, scheduling={"queueName": "a3-training"})
    status = reconcile(api, memo(api))["status"]
    assert status["phase"] == Phase.QUEUED


def test_a_users_suspend_under_a_queue_holds_the_kueue_workload(api):
    m = memo(api)
    training(api, scheduling={"queueName": "a3-training"})
    reconcile(api, m)
    api.put("workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "jobset-mt-1", "namespace": NS, "uid": "uid-wl",
                     "labels": {"kueue.x-k8s.io/job-uid": JOBSET_UID}},
        "spec": {"queueName": "a3-training", "active": True}})
    tt = api.get("translationtrainings", NAME)
    tt["spec"]["suspend"] = True
    api.put("translationtrainings", tt)
    api.calls.clear()
    status = reconcile(api, m)["status"]
    # Kueue's switch, not the JobSet's suspend, which Kueue would undo for an admitted gang.
    assert [c[3] for c in api.of("workloads") if c[0] == "patch"] == [{"spec": {"active": False}}]
    assert [c[3] for c in api.of("jobsets") if c[0] == "patch"] == [
        {"metadata": {"annotations": {APPLIED_SUSPEND: "true"}}}]
    assert status["phase"] == Phase.SUSPENDED

    tt = api.get("translationtrainings", NAME)
    tt["spec"]["suspend"] = False
    api.put("translationtrainings", tt)
    status = reconcile(api, m)["status"]
    assert api.get("workloads", "jobset-mt-1")["spec"]["active"] is True
    assert status["phase"] == Phase.QUEUED     # back in the queue until Kueue admits it again


# --------------------------------------------------------------------------- preemption


def test_preemptions_are_counted_apart_from_failures(api):
    m = memo(api)
    training(api)
    reconcile(api, m)
    status = jobset_event(api, m, jobset_status(api, status={"restarts": 1}))["status"]   # a reclaimed spot node
    assert (status["restarts"], status["preemptions"]) == (0, 1)
    assert status["message"].startswith("restart 1 after a preemption: ")
    assert api.of("pods") == []               # a preemption is no reason to look for a data error
    status = jobset_event(api, m, jobset_status(api, status={"restarts": 2, "restartsCountTowardsMax": 1}))["status"]
    assert (status["restarts"], status["preemptions"]) == (1, 1)
    assert status["message"].startswith("restart 2 after a failure: ")
    assert api.of("pods")                     # a failure is


# ---------------------------------------------------------------------------- scheduling


def pod(uid: str, *condition) -> dict:
    conditions = [dict(zip(("type", "status", "reason", "message"), condition))] if condition else []
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"mt-node-0-{uid}", "namespace": NS, "uid": uid,
                         "labels": {"rosetta.dev/training": NAME, "jobset.sigs.k8s.io/jobset-name": NAME}},
            "status": {"conditions": conditions}}


def test_an_unschedulable_gang_says_why_once(api, warnings):
    m = memo(api)
    training(api)
    reconcile(api, m)

    def event(p: dict, type_: str = "MODIFIED") -> None:
        asyncio.run(handlers.on_pod_event(event={"type": type_}, body=kopf.Body(p), namespace=NS,
                                          uid=p["metadata"]["uid"], memo=m))

    api.calls.clear()
    event(pod("a"))                                                     # no verdict yet
    event(pod("a", "PodScheduled", "True", None, ""))                   # bound at once
    assert api.calls == []

    event(pod("b", "PodScheduled", "False", "Unschedulable", NO_GPU))
    status = api.get("translationtrainings", NAME)["status"]
    scheduled = condition(status, ConditionType.SCHEDULED)
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == ("False", "Unschedulable", NO_GPU)
    assert status["phase"] == Phase.PENDING
    assert status["message"] == f"starting: 0/1 jobs ready; unschedulable: {NO_GPU}"
    assert warnings == [{"name": NAME, "reason": "Unschedulable", "message": NO_GPU}]

    api.calls.clear()
    event(pod("b", "PodScheduled", "False", "Unschedulable", NO_GPU))   # the same again: free
    assert api.calls == []

    event(pod("b", "PodScheduled", "True", None, ""))
    status = api.get("translationtrainings", NAME)["status"]
    assert condition(status, ConditionType.SCHEDULED)["status"] == "True"
    assert status["message"] == "starting: 0/1 jobs ready"
    assert len(warnings) == 1
