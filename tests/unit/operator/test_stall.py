"""Rank 0's heartbeat → the Stalled verdict and status (operator/rosetta_operator/stall.py), table-driven:
the clock is the test's."""

from __future__ import annotations

import pytest
from test_status import jobset

from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator import stall as sl
from rosetta_operator.conditions import ConditionType, Reason, condition
from rosetta_operator.crd_status import status_schema
from rosetta_operator.jobset_status import observe_jobset
from rosetta_operator.status import is_stalled, stopped_for_good

TIMEOUT = 60
NOW = "2026-01-01T00:00:00Z"
POD, NEW_POD = "uid-a", "uid-b"


def beat(value: float, step: int | None = 10, activity: str | None = "training") -> sl.Beat:
    return sl.Beat(value, step, activity)


# Each story: rounds of (time, rank 0's pod uid or None, what the scrape said or None), then the verdict
# expected at the last round's time: seconds without a new heartbeat, or None.
@pytest.mark.parametrize("rounds, stalled_for", [
    pytest.param([(0, POD, beat(1)), (30, POD, beat(2)), (60, POD, beat(3))], None, id="beating"),
    pytest.param([(0, POD, beat(1)), (30, POD, beat(1)), (59, POD, beat(1))], None, id="under the timeout"),
    pytest.param([(0, POD, beat(1)), (30, POD, beat(1)), (60, POD, beat(1))], 60, id="the same heartbeat"),
    pytest.param([(0, POD, beat(1)), (30, POD, None), (70, POD, None)], 70, id="no answer is no heartbeat"),
    pytest.param([(0, POD, beat(1)), (50, POD, beat(2)), (100, POD, beat(2))], None,
                 id="counted from the round that saw the newest value"),
    pytest.param([(0, POD, beat(1)), (50, POD, beat(2)), (110, POD, beat(2))], 60, id="then stalled"),
    pytest.param([(0, POD, None), (100, POD, None), (200, POD, None)], None,
                 id="never beat: still starting, never stalled"),
    pytest.param([(0, POD, beat(1)), (100, NEW_POD, None), (200, NEW_POD, None)], None,
                 id="a new rank 0 pod starts a new clock"),
    pytest.param([(0, POD, beat(1)), (50, None, None), (100, POD, beat(1)), (120, POD, beat(1))], None,
                 id="no rank 0 pod forgets"),
    pytest.param([(0, NEW_POD, beat(5)), (30, NEW_POD, beat(5)), (61, NEW_POD, beat(5))], 61,
                 id="a restarted gang that hangs at once"),
])
def test_stall_clock(rounds, stalled_for):
    watch = None
    for at, pod, said in rounds:
        watch = sl.follow(watch, pod, said, at)
    found = sl.stalled(watch, rounds[-1][0], TIMEOUT)
    assert (None if found is None else found.seconds) == stalled_for


def test_the_stall_remembers_where_rank_0_was():
    watch = sl.follow(None, POD, beat(1, step=400, activity="training"), 0)
    watch = sl.follow(watch, POD, beat(1, step=420, activity="evaluating"), 10)
    found = sl.stalled(watch, 70, TIMEOUT)
    assert (found.step, found.activity) == (420, "evaluating")


def test_beat_from_metrics():
    text = """
rosetta_step{training="mt",namespace="team"} 420.0
rosetta_heartbeat_timestamp_seconds{training="mt",namespace="team"} 1.7e9
rosetta_phase{training="mt",namespace="team",phase="train"} 0.0
rosetta_phase{training="mt",namespace="team",phase="evaluate"} 1.0
rosetta_phase{training="mt",namespace="team",phase="checkpoint"} 0.0
"""
    assert sl.beat_from(pr.parse_metrics(text)) == sl.Beat(1.7e9, 420, "evaluating")
    # A trainer of a release before the heartbeat, or a step not logged yet.
    assert sl.beat_from(pr.parse_metrics('rosetta_step{training="mt",namespace="team"} 3.0\n')) is None
    assert sl.beat_from({"rosetta_heartbeat_timestamp_seconds": 5.0}) == sl.Beat(5.0, None, None)


def stalled_status() -> dict:
    return {"phase": Phase.RUNNING, "restarts": 0, "conditions": [
        {"type": "Running", "status": "True", "reason": "AllJobsReady"},
        {"type": ConditionType.STALLED, "status": "True", "reason": Reason.NO_HEARTBEAT, "message": "m"}]}


