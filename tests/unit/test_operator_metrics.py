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
