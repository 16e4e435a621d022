"""JobSet state → our phase and conditions, table-driven with small JobSet builders."""

from __future__ import annotations

import pytest

from rosetta_contract.resource import Phase
from rosetta_contract.spec import parse_spec
from rosetta_operator.conditions import (
    MAX_MESSAGE,
    Cond,
    ConditionType,
    Reason,
    changed_fields,
    condition,
    invalid_spec_message,
    refused_message,
    truncate,
    upsert_conditions,
)
from rosetta_operator.failure_policies import failure_policy
from rosetta_operator.jobset_status import (
    expected_jobs,
    observe_jobset,
    restart_counts,
    shows_failure,
    workload_admission,
)
from rosetta_operator.scheduling_status import UnschedulablePods, pod_scheduling
from rosetta_operator.status import Observation, merge_status, observe_data_invalid, status_patch

T0, T1, T2 = "2025-01-01T00:00:00Z", "2025-01-01T00:01:00Z", "2025-01-01T00:02:00Z"


def jobset(*, replicas=2, suspend=False, ready=0, active=0, succeeded=0, failed=0, restarts=0,
           conditions=(), queue=None, counted=None, rules=True):
    """A JobSet as the API returns it; `conditions` are (type, status[, reason]) tuples; `counted`
    is restartsCountTowardsMax (None: omitted, as the API does for 0); `rules`: render.py's
    failurePolicy (False: an older operator's, maxRestarts only)."""
    status = {"restarts": restarts, "conditions": [
        {"type": c[0], "status": c[1], "reason": c[2] if len(c) > 2 else "R", "message": "",
         "lastTransitionTime": T1} for c in conditions]}
    if counted is not None:
        status["restartsCountTowardsMax"] = counted
    if ready or active or succeeded or failed:
        status["replicatedJobsStatus"] = [{"name": "node", "ready": ready, "active": active,
                                           "succeeded": succeeded, "failed": failed, "suspended": 0}]
    policy = failure_policy(parse_spec(SPEC)) if rules else {"maxRestarts": 3}
    labels = {"rosetta.dev/training": "mt", **({"kueue.x-k8s.io/queue-name": queue} if queue else {})}
    return {"metadata": {"name": "mt", "labels": labels},
            "spec": {"suspend": suspend, "failurePolicy": policy,
                     "replicatedJobs": [{"name": "node", "replicas": replicas}]},
            "status": status}


SPEC = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}


def cond_map(obs: Observation) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in obs.conditions}


@pytest.mark.parametrize("name, js, phase, running_reason", [
    ("just created, no status", jobset(), Phase.PENDING, Reason.JOBS_STARTING),
    ("some jobs active, not all ready", jobset(active=2, ready=1), Phase.PENDING, Reason.JOBS_STARTING),
    ("all jobs ready", jobset(active=2, ready=2), Phase.RUNNING, Reason.ALL_JOBS_READY),
    ("restarted, not ready again", jobset(restarts=1, active=2), Phase.RESTARTING, Reason.RESTARTING),
    ("restarted and ready again", jobset(restarts=1, ready=2), Phase.RUNNING, Reason.ALL_JOBS_READY),
    ("suspend requested", jobset(suspend=True, ready=2), Phase.SUSPENDED, Reason.SUSPEND_REQUESTED),
    ("resumed, controller catching up", jobset(conditions=[("Suspended", "True")]),
     Phase.SUSPENDED, Reason.RESUMING),
    ("resumed, controller caught up", jobset(ready=2, conditions=[("Suspended", "False")]),
     Phase.RUNNING, Reason.ALL_JOBS_READY),
    ("completed", jobset(succeeded=2, conditions=[("Completed", "True", "AllJobsCompleted")]),
     Phase.SUCCEEDED, Reason.JOBSET_COMPLETED),
    ("failed", jobset(failed=1, restarts=3, conditions=[("Failed", "True", "ReachedMaxRestarts")]),
     Phase.FAILED, Reason.JOBSET_FAILED),
    ("completed beats suspended", jobset(suspend=True, conditions=[("Completed", "True")]),
     Phase.SUCCEEDED, Reason.JOBSET_COMPLETED),
    ("startup policy only", jobset(active=1, conditions=[("StartupPolicyCompleted", "True")]),
     Phase.PENDING, Reason.JOBS_STARTING),
    ("no replicated jobs is never running", {"spec": {}, "status": {}}, Phase.PENDING, Reason.JOBS_STARTING),
])
def test_phase_from_jobset(name, js, phase, running_reason):
    obs = observe_jobset(js, now=T2)
    assert obs.phase == phase, name
    conds = cond_map(obs)
    assert set(conds) == set(ConditionType.FROM_JOBSET)
    assert conds[ConditionType.RUNNING][1] == running_reason
    assert conds[ConditionType.RUNNING][0] == ("True" if phase == Phase.RUNNING else "False")
    assert conds[ConditionType.SUSPENDED][0] == ("True" if phase == Phase.SUSPENDED else "False")
    assert conds[ConditionType.SUCCEEDED][0] == ("True" if phase == Phase.SUCCEEDED else "False")
    assert conds[ConditionType.FAILED][0] == ("True" if phase == Phase.FAILED else "False")


