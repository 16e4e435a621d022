"""The operator's own metrics, without a cluster: handler counting and the phase gauge."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from rosetta_contract.metric_names import OPERATOR_METRICS
from rosetta_operator import operator_metrics


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_instrumented_counts_outcomes_errors_and_time():
    @operator_metrics.instrumented("unit")
    def handler(fail: bool = False, **_):
        if fail:
            raise RuntimeError("boom")
        operator_metrics.record_outcome("applied")

    handler()
    with pytest.raises(RuntimeError):
        handler(fail=True)
    assert value("rosetta_operator_reconciles_total", handler="unit", outcome="applied") == 1
    assert value("rosetta_operator_reconciles_total", handler="unit", outcome="error") == 1
    assert value("rosetta_operator_reconcile_errors_total", handler="unit") == 1
    assert value("rosetta_operator_reconcile_seconds_count", handler="unit") == 2


def test_a_planned_wait_is_counted_under_its_outcome_not_as_an_error():
    import kopf

    @operator_metrics.instrumented("unit-wait")
    def handler(**_):
        raise operator_metrics.Wait("quota is full", "quota", delay=30)

    with pytest.raises(kopf.TemporaryError):
        handler()
    assert value("rosetta_operator_reconciles_total", handler="unit-wait", outcome="quota") == 1
    assert value("rosetta_operator_reconciles_total", handler="unit-wait", outcome="error") == 0
    assert value("rosetta_operator_reconcile_errors_total", handler="unit-wait") == 0


def test_phase_gauge_follows_transitions_and_deletions():
    operator_metrics._PHASES.clear()

    def event(uid, phase=None, type_="MODIFIED"):
        body = {"status": {"phase": phase}} if phase else {}
        operator_metrics.count_phases(event={"type": type_}, body=body, uid=uid)

    event("a")
    event("b", "Running")
    assert value("rosetta_operator_trainings", phase="Unknown") == 1
    event("a", "Pending")
    event("a", "Running")
    assert value("rosetta_operator_trainings", phase="Running") == 2
    assert value("rosetta_operator_trainings", phase="Pending") == 0
    event("b", "Running", type_="DELETED")
    event("a", "Succeeded")
    assert value("rosetta_operator_trainings", phase="Running") == 0
    assert value("rosetta_operator_trainings", phase="Succeeded") == 1
    operator_metrics._PHASES.clear()


def test_time_to_running_is_measured_from_creation():
    before = value("rosetta_operator_time_to_running_seconds_sum")
    operator_metrics.observe_time_to_running("2026-01-01T00:00:00Z", "2026-01-01T00:02:30Z")
    operator_metrics.observe_time_to_running(None, "2026-01-01T00:02:30Z")  # unknown creation: skipped
    assert value("rosetta_operator_time_to_running_seconds_sum") - before == 150


def test_listed_names_are_registered():
    registered = {name for family in REGISTRY.collect() for name in
                  ({family.name, family.name + "_total"} if family.type == "counter" else {family.name})}
    assert set(OPERATOR_METRICS) <= registered


def test_restart_gauges_follow_each_training_and_go_with_it():
    def event(uid, type_="MODIFIED", **body):
        operator_metrics.count_phases(event={"type": type_}, body={"metadata": {"name": uid, "namespace": "ml"}, **body},
                              uid=uid)

    event("r1")
    assert value("rosetta_operator_training_restarts", namespace="ml", training="r1") == 0
    assert value("rosetta_operator_training_max_restarts", namespace="ml", training="r1") == 3  # the spec's default
    event("r1", spec={"failurePolicy": {"maxRestarts": 5}}, status={"phase": "Restarting", "restarts": 2})
    assert value("rosetta_operator_training_restarts", namespace="ml", training="r1") == 2
    assert value("rosetta_operator_training_max_restarts", namespace="ml", training="r1") == 5
    event("r1", type_="DELETED")
    assert REGISTRY.get_sample_value("rosetta_operator_training_restarts", {"namespace": "ml", "training": "r1"}) \
        is None
    operator_metrics._PHASES.clear()


def test_training_phase_gauge_is_one_series_per_training_that_follows_its_phase():
    def event(name, namespace="ml", type_="MODIFIED", phase=None):
        body = {"metadata": {"name": name, "namespace": namespace}}
        if phase:
            body["status"] = {"phase": phase}
        operator_metrics.count_phases(event={"type": type_}, body=body, uid=f"{namespace}/{name}")

    def phases(name, namespace="ml"):
        return {s.labels["phase"]: s.value for family in REGISTRY.collect()
                if family.name == "rosetta_operator_training_phase" for s in family.samples
                if s.labels["training"] == name and s.labels["namespace"] == namespace}

    event("p1")
    assert phases("p1") == {"Unknown": 1}
    event("p1", phase="Running")
    assert phases("p1") == {"Running": 1}
    event("p1", phase="Failed")
    event("p1", namespace="nlp", phase="Failed")  # the same name elsewhere is another training
    assert phases("p1") == {"Failed": 1} and phases("p1", "nlp") == {"Failed": 1}
    event("p1", type_="DELETED", phase="Failed")
    assert phases("p1") == {} and phases("p1", "nlp") == {"Failed": 1}
    operator_metrics.reset_phase_gauges()
    assert phases("p1", "nlp") == {}


# ------------------------------------------------------------- attempts ended, nodes excluded


def ended(reason: str) -> float:
    return value("rosetta_operator_attempts_ended_total", reason=reason)


def excluded(node: str) -> float:
    return value("rosetta_operator_nodes_excluded_total", node=node)


def test_every_reason_is_exported_at_zero_from_the_start():
    """An alert's increase() sees the first attempt of a class only if the series was there before it."""
    reasons = {s.labels["reason"] for family in REGISTRY.collect()
               if family.name == "rosetta_operator_attempts_ended" for s in family.samples
               if s.name == "rosetta_operator_attempts_ended_total"}
    assert reasons >= {"DataInvalid", "ConfigError", "NonFinite", "CudaOutOfMemory", "CollectiveTimeout", "OOMKilled",
                       "ImagePullFailed", "NodeUnhealthy", "NodeLost", "Preempted", "Stalled", "Error", "Succeeded"}


