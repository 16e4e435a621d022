"""Why an attempt ended, read from its pods (attempts.py), and the status.attempts record."""

from __future__ import annotations

import pytest

from rosetta_contract.failures import CLASS_EXITS, FailureClass, parse_termination_message, termination_message
from rosetta_operator.attempts import (
    MAX_ATTEMPTS,
    attempt_failure,
    pod_failure,
    record_end,
    record_start,
)


def pod(name="mt-node-0-1", *, rank=1, attempt=0, terminated=None, waiting=None, disruption=None, phase="Failed",
        memory="2Gi"):
    status = {"phase": phase, "containerStatuses": [{"name": "trainer", "image": "registry.example/rosetta:1",
                                                     "state": {}}]}
    if terminated is not None:
        status["containerStatuses"][0]["state"] = {"terminated": terminated}
    if waiting is not None:
        status["containerStatuses"][0]["state"] = {"waiting": waiting}
    if disruption is not None:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                 "message": "taken"}]
    return {"metadata": {"name": name, "annotations": {"batch.kubernetes.io/job-completion-index": str(rank),
                                                       "jobset.sigs.k8s.io/restart-attempt": str(attempt)}},
            "spec": {"nodeName": "gpu-7", "containers": [{"name": "trainer",
                                                          "resources": {"limits": {"memory": memory}}}]},
            "status": status}


def test_a_termination_message_round_trips_as_one_printable_line():
    message = termination_message(FailureClass.CUDA_OUT_OF_MEMORY, "tried to allocate\n2 GiB\x1b[31m")
    assert message == "CudaOutOfMemory: tried to allocate 2 GiB [31m"
    assert parse_termination_message(message) == (FailureClass.CUDA_OUT_OF_MEMORY, "tried to allocate 2 GiB [31m")
    # A log tail that happens to contain a colon is no class.
    assert parse_termination_message("Traceback: boom") is None
    assert set(CLASS_EXITS) >= {FailureClass.DATA_INVALID, FailureClass.CUDA_OUT_OF_MEMORY}


@pytest.mark.parametrize("cls", sorted(CLASS_EXITS))
def test_the_trainers_message_names_the_class_with_pod_node_and_exit_code(cls):
    failure = pod_failure(pod(terminated={"exitCode": CLASS_EXITS[cls], "reason": "Error",
                                          "message": termination_message(cls, "what went wrong")}))
    assert failure is not None and failure.failure_class == cls
    assert failure.message == "pod mt-node-0-1 on node gpu-7: what went wrong"
    assert (failure.pod, failure.node, failure.node_rank, failure.attempt, failure.exit_code) == \
        ("mt-node-0-1", "gpu-7", 1, 0, CLASS_EXITS[cls])


def test_oomkilled_names_the_memory_limit_and_what_to_change():
    failure = pod_failure(pod(terminated={"exitCode": 137, "reason": "OOMKilled"}, memory="12Gi"))
    assert failure is not None and failure.failure_class == FailureClass.OOM_KILLED
    assert "memory limit (12Gi, spec.resources.memory)" in failure.message and failure.exit_code == 137


def test_a_launcher_exit_code_without_its_message_still_classifies():
    failure = pod_failure(pod(terminated={"exitCode": 80, "reason": "Error", "message": "some log tail"}))
    assert failure is not None and failure.failure_class == FailureClass.CUDA_OUT_OF_MEMORY


@pytest.mark.parametrize("reason, cls", [("PreemptionByScheduler", FailureClass.PREEMPTED),
                                         ("EvictionByEvictionAPI", FailureClass.PREEMPTED),
                                         ("DeletionByPodGC", FailureClass.NODE_LOST),
                                         ("DeletionByTaintManager", FailureClass.NODE_LOST)])
def test_disruption_reasons_tell_a_lost_node_from_a_preemption(reason, cls):
    failure = pod_failure(pod(terminated={"exitCode": 143, "reason": "Error"}, disruption=reason))
    assert failure is not None and failure.failure_class == cls and reason in failure.message


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled_names_the_image(reason):
    failure = pod_failure(pod(phase="Pending", waiting={"reason": reason, "message": "not found"}))
    assert failure is not None and failure.failure_class == FailureClass.IMAGE_PULL_FAILED
    assert "registry.example/rosetta:1" in failure.message and "not found" in failure.message