def test_failed_message_keeps_the_jobset_reason():
    obs = observe_jobset(jobset(conditions=[("Failed", "True", "ReachedMaxRestarts")]))
    assert obs.message.startswith("ReachedMaxRestarts")


def test_restarts_and_times():
    running = observe_jobset(jobset(ready=2, restarts=2, counted=2), now=T2)
    assert running.restarts == 2 and running.preemptions == 0 and running.start_time == T2
    assert observe_jobset(jobset(ready=2), previous_start_time=T0, now=T2).start_time == T0
    done = observe_jobset(jobset(conditions=[("Completed", "True")]), previous_start_time=T0, now=T2)
    assert done.completion_time == T1  # the JobSet's own transition time, not ours


@pytest.mark.parametrize("previous, phase, reason", [
    (Phase.SUCCEEDED, Phase.SUCCEEDED, None),   # ttlSecondsAfterFinished cleaned up: nothing changes
    (Phase.FAILED, Phase.FAILED, None),
    (Phase.RUNNING, Phase.FAILED, Reason.JOBSET_DELETED),
    (None, Phase.FAILED, Reason.JOBSET_DELETED),
])
def test_jobset_gone(previous, phase, reason):
    obs = observe_jobset(None, previous_phase=previous, now=T2)
    assert obs.phase == phase
    if reason is None:
        assert obs.conditions == () and obs.message is None
    else:
        assert cond_map(obs)[ConditionType.FAILED] == ("True", reason)


def test_expected_jobs_defaults_replicas_to_one():
    assert expected_jobs({"spec": {"replicatedJobs": [{"name": "a"}, {"name": "b", "replicas": 3}]}}) == 4


# ------------------------------------------------------------------- restarts and preemptions


@pytest.mark.parametrize("js, counts", [
    (jobset(), (0, 0)),
    (jobset(restarts=3, counted=1), (1, 2)),
    (jobset(restarts=3, counted=3), (3, 0)),
    # restartsCountTowardsMax is omitted when 0: with the preemption rule, all were preemptions ...
    (jobset(restarts=2), (0, 2)),
    # ... without it (an older operator's JobSet) every restart counted: the field is not needed
    (jobset(restarts=2, rules=False), (2, 0)),
])
def test_restart_counts(js, counts):
    assert restart_counts(js) == counts


def test_status_restarts_counts_failures_and_preemptions_apart():
    obs = observe_jobset(jobset(ready=2, restarts=5, counted=1), now=T2)
    status = merge_status({}, obs, now=T2)
    assert (status["restarts"], status["preemptions"]) == (1, 4)


@pytest.mark.parametrize("previous, js, cause", [
    ((0, 0), jobset(restarts=1, active=2), " after a preemption"),
    ((0, 0), jobset(restarts=1, counted=1, active=2), " after a failure"),
    ((1, 0), jobset(restarts=2, counted=1, active=2), " after a preemption"),   # the preemptions grew
    ((0, 1), jobset(restarts=2, counted=1, active=2), " after a failure"),      # the failures grew
    ((1, 1), jobset(restarts=2, counted=1, active=2), ""),   # both kinds, nothing grew: not guessed
    ((None, None), jobset(restarts=2, counted=1, active=2), ""),
    ((None, None), jobset(restarts=2, counted=2, active=2), " after a failure"),  # the only kind there is
])
def test_restarting_message_says_preemption_or_failure(previous, js, cause):
    obs = observe_jobset(js, previous_restarts=previous[0], previous_preemptions=previous[1], now=T2)
    assert obs.phase == Phase.RESTARTING
    failures, preemptions = restart_counts(js)
    assert obs.message == (f"restart {failures + preemptions}{cause}: 0/2 jobs ready "
                           f"(failures {failures}/3, preemptions {preemptions})")