def test_an_attempt_is_counted_when_it_gets_a_reason_and_under_a_more_specific_one():
    before = {r: ended(r) for r in ("Error", "OOMKilled", "Succeeded", "Preempted")}
    started = {"attempts": [{"attempt": 0, "startTime": "t0"}]}
    error = {"attempts": [{"attempt": 0, "startTime": "t0", "endTime": "t1", "reason": "Error"},
                          {"attempt": 1, "startTime": "t1"}]}
    oom = {"attempts": [{"attempt": 0, "startTime": "t0", "endTime": "t1", "reason": "OOMKilled", "pod": "p"},
                        {"attempt": 1, "startTime": "t1"}]}
    operator_metrics.record_status_change({}, started)          # begun, not ended: nothing
    operator_metrics.record_status_change(started, error)       # the JobSet restarted: Error
    operator_metrics.record_status_change(error, error)         # the same status again: nothing
    operator_metrics.record_status_change(error, oom)           # the OOM-killed pod reports: OOMKilled too
    operator_metrics.record_status_change(oom, {**oom, "phase": "Running"})  # another field: nothing
    # An attempt that ends in the same write that first records it, and a preemption beside it.
    done = {"attempts": [*oom["attempts"][:1], {"attempt": 1, "startTime": "t1", "endTime": "t2", "reason": "Preempted"},
                         {"attempt": 2, "startTime": "t2", "endTime": "t3", "reason": "Succeeded"}]}
    operator_metrics.record_status_change(oom, done)
    assert {r: ended(r) - before[r] for r in before} == {"Error": 1, "OOMKilled": 1, "Succeeded": 1, "Preempted": 1}


