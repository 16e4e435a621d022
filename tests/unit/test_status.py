"""JobSet state → our phase and conditions, table-driven with small JobSet builders."""

from __future__ import annotations

import pytest

from rosetta_operator.status import (
    MAX_MESSAGE, Cond, ConditionType, Observation, Phase, Reason, changed_fields, condition, expected_jobs,
    invalid_spec_message, merge_status, observe_jobset, refused_message, status_patch, truncate,
    upsert_conditions,
)

T0, T1, T2 = "2025-01-01T00:00:00Z", "2025-01-01T00:01:00Z", "2025-01-01T00:02:00Z"


def jobset(*, replicas=2, suspend=False, ready=0, active=0, succeeded=0, failed=0, restarts=0,
           conditions=()):
    """A JobSet as the API returns it; `conditions` are (type, status[, reason]) tuples."""
    status = {"restarts": restarts, "conditions": [
        {"type": c[0], "status": c[1], "reason": c[2] if len(c) > 2 else "R", "message": "",
         "lastTransitionTime": T1} for c in conditions]}
    if ready or active or succeeded or failed:
        status["replicatedJobsStatus"] = [{"name": "node", "ready": ready, "active": active,
                                           "succeeded": succeeded, "failed": failed, "suspended": 0}]
    return {"spec": {"suspend": suspend, "replicatedJobs": [{"name": "node", "replicas": replicas}]},
            "status": status}


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
    running = observe_jobset(jobset(ready=2, restarts=2), now=T2)
    assert running.restarts == 2 and running.start_time == T2
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