def test_a_healthy_or_finished_pod_is_no_failure():
    assert pod_failure(pod(phase="Running")) is None
    assert pod_failure(pod(phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"})) is None
    assert pod_failure(pod(phase="Pending", waiting={"reason": "ContainerCreating"})) is None


def test_any_other_crash_is_an_error_with_the_log_tail():
    failure = pod_failure(pod(terminated={"exitCode": 1, "reason": "Error", "message": "x" * 2000 + " KeyError"}))
    assert failure is not None and failure.failure_class == FailureClass.ERROR
    assert failure.message.endswith("KeyError") and len(failure.message) <= 1024


def test_the_most_specific_pod_wins_over_its_peers_symptoms():
    oom = pod("mt-node-0-1", rank=1, terminated={"exitCode": 137, "reason": "OOMKilled"})
    timeout = pod("mt-node-0-0", rank=0, terminated={
        "exitCode": 75, "message": termination_message(FailureClass.COLLECTIVE_TIMEOUT, "rank 1 never came")})
    crashed = pod("mt-node-0-2", rank=2, terminated={"exitCode": 1, "reason": "Error"})
    failure = attempt_failure([crashed, timeout, oom])
    assert failure is not None and (failure.failure_class, failure.pod) == (FailureClass.OOM_KILLED, "mt-node-0-1")
    # Pods of another attempt do not speak for this one.
    assert attempt_failure([oom], attempt=1) is None


def test_attempts_record_start_end_and_a_more_specific_reason_later():
    attempts = record_start([], 0, now="t0")
    assert attempts == [{"attempt": 0, "startTime": "t0"}]
    attempts = record_end(attempts, 0, now="t1", reason=FailureClass.ERROR, last_step=40)
    assert attempts[0] == {"attempt": 0, "startTime": "t0", "endTime": "t1", "reason": "Error", "lastStep": 40}
    oom = pod_failure(pod(terminated={"exitCode": 137, "reason": "OOMKilled"}))
    attempts = record_end(attempts, 0, now="t2", reason=FailureClass.OOM_KILLED, failure=oom)
    assert attempts[0]["reason"] == "OOMKilled" and attempts[0]["endTime"] == "t1" and attempts[0]["node"] == "gpu-7"
    # A vaguer word afterwards does not replace it.
    attempts = record_end(attempts, 0, now="t3", reason=FailureClass.ERROR)
    assert attempts[0]["reason"] == "OOMKilled"
    assert record_start(attempts, 1, now="t4")[0] == attempts[0]  # the next attempt leaves it as it was


def test_attempts_keep_the_newest_only():
    attempts: list = []
    for n in range(MAX_ATTEMPTS + 5):
        attempts = record_end(attempts, n, now=f"t{n}", reason=FailureClass.PREEMPTED)
    assert len(attempts) == MAX_ATTEMPTS and attempts[0]["attempt"] == 5 and attempts[-1]["attempt"] == MAX_ATTEMPTS + 4


def test_a_pods_failure_is_news_once_per_class():
    from rosetta_operator.event_memory import Decisions

    seen = Decisions(limit=2)  # what the pod watch keeps (memo.failed_pods)
    oom = pod_failure(pod(terminated={"exitCode": 137, "reason": "OOMKilled"}))
    assert seen.changed("a", oom.failure_class) and not seen.changed("a", oom.failure_class)
    assert seen.changed("b", oom.failure_class) and seen.changed("c", oom.failure_class)
    assert seen.changed("a", oom.failure_class)  # forgotten, the oldest, past the limit


def jobset(restarts=0, counted=None):
    status = {"restarts": restarts}
    if counted is not None:
        status["restartsCountTowardsMax"] = counted
    return {"spec": {"failurePolicy": {"rules": [{"action": "RestartJobSetAndIgnoreMaxRestarts"}]}}, "status": status}


def test_restarts_whose_pods_were_gone_are_recorded_by_what_the_counters_say():
    from rosetta_operator.decide import track_attempts

    current = {"attempts": [{"attempt": 0, "startTime": "t0"}], "restarts": 0, "preemptions": 0,
               "progress": {"step": 120}}
    # One free restart: a preemption, though no pod was left to say so.
    attempts = track_attempts(current, jobset(1, counted=0), "Running", None, stalled=False, now="t1")
    assert attempts == [{"attempt": 0, "startTime": "t0", "endTime": "t1", "reason": "Preempted", "lastStep": 120},
                        {"attempt": 1, "startTime": "t1"}]
    # A counted restart while Stalled: the operator's own end of the stalled attempt.
    attempts = track_attempts(current, jobset(1, counted=1), "Restarting", None, stalled=True, now="t1")
    assert attempts[0]["reason"] == "Stalled" and len(attempts) == 1
    # A failed JobSet ends its last attempt with the pods' reason.
    oom = pod_failure(pod(attempt=0, terminated={"exitCode": 137, "reason": "OOMKilled"}))
    attempts = track_attempts(current, jobset(0), "Failed", oom, stalled=False, now="t2")
    assert attempts[0]["reason"] == "OOMKilled" and attempts[0]["endTime"] == "t2"


def test_the_jobset_fails_by_its_own_rule_only_on_the_codes_its_pod_failure_policy_names():
    from test_render import build

    from rosetta_operator.decide import fails_by_its_own_rule

    rendered = build().jobset
    cuda = pod_failure(pod(terminated={"exitCode": 80, "message": termination_message("CudaOutOfMemory", "x")}))
    oom = pod_failure(pod(terminated={"exitCode": 137, "reason": "OOMKilled"}))
    assert fails_by_its_own_rule(rendered, cuda) and not fails_by_its_own_rule(rendered, oom)


def test_decisions_say_news_once_however_many_threads_report_it():
    from concurrent.futures import ThreadPoolExecutor

    from rosetta_operator.event_memory import Decisions

    said = Decisions(limit=2)  # as memo.workload_decisions, from kopf's worker threads
    with ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(lambda _: said.changed("uid-1", "ImagePullFailed"), range(16)))
    assert firsts.count(True) == 1
    assert said.changed("uid-1", "OOMKilled") and said.changed("uid-2", "ImagePullFailed")
    assert said.changed("uid-3", "ImagePullFailed") and said.changed("uid-1", "OOMKilled")  # forgotten past the limit