@pytest.mark.parametrize("status, watch, at, expected", [
    pytest.param({}, sl.Watch(POD, 1.0, 0.0, 420, "training"), 60.0,
                 sl.Verdict(stalled="no heartbeat from rank 0 for 60 s (faultTolerance.stallTimeoutSeconds); last "
                                    "logged step 420, rank 0 training: the gang is restarted from the last checkpoint "
                                    "(stallAction: restart)"), id="stalled"),
    pytest.param({}, sl.Watch(POD, 1.0, 0.0), 60.0,
                 sl.Verdict(stalled="no heartbeat from rank 0 for 60 s (faultTolerance.stallTimeoutSeconds); no step "
                                    "logged: the gang is restarted from the last checkpoint (stallAction: restart)"),
                 id="before any logged step"),
    pytest.param({}, sl.Watch(POD, 1.0, 0.0, moved=True), 30.0, sl.Verdict(), id="beating, never stalled"),
    pytest.param(stalled_status(), sl.Watch(NEW_POD, 7.0, 50.0, 430, moved=True), 60.0,
                 sl.Verdict(recovered="rank 0 beats again (last logged step 430)"), id="beats again"),
    # After an operator restart the first heartbeat seen may be the stalled one: not a recovery.
    pytest.param(stalled_status(), sl.Watch(POD, 1.0, 50.0, 420), 60.0, sl.Verdict(), id="one value is not a beat"),
])
def test_verdict(status, watch, at, expected):
    assert sl.verdict(status, watch, at, TIMEOUT, "restart") == expected


@pytest.mark.parametrize("action, phase, failed", [
    ("restart", Phase.RUNNING, None),
    ("report", Phase.RUNNING, None),
    ("fail", Phase.FAILED, ("True", Reason.STALLED)),
])
def test_a_stall_in_the_status(action, phase, failed):
    running = {"phase": Phase.RUNNING, "restarts": 1, "stalls": 1, "startTime": NOW,
               "conditions": [{"type": "Running", "status": "True", "reason": "AllJobsReady"}]}
    found = sl.Verdict(stalled=sl.stall_message(sl.Stall(61.0, 420, "checkpointing"), TIMEOUT, action))
    status = sl.stall_status(running, found, action=action, now=NOW, generation=3)
    stalled = condition(status, ConditionType.STALLED)
    assert (stalled["status"], stalled["reason"], stalled["observedGeneration"]) == ("True", Reason.NO_HEARTBEAT, 3)
    assert "rank 0 checkpointing" in stalled["message"] and f"(stallAction: {action})" in stalled["message"]
    assert status["stalls"] == 2 and status["restarts"] == 1
    assert status["phase"] == phase
    cond = condition(status, ConditionType.FAILED)
    assert (None if cond is None else (cond["status"], cond["reason"])) == failed
    assert stopped_for_good(status) == (action == "fail")
    # The same stall seen again writes nothing new: no second count, no second transition.
    again = sl.stall_status(status, found, action=action, now="2026-01-01T00:05:00Z", generation=3)
    assert again == status
    assert set(status) <= set(status_schema()["properties"])


def test_recovery_turns_the_condition_false_and_keeps_the_count():
    status = {**stalled_status(), "stalls": 1}
    after = sl.stall_status(status, sl.Verdict(recovered="rank 0 beats again"), action="restart", now=NOW)
    assert not is_stalled(after) and after["stalls"] == 1
    assert (condition(after, ConditionType.STALLED)["reason"], condition(after, ConditionType.STALLED)["message"]) \
        == (Reason.HEARTBEAT, "rank 0 beats again")
    assert sl.stall_status({}, sl.Verdict(recovered="x"), action="restart", now=NOW) == {}  # never stalled


def test_a_restart_while_stalled_is_a_restart_after_a_stall():
    restarting = jobset(restarts=1, counted=1, active=2)
    assert observe_jobset(restarting, previous_restarts=0, stalled=True).message.startswith("restart 1 after a stall:")
    assert observe_jobset(restarting, previous_restarts=0).message.startswith("restart 1 after a failure:")
    # A preemption is a preemption, stalled or not.
    assert observe_jobset(jobset(restarts=1, active=2), stalled=True).message.startswith("restart 1 after a preemption")