def test_an_attempt_dropped_from_the_bounded_list_is_not_counted_again():
    old = {"attempts": [{"attempt": n, "reason": "Error"} for n in range(20)]}
    new = {"attempts": [*old["attempts"][1:], {"attempt": 20, "reason": "Error"}]}
    before = ended("Error")
    operator_metrics.record_status_change(old, new)
    assert ended("Error") - before == 1


def test_each_newly_excluded_node_is_counted_once():
    before = {n: excluded(n) for n in ("unit-gpu-1", "unit-gpu-2", "unit-gpu-3")}
    one = {"excludedNodes": [{"node": "unit-gpu-1", "reason": "NodeUnhealthy"}]}
    two = {"excludedNodes": [*one["excludedNodes"], {"node": "unit-gpu-2", "reason": "NodeUnhealthy"}]}
    operator_metrics.record_status_change({}, one)
    operator_metrics.record_status_change(one, two)      # gpu-1 was there already
    operator_metrics.record_status_change(two, {**two, "phase": "Running"})
    operator_metrics.record_status_change({"excludedNodes": None}, {"excludedNodes": []})
    # Another training that excludes gpu-1 as well: one more exclusion of that node.
    operator_metrics.record_status_change({}, {"excludedNodes": [{"node": "unit-gpu-1"}]})
    assert {n: excluded(n) - before[n] for n in before} == {"unit-gpu-1": 2, "unit-gpu-2": 1, "unit-gpu-3": 0}


def test_write_status_counts_what_the_accepted_patch_told(monkeypatch):
    """The hook in api_calls.write_status: counted once, after the patch that the API accepted; a
    conflict that makes it read and compute again counts nothing twice."""
    from kubernetes.client.exceptions import ApiException

    from rosetta_operator import api_calls

    meta = {"name": "mt", "namespace": "ml", "uid": "u1", "resourceVersion": "1"}
    stored = {"metadata": meta, "status": {"attempts": [{"attempt": 0, "startTime": "t0"}]}}
    answers = [ApiException(status=409), None]

    class Custom:
        def __init__(self, _api):
            pass

        def patch_namespaced_custom_object_status(self, *args):
            answer = answers.pop(0)
            if answer is not None:
                raise answer

        def get_namespaced_custom_object(self, *args):
            return stored

    def compute(parent, current):
        return {**current, "attempts": [{"attempt": 0, "startTime": "t0", "endTime": "t1", "reason": "NodeUnhealthy"}],
                "excludedNodes": [{"node": "unit-gpu-9", "reason": "NodeUnhealthy"}]}

    monkeypatch.setattr(api_calls.kubernetes.client, "CustomObjectsApi", Custom)
    before = ended("NodeUnhealthy"), excluded("unit-gpu-9")
    api_calls.write_status(None, "ml", "mt", "u1", compute, parent=stored)
    assert answers == []
    assert (ended("NodeUnhealthy") - before[0], excluded("unit-gpu-9") - before[1]) == (1, 1)


def test_excluded_nodes_gauge_follows_the_training_and_goes_with_it():
    def event(type_="MODIFIED", **status):
        operator_metrics.count_phases(event={"type": type_}, body={
            "metadata": {"name": "x1", "namespace": "ml"}, "status": status}, uid="x1")

    event(phase="Running")
    assert value("rosetta_operator_training_excluded_nodes", namespace="ml", training="x1") == 0
    event(phase="Running", excludedNodes=[{"node": "gpu-1"}, {"node": "gpu-2"}])
    assert value("rosetta_operator_training_excluded_nodes", namespace="ml", training="x1") == 2
    event(type_="DELETED")
    assert REGISTRY.get_sample_value("rosetta_operator_training_excluded_nodes",
                                     {"namespace": "ml", "training": "x1"}) is None
    operator_metrics._PHASES.clear()
