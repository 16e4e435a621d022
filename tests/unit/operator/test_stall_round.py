"""The progress round's side of a stall (progress_round.watch_heartbeat, api_calls.end_attempt): what
it writes, posts and asks the API for under each stallAction, with the API faked and the clock the
test's."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from rosetta_operator import api_calls, progress_round
from rosetta_operator.conditions import ConditionType, Reason, condition

POD = {"metadata": {"name": "mt-node-0-0-abcde", "uid": "pod-1",
                    "ownerReferences": [{"kind": "Job", "name": "mt-node-0", "uid": "job-1"}]}}


class World:
    """The training as the API holds it, and what the round did to it."""

    def __init__(self, action: str):
        self.training = {"metadata": {"name": "mt", "namespace": "ml", "uid": "u1", "generation": 1},
                         "spec": {"faultTolerance": {"stallTimeoutSeconds": 60, "stallAction": action}},
                         "status": {"phase": "Running", "jobSetName": "mt", "restarts": 0}}
        self.warnings: list[tuple[str, str]] = []
        self.ended: list[dict] = []
        self.suspended: list[str] = []
        self.clock = 0.0

    def round(self, heartbeat: float | None, at: float, watch: progress_round.StallWatch) -> None:
        self.clock = at
        metrics = None if heartbeat is None else {"rosetta_heartbeat_timestamp_seconds": heartbeat,
                                                  "rosetta_step": 42.0, "rosetta_phase": {"train": 1.0}}
        progress_round.watch_heartbeat(None, self.training, POD, metrics, watch)


@pytest.fixture
def world(monkeypatch):
    def make(action: str) -> World:
        w = World(action)

        def write_status(_api, namespace, name, uid, compute, parent=None, **_):
            w.training["status"] = compute(w.training, w.training["status"])

        monkeypatch.setattr(progress_round, "write_status", write_status)
        monkeypatch.setattr(progress_round, "end_attempt", lambda _api, ns, pod: w.ended.append(pod) or True)
        monkeypatch.setattr(progress_round, "set_jobset_suspend", lambda _api, ns, name, on: w.suspended.append(name))
        monkeypatch.setattr(progress_round.kopf, "warn", lambda body, reason, message: w.warnings.append((reason, message)))
        monkeypatch.setattr(progress_round.time, "monotonic", lambda: w.clock)
        return w

    return make


def test_restart_says_it_once_and_ends_the_attempt_until_it_is_gone(world):
    w, watch = world("restart"), progress_round.StallWatch()
    w.round(100.0, 0, watch)
    w.round(100.0, 59, watch)
    assert (w.warnings, w.ended, condition(w.training["status"], ConditionType.STALLED)) == ([], [], None)

    w.round(None, 60, watch)  # no answer either: the clock ran on
    stalled = condition(w.training["status"], ConditionType.STALLED)
    assert (stalled["status"], stalled["reason"]) == ("True", Reason.NO_HEARTBEAT)
    assert "last logged step 42, rank 0 training" in stalled["message"]
    assert w.warnings == [(Reason.STALLED, stalled["message"])] and w.ended == [POD]
    assert w.training["status"]["stalls"] == 1 and w.training["status"]["phase"] == "Running"

    w.round(100.0, 62, watch)  # the Job was not ended yet: asked again, nothing said again
    assert len(w.warnings) == 1 and w.ended == [POD, POD] and w.training["status"]["stalls"] == 1


def test_fail_stops_the_gang_and_fails_the_training(world):
    w, watch = world("fail"), progress_round.StallWatch()
    w.round(100.0, 0, watch)
    w.round(100.0, 60, watch)
    status = w.training["status"]
    assert status["phase"] == "Failed" and condition(status, ConditionType.FAILED)["reason"] == Reason.STALLED
    assert w.suspended == ["mt"] and w.ended == [] and len(w.warnings) == 1


def test_report_only_reports_and_a_new_heartbeat_ends_the_stall(world):
    w, watch = world("report"), progress_round.StallWatch()
    w.round(100.0, 0, watch)
    w.round(100.0, 61, watch)
    assert (w.suspended, w.ended, len(w.warnings)) == ([], [], 1)
    assert w.training["status"]["phase"] == "Running"

    w.round(130.0, 70, watch)  # the trainer got unstuck by itself
    beats = condition(w.training["status"], ConditionType.STALLED)
    assert (beats["status"], beats["reason"]) == ("False", Reason.HEARTBEAT)
    assert w.training["status"]["stalls"] == 1 and len(w.warnings) == 1


def test_settings_default_when_the_spec_has_none():
    assert progress_round.stall_settings({}) == (3600, "restart")


class Batch:
    def __init__(self, status: int | None = None):
        self.status, self.patches = status, []

    def __call__(self, _api):
        return self

    def patch_namespaced_job(self, name, namespace, body):
        self.patches.append((name, namespace, body))
        if self.status:
            raise ApiException(status=self.status)


@pytest.mark.parametrize("answer, ended", [(None, True), (409, False), (404, False), (422, False)])
def test_end_attempt_patches_that_jobs_deadline_with_its_uid_as_precondition(monkeypatch, answer, ended):
    batch = Batch(answer)
    monkeypatch.setattr(api_calls.kubernetes.client, "BatchV1Api", batch)
    assert api_calls.end_attempt(None, "ml", POD) is ended
    assert batch.patches == [("mt-node-0", "ml", {"metadata": {"uid": "job-1"}, "spec": {"activeDeadlineSeconds": 1}})]


def test_end_attempt_raises_what_a_retry_may_cure(monkeypatch):
    monkeypatch.setattr(api_calls.kubernetes.client, "BatchV1Api", Batch(500))
    with pytest.raises(ApiException):
        api_calls.end_attempt(None, "ml", POD)
    assert api_calls.end_attempt(None, "ml", {"metadata": {"name": "bare"}}) is False  # no Job owns it
