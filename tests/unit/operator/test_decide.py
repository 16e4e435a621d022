"""decide.py: what a look at the JobSet and its pods (a Seen) makes of the status, and what the
operator must do once that status is written. Pure, so each case is a table row; a 409 retry is
the same decision run again on the status the winning writer left."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rosetta_contract.failures import FailureClass, termination_message
from rosetta_operator import handlers
from rosetta_operator.actions import PostEvent, Suspend
from rosetta_operator.attempts import pod_failure
from rosetta_operator.conditions import ConditionType, Reason, condition
from rosetta_operator.decide import decide_pod_failure, decide_status, owed_suspend, restart_tally
from rosetta_operator.observation import Seen
from rosetta_operator.status import status_patch, stopped_for_good
from support.handler_api import NAME, NS, jobset_event, jobset_status, memo, reconcile
from support.handler_api import training as training_of

JOBSET = "mt"
OWN_RULE_CODE = 80  # an exit code the JobSet's pod failure policy fails on by itself


def training(**spec) -> dict:
    return {"metadata": {"name": "mt", "namespace": "ml", "uid": "u1", "generation": 1}, "spec": spec}


def jobset(*, ready=0, failed=0, restarts=0, suspend=False, finished=None) -> dict:
    conditions = [{"type": finished, "status": "True"}] if finished else []
    rule = {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In",
                                                 "values": [OWN_RULE_CODE]}}
    return {"metadata": {"name": JOBSET, "uid": "js1"},
            "spec": {"suspend": suspend, "replicatedJobs": [
                {"name": "node", "replicas": 1,
                 "template": {"spec": {"podFailurePolicy": {"rules": [rule]}}}}]},
            "status": {"restarts": restarts, "conditions": conditions,
                       "replicatedJobsStatus": [{"name": "node", "ready": ready, "active": ready, "failed": failed}]}}


def pod(*, attempt=0, node="gpu-7", exit_code=1, reason=None, message=None, waiting=None) -> dict:
    terminated = {"exitCode": exit_code, **({"reason": reason} if reason else {}),
                  **({"message": message} if message else {})}
    state = {"waiting": waiting} if waiting else {"terminated": terminated}
    return {"metadata": {"name": "mt-node-0-0-x", "annotations": {
                "batch.kubernetes.io/job-completion-index": "0", "jobset.sigs.k8s.io/restart-attempt": str(attempt)}},
            "spec": {"nodeName": node, "containers": [{"name": "trainer"}]},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "image": "img:1", "state": state}]}}


OOM = pod(exit_code=137, reason="OOMKilled")
CUDA_OOM = pod(exit_code=OWN_RULE_CODE, message=termination_message(FailureClass.CUDA_OUT_OF_MEMORY, "2 GiB more"))
CRASH = pod(exit_code=1)
UNHEALTHY = pod(exit_code=1, message=termination_message(FailureClass.NODE_UNHEALTHY, "GPU 3 fails its check"))
RUNNING = {"phase": "Running", "jobSetName": JOBSET, "restarts": 0, "preemptions": 0,
           "attempts": [{"attempt": 0, "startTime": "t0"}]}


def kinds(actions) -> list[tuple]:
    return [(type(a).__name__, getattr(a, "reason", None)) for a in actions]


def retried(decide, current):
    """The decision, and the same decision run again (a 409) on the status it wrote."""
    first = decide(current)
    return first, decide(first.status)


# ------------------------------------------------------------------------------ a stop for good


@pytest.mark.parametrize(("look", "expected"), [
    pytest.param(lambda: decide_status(Seen(JOBSET, jobset(failed=1), pods=(OOM,)), training(), RUNNING, now="t1"),
                 [("Suspend", None), ("PostEvent", FailureClass.OOM_KILLED)], id="jobset event, OOMKilled"),
    pytest.param(lambda: decide_pod_failure(Seen(JOBSET, jobset()), pod_failure(OOM), training(), RUNNING, now="t1"),
                 [("Suspend", None), ("PostEvent", FailureClass.OOM_KILLED)], id="pod event, OOMKilled"),
    # The JobSet's own rule fails it on the trainer's exit code: suspending too would race that rule.
    pytest.param(lambda: decide_status(Seen(JOBSET, jobset(failed=1), pods=(CUDA_OOM,)), training(), RUNNING,
                                       now="t1"),
                 [("PostEvent", FailureClass.CUDA_OUT_OF_MEMORY)], id="the jobset's own rule"),
    pytest.param(lambda: decide_status(Seen(JOBSET, jobset(failed=1, finished="Failed"), pods=(OOM,)), training(),
                                       RUNNING, now="t1"),
                 [("PostEvent", FailureClass.OOM_KILLED)], id="a finished jobset"),
])
def test_a_stop_for_good_is_one_suspend_and_one_warning(look, expected):
    decision = look()
    assert kinds(decision.actions) == expected
    if expected[0][0] == "Suspend":
        assert decision.actions[0] == Suspend(JOBSET)
    assert all(a.event_type == "Warning" for a in decision.actions if isinstance(a, PostEvent))
    assert stopped_for_good(decision.status) and decision.status["phase"] == "Failed"
    assert decision.status["attempts"][0]["reason"] == expected[-1][1]


def test_a_409_retry_on_the_winners_status_repeats_no_action():
    seen = Seen(JOBSET, jobset(failed=1), pods=(OOM,))
    first, again = retried(lambda current: decide_status(seen, training(), current, now="t1"), RUNNING)
    assert kinds(first.actions) == [("Suspend", None), ("PostEvent", FailureClass.OOM_KILLED)]
    assert again.actions == () and status_patch(first.status, again.status) is None
    # The pod watch's writer, losing to the JobSet watch's, decides nothing either.
    pod_says = decide_pod_failure(Seen(JOBSET, jobset(failed=1)), pod_failure(OOM), training(), first.status, now="t2")
    assert pod_says.actions == () and status_patch(first.status, pod_says.status) is None


def test_an_unchanged_observation_decides_nothing():
    seen = Seen(JOBSET, jobset(ready=1))
    first, again = retried(lambda current: decide_status(seen, training(), current, now="t1"),
                           {**RUNNING, "phase": "Pending"})
    assert first.status["phase"] == "Running" and first.actions == ()
    assert again.actions == () and status_patch(first.status, again.status) is None


# ---------------------------------------------------------------------------- attempts, nodes


@pytest.mark.parametrize(("pods", "reason", "events"), [
    ([CRASH], FailureClass.ERROR, [FailureClass.ERROR]),
    # A more specific reason, reported by a later pod, replaces the vaguer one: news again.
    ([CRASH, UNHEALTHY], FailureClass.NODE_UNHEALTHY, [FailureClass.ERROR, FailureClass.NODE_UNHEALTHY]),
    # A vaguer one does not.
    ([UNHEALTHY, CRASH], FailureClass.NODE_UNHEALTHY, [FailureClass.NODE_UNHEALTHY]),
    # The kubelet keeps pulling: no attempt has ended.
    ([pod(waiting={"reason": "ImagePullBackOff"})], None, []),
])
def test_the_pod_watch_records_each_attempts_most_specific_reason_once(pods, reason, events):
    current, said = RUNNING, []
    for p in pods:
        failure = pod_failure(p)
        spec = {"failurePolicy": {"actions": {"imagePullFailed": "Restart"}}, "faultTolerance": {
            "preflight": {"maxExcludedNodes": 0}}}
        decision = decide_pod_failure(Seen(JOBSET, jobset()), failure, training(**spec), current, now="t1")
        said += [a.reason for a in decision.actions]
        current = decision.status
    assert said == events
    assert current["attempts"][0].get("reason") == reason
    assert not any(isinstance(a, Suspend) for a in decision.actions)


def test_the_jobset_watch_records_ended_attempts_and_the_running_one():
    restarted = Seen(JOBSET, jobset(ready=1, restarts=1), pods=(pod(attempt=0, exit_code=1),))
    # restartsCountTowardsMax left out: every restart counted, so the pods were asked why.
    decision = decide_status(restarted, training(), RUNNING, now="t1")
    assert decision.actions == ()
    assert [(a["attempt"], a.get("reason")) for a in decision.status["attempts"]] == [(0, "Error"), (1, None)]
    assert restart_tally(restarted.jobset, decision.status) == (1, 1)


@pytest.mark.parametrize(("excluded", "limit", "expected_nodes", "events"), [
    ([], 4, ["gpu-7"], [FailureClass.NODE_UNHEALTHY, Reason.NODE_EXCLUDED]),
    ([{"node": "gpu-1"}], 1, ["gpu-1"], [FailureClass.NODE_UNHEALTHY]),     # the limit reached
    ([{"node": "gpu-7"}], 4, ["gpu-7"], [FailureClass.NODE_UNHEALTHY]),     # kept out already
])
def test_a_node_that_fails_its_preflight_is_kept_out(excluded, limit, expected_nodes, events):
    current = {**RUNNING, "excludedNodes": excluded}
    spec = {"faultTolerance": {"preflight": {"maxExcludedNodes": limit}}}
    decision = decide_pod_failure(Seen(JOBSET, jobset()), pod_failure(UNHEALTHY), training(**spec), current, now="t1")
    assert [e["node"] for e in decision.status.get("excludedNodes") or []] == expected_nodes
    assert [a.reason for a in decision.actions] == events
    if Reason.NODE_EXCLUDED in events:
        assert decision.actions[-1].message.startswith("node gpu-7 is kept out of the next attempts: ")
    again = decide_pod_failure(Seen(JOBSET, jobset()), pod_failure(UNHEALTHY), training(**spec), decision.status,
                               now="t2")
    assert again.actions == () and status_patch(decision.status, again.status) is None


# -------------------------------------------------------------------------- a suspend still owed


@pytest.mark.parametrize(("stopped_by", "look", "owed"), [
    (OOM, jobset(restarts=1), True),                        # the suspend after the write failed: it restarted
    (OOM, jobset(failed=1), False),                         # read before the suspend landed
    (OOM, jobset(restarts=1, suspend=True), False),
    (OOM, jobset(restarts=1, finished="Failed"), False),
    (CUDA_OOM, jobset(restarts=1), False),                  # the JobSet fails by its own rule
])
def test_a_stopped_training_whose_jobset_still_runs_is_suspended_again(stopped_by, look, owed):
    stopped = decide_status(Seen(JOBSET, jobset(failed=1), pods=(stopped_by,)), training(), RUNNING, now="t1").status
    assert stopped_for_good(stopped)
    decision = decide_status(Seen(JOBSET, look), training(), stopped, now="t2")
    assert decision.actions == ((Suspend(JOBSET),) if owed else ())
    assert decision.status == stopped and owed_suspend(Seen(JOBSET, None), stopped) == ()
    assert condition(stopped, ConditionType.FAILED)["reason"] == pod_failure(stopped_by).failure_class


# ------------------------------------------------------------------- the handlers: decide, write, act


def test_the_writer_that_loses_the_stop_to_another_acts_on_nothing(api, warnings, monkeypatch):
    """The JobSet watch and the pod watch both see the OOMKilled attempt; the pod watch writes first,
    the JobSet watch's patch meets a 409 and decides again on the stopped status: one suspend, one
    Warning event, whichever writer acts."""
    m = memo(api)
    training_of(api)
    reconcile(api, m)
    js = jobset_status(api, status={"replicatedJobsStatus": [{"name": "node", "failed": 1}]})
    oom = {**OOM, "metadata": {**OOM["metadata"], "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}}}
    monkeypatch.setattr(api, "list_namespaced_pod", lambda namespace, label_selector="": SimpleNamespace(items=[oom]))
    patch_status = api.patch_namespaced_custom_object_status
    raced = []

    def first_the_pod_watch(*args):
        if not raced:
            raced.append(True)
            handlers.pods.pod_failed(m.api_client, NS, NAME, pod_failure(oom))
        return patch_status(*args)

    monkeypatch.setattr(api, "patch_namespaced_custom_object_status", first_the_pod_watch)
    api.calls.clear()
    status = jobset_event(api, m, js)["status"]
    # The pod watch's patch, then the JobSet watch's, refused (409): its retry had nothing to write.
    assert [c[0] for c in api.of("translationtrainings")].count("patch_status") == 2
    assert stopped_for_good(status) and condition(status, ConditionType.FAILED)["reason"] == FailureClass.OOM_KILLED
    assert [w["reason"] for w in warnings] == [FailureClass.OOM_KILLED]
    assert [c[3] for c in api.of("jobsets") if c[0] == "patch"] == [{"spec": {"suspend": True}}]
    assert api.get("jobsets", NAME)["spec"]["suspend"] is True