def test_only_a_failure_restart_is_a_reason_to_look_for_a_data_error():
    assert not shows_failure(jobset(restarts=1, active=2), previous_restarts=0)          # preempted
    assert shows_failure(jobset(restarts=1, counted=1, active=2), previous_restarts=0)  # failed
    assert not shows_failure(jobset(restarts=2, counted=1, active=2), previous_restarts=1)
    obs = observe_data_invalid("bad", restarts=1, preemptions=2, now=T2)
    assert (obs.restarts, obs.preemptions) == (1, 2)


# ------------------------------------------------------------------------------ Kueue

QUOTA = ("couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor "
         "default, 8 more needed")


def workload(*conditions, cluster_queue=None):
    """A Kueue Workload (kueue.x-k8s.io/v1beta1); `conditions` are (type, status, reason, message)."""
    status = {"conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": []}
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "spec": {"queueName": "a3-training"},
            "status": status}


@pytest.mark.parametrize("wl, status, message", [
    (None, "False", "queued in LocalQueue a3-training: waiting for Kueue"),
    (workload(), "False", "queued in LocalQueue a3-training: waiting for Kueue"),
    (workload(("QuotaReserved", "False", "Pending", QUOTA)), "False", f"queued in LocalQueue a3-training: {QUOTA}"),
    # evicted and back in the queue: what it waits for now beats how it got there
    (workload(("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
              ("QuotaReserved", "False", "Pending", QUOTA)), "False", f"queued in LocalQueue a3-training: {QUOTA}"),
    (workload(("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
              ("QuotaReserved", "False", "Preempted", "")), "False",
     "queued in LocalQueue a3-training: Preempted to accommodate a higher priority Workload"),
    (workload(("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus"),
              ("Admitted", "False", "UnsatisfiedChecks", "The workload has not all checks ready")), "False",
     "queued in LocalQueue a3-training: The workload has not all checks ready"),
    (workload(("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", ""),
              cluster_queue="gpus"), "True", "admitted by Kueue (LocalQueue a3-training)"),
])
def test_workload_admission(wl, status, message):
    cond = workload_admission(wl, "a3-training")
    assert (cond.type, cond.status, cond.message) == (ConditionType.ADMITTED, status, message)
    assert cond.reason == (Reason.ADMITTED if status == "True" else Reason.QUEUED)


def test_a_jobset_waiting_for_kueue_is_queued_not_suspended():
    js = jobset(suspend=True, queue="a3-training")
    obs = observe_jobset(js, workload=workload(("QuotaReserved", "False", "Pending", QUOTA)), now=T2)
    assert obs.phase == Phase.QUEUED
    assert obs.message == f"queued in LocalQueue a3-training: {QUOTA}"
    conds = cond_map(obs)
    assert conds[ConditionType.SUSPENDED] == ("False", Reason.NOT_SUSPENDED)
    assert conds[ConditionType.RUNNING] == ("False", Reason.QUEUED)
    assert conds[ConditionType.ADMITTED] == ("False", Reason.QUEUED)
    assert set(ConditionType.FROM_JOBSET) <= set(conds)


def test_a_user_hold_under_a_queue_is_suspended():
    obs = observe_jobset(jobset(suspend=True, queue="a3-training"), held=True, now=T2)
    assert obs.phase == Phase.SUSPENDED
    assert cond_map(obs)[ConditionType.SUSPENDED] == ("True", Reason.SUSPEND_REQUESTED)
    assert ConditionType.ADMITTED not in cond_map(obs)


@pytest.mark.parametrize("js, phase", [
    # admitted; Kueue has not unsuspended it yet
    (jobset(suspend=True, queue="q"), Phase.PENDING),
    # unsuspended by Kueue, the JobSet controller catching up: starting, not the user's resume
    (jobset(queue="q", conditions=[("Suspended", "True")]), Phase.PENDING),
    (jobset(queue="q", ready=2), Phase.RUNNING),
])
def test_admitted_by_kueue(js, phase):
    admitted = workload(("Admitted", "True", "Admitted", ""), cluster_queue="gpus")
    obs = observe_jobset(js, workload=admitted, now=T2)
    assert obs.phase == phase
    assert cond_map(obs)[ConditionType.ADMITTED] == ("True", Reason.ADMITTED)


def test_without_a_queue_there_is_no_admitted_condition():
    assert ConditionType.ADMITTED not in cond_map(observe_jobset(jobset(ready=2), now=T2))


# -------------------------------------------------------------------------- scheduling

NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def pod(status=None, reason=None, message=""):
    conditions = [] if status is None else [
        {"type": "PodScheduled", "status": status, "reason": reason, "message": message}]
    return {"metadata": {"name": "mt-node-0-0-x", "uid": "u"}, "status": {"conditions": conditions}}


@pytest.mark.parametrize("p, verdict", [
    (pod(), None),
    (pod("False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"), None),
    (pod("False", "Unschedulable", NO_GPU), ("False", Reason.UNSCHEDULABLE, NO_GPU)),
    (pod("True"), ("True", Reason.SCHEDULED, "every pod is scheduled")),
])
def test_pod_scheduling(p, verdict):
    cond = pod_scheduling(p)
    assert (None if cond is None else (cond.status, cond.reason, cond.message)) == verdict


def test_only_news_about_a_gang_costs_a_write():
    memory, gang = UnschedulablePods(), ("team", "mt")
    waits, other = pod_scheduling(pod("False", "Unschedulable", NO_GPU)), "0/4 nodes are available: 4 Too many pods."
    bound = pod_scheduling(pod("True"))
    assert memory.update("a", gang, bound) is None              # bound at once: nothing to say
    assert memory.update("a", gang, None) is None
    assert memory.update("b", gang, waits) == waits
    assert memory.update("b", gang, waits) is None              # the same message again: no API call
    assert memory.update("c", gang, waits) is None              # another pod, same reason: said already
    assert memory.update("c", gang, Cond("Scheduled", "False", Reason.UNSCHEDULABLE, other)).message == other
    assert memory.update("b", gang, bound).message == other     # c still waits
    assert memory.update("c", gang, bound) == bound             # the whole gang has nodes
    assert memory.update("c", gang, bound) is None
    assert memory.update("d", ("team", "other"), waits) == waits  # gangs are apart


def test_unschedulable_pods_are_forgotten_and_bounded():
    memory, gang = UnschedulablePods(limit=2), ("team", "mt")
    waits = pod_scheduling(pod("False", "Unschedulable", NO_GPU))
    memory.update("a", gang, waits)
    memory.forget("a")
    assert memory.update("a", gang, waits) == waits             # news again (e.g. after a failed write)
    for uid in ("b", "c"):
        memory.update(uid, ("team", uid), waits)
    assert memory.waiting(gang) is None                         # "a", the oldest, was dropped


def test_the_message_names_an_unschedulable_pod_while_pending():
    unschedulable = Cond(ConditionType.SCHEDULED, "False", Reason.UNSCHEDULABLE, NO_GPU)
    current = {"conditions": upsert_conditions([], [unschedulable], now=T0)}
    pending = merge_status(current, observe_jobset(jobset(replicas=1), now=T1), now=T1)
    assert pending["phase"] == Phase.PENDING
    assert pending["message"] == f"starting: 0/1 jobs ready; unschedulable: {NO_GPU}"
    again = merge_status(pending, observe_jobset(jobset(replicas=1), now=T2), now=T2)
    assert status_patch(pending, again) is None                 # a fixed point: no patch
    running = merge_status(pending, observe_jobset(jobset(replicas=1, ready=1), now=T2), now=T2)
    assert running["message"] == "running: 1/1 jobs ready"
    assert condition(running, ConditionType.SCHEDULED)["status"] == "True"   # every job ready: every pod bound
    assert condition(running, ConditionType.SCHEDULED)["reason"] == Reason.SCHEDULED


def test_no_scheduled_condition_until_a_pod_waits():
    running = merge_status({}, observe_jobset(jobset(ready=2), now=T1), now=T1)
    assert condition(running, ConditionType.SCHEDULED) is None


# ---------------------------------------------------------------------------- conditions


@pytest.mark.parametrize("old_status, new_status, expected_time", [
    ("True", "True", T0),    # unchanged status keeps its transition time, even with a new message
    ("True", "False", T1),
    (None, "True", T1),      # new condition
])
def test_upsert_transition_time(old_status, new_status, expected_time):
    existing = [] if old_status is None else [
        {"type": "Running", "status": old_status, "reason": "A", "message": "old", "lastTransitionTime": T0}]
    out = upsert_conditions(existing, [Cond("Running", new_status, "B", "new")], now=T1, generation=3)
    assert out == [{"type": "Running", "status": new_status, "reason": "B", "message": "new",
                    "observedGeneration": 3, "lastTransitionTime": expected_time}]


def test_upsert_keeps_order_and_other_types():
    existing = [{"type": "Valid", "status": "True", "reason": "SpecValid", "message": "", "lastTransitionTime": T0},
                {"type": "Running", "status": "False", "reason": "X", "message": "", "lastTransitionTime": T0}]
    out = upsert_conditions(existing, [Cond("Failed", "False", "NotFinished"), Cond("Running", "True", "Y")], now=T1)
    assert [c["type"] for c in out] == ["Valid", "Running", "Failed"]
    assert out[0] == existing[0]


def test_merge_is_a_fixed_point():
    """A second observation of the same JobSet produces no patch: status is patched only on change."""
    js = jobset(ready=2)
    first = merge_status({}, observe_jobset(js, now=T1), now=T1, generation=1)
    second = merge_status(first, observe_jobset(js, previous_start_time=first.get("startTime"), now=T2),
                          now=T2, generation=1)
    assert status_patch(first, second) is None
    assert first["phase"] == Phase.RUNNING and first["startTime"] == T1
    assert condition(first, ConditionType.RUNNING)["status"] == "True"


def test_merge_leaves_foreign_fields_and_patch_is_minimal():
    current = {"phase": "Pending", "progress": {"step": 10}, "nodes": 2}
    desired = merge_status(current, observe_jobset(jobset(ready=2), now=T1), now=T1)
    patch = status_patch(current, desired)
    assert "progress" not in patch and "nodes" not in patch
    assert patch["phase"] == Phase.RUNNING


def test_completion_time_is_set_once():
    done = observe_jobset(jobset(conditions=[("Completed", "True")]), now=T2)
    status = merge_status({"completionTime": T0}, done, now=T2)
    assert status["completionTime"] == T0


# ------------------------------------------------------------------------------ messages


def test_invalid_spec_message_names_fields_and_is_bounded():
    msg = invalid_spec_message([("spec.nodes", "Input should be greater than or equal to 1"),
                                ("spec.image", "Field required")])
    assert msg.startswith("spec.nodes: ") and "spec.image: Field required" in msg
    long = invalid_spec_message([(f"spec.env[{i}]", "x" * 100) for i in range(50)])
    assert len(long) == MAX_MESSAGE and long.endswith("…")
    assert truncate("short") == "short"


# ------------------------------------------------------------------------- spec changes


@pytest.mark.parametrize("old, new, fields", [
    ({"nodes": 1}, {"nodes": 1}, []),
    ({"nodes": 1}, {"nodes": 2}, ["spec.nodes"]),
    ({"model": {"name": "a", "size": "base"}}, {"model": {"name": "b", "size": "base"}}, ["spec.model.name"]),
    ({"image": "x"}, {"image": "x", "env": [{"name": "A"}]}, ["spec.env"]),
    ({"env": [{"name": "A"}]}, {"env": [{"name": "B"}]}, ["spec.env"]),
    ({"gpusPerNode": 1, "nodes": 1}, {"gpusPerNode": 2, "nodes": 2}, ["spec.gpusPerNode", "spec.nodes"]),
])
def test_changed_fields(old, new, fields):
    assert changed_fields(old, new, prefix="spec") == fields


def test_refused_message_lists_fields():
    msg = refused_message(["spec.nodes", "spec.model.name"])
    assert "spec.nodes, spec.model.name" in msg and "spec.suspend" in msg
