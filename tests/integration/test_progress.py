"""status.progress from a live trainer endpoint, and every documented metric on the live endpoints.

The trainer side is a real rosetta_trainer.telemetry.telemetry.Telemetry (the code rank 0 runs) on a free
port. With no kubelet here, the test plays the JobSet controller and the kubelet: it creates the
Pod object rank 0 would have and gives it podIP 127.0.0.1 through the status subresource.
"""

from __future__ import annotations

import copy
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from control_plane import free_port
from rosetta_contract.metric_names import OPERATOR_METRICS, TRAINER_METRICS
from rosetta_operator import handlers, operator_metrics
from rosetta_operator.names import COMPLETION_INDEX
from rosetta_trainer.telemetry.telemetry import Telemetry
from support.cluster import REPO, Cluster, OperatorProcess, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())

STEP = {"step": 120, "total_steps": 600, "epoch": 1.5, "loss": 2.25, "lr": 5e-4, "tokens_per_s": 1500.0,
        "samples_per_s": 60.0, "grad_norm": 0.5, "mfu": None, "flops_per_s": 1e9, "step_time_s": 0.5,
        "data_wait_s": 0.01}
EVAL = {"step": 100, "split": "validation", "bleu": 27.5, "chrf": 55.0,
        "langs": {"de": {"bleu": 27.5, "chrf": 55.0, "gender": {"gender_gap_bleu": 1.0}}}}


def training_doc(name: str, port: int) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"].update(nodes=1, gpusPerNode=0)
    doc["spec"]["metrics"] = {**doc["spec"].get("metrics", {}), "port": port}
    return doc


def live_trainer(tmp_path: Path, name: str, namespace: str) -> Telemetry:
    """Rank 0's endpoint as a training leaves it after a step log, an evaluation and a checkpoint."""
    t = Telemetry(tmp_path / name, name=name, namespace=namespace, port=free_port(), tensorboard=False,
                  enabled=True)
    t.set_static(total_steps=600, world_size=1, restarts=0, resumed_from_step=0)
    t.log_step(STEP)
    t.log_eval(EVAL)
    t.set_static(best_bleu=EVAL["bleu"])  # what the loop sets after an evaluation: the primary metric's best
    t.log_checkpoint(step=100, path=f"/checkpoints/{name}/checkpoints/step-00000100", seconds=1.2,
                     size_bytes=123456)
    return t


def rank0_pod(cluster: Cluster, namespace: str, jobset: str) -> None:
    """Pod 0 of the JobSet's only job, labelled as the JobSet and Job controllers label it."""
    name = f"{jobset}-node-0-0-abcde"
    cluster.core.create_namespaced_pod(namespace, {
        "metadata": {
            "name": name,
            "labels": {"jobset.sigs.k8s.io/jobset-name": jobset, "jobset.sigs.k8s.io/replicatedjob-name": "node",
                       "jobset.sigs.k8s.io/job-index": "0", "job-name": f"{jobset}-node-0",
                       COMPLETION_INDEX: "0", "rosetta.dev/training": jobset},
            "annotations": {COMPLETION_INDEX: "0", "jobset.sigs.k8s.io/jobset-name": jobset},
        },
        "spec": {"containers": [{"name": "trainer", "image": "rosetta-trainer:test"}], "restartPolicy": "Never"},
    })
    cluster.core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})


def progress(cluster: Cluster, namespace: str, name: str) -> dict:
    obj = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return (obj.get("status") or {}).get("progress") or {}


@pytest.fixture
def fast_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by the operator's startup hook: list this fixture before `operator`."""
    monkeypatch.setenv(handlers.PROGRESS_INTERVAL_ENV, "0.5")


def test_progress_comes_from_rank0s_endpoint(cluster, namespace, fast_progress, operator, tmp_path):
    trainer = live_trainer(tmp_path, "mt", namespace)
    try:
        obj = cluster.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, training_doc("mt", trainer.port))
        wait_for(lambda: (cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mt")
                          .get("status") or {}).get("jobSetName"), "the JobSet")
        # The JobSet controller reports its one job ready: Running.
        cluster.custom.patch_namespaced_custom_object_status(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, "mt", {
            "status": {"restarts": 0, "replicatedJobsStatus": [{"name": "node", "ready": 1, "active": 1,
                                                                "succeeded": 0, "failed": 0, "suspended": 0}]}})
        rank0_pod(cluster, namespace, "mt")

        got = wait_for(lambda: progress(cluster, namespace, "mt").get("step") == 120
                       and progress(cluster, namespace, "mt"), "status.progress from the trainer")
        assert {k: v for k, v in got.items() if k != "updatedAt"} == {
            "step": 120, "totalSteps": 600, "percent": 20.0, "display": "20% 120/600", "epoch": 1.5,
            "loss": 2.25, "learningRate": 5e-4, "tokensPerSecond": 1500.0, "etaSeconds": 240.0,
            "bleu": 27.5, "bestBleu": 27.5, "lastCheckpointStep": 100,
            "lastCheckpoint": "/checkpoints/mt/checkpoints/step-00000100",
            "gender": {"de": {"gapBleu": 1.0}}, "genderGapBleu": 1.0, "activity": "training"}

        # The trainer moves on: so does the status.
        trainer.log_step({**STEP, "step": 300, "loss": 1.5})
        got = wait_for(lambda: progress(cluster, namespace, "mt").get("step") == 300
                       and progress(cluster, namespace, "mt"), "the next step in status.progress")
        assert (got["display"], got["loss"], got["etaSeconds"]) == ("50% 300/600", 1.5, 150.0)
    finally:
        trainer.close()

    # The endpoint is gone: the operator keeps the last figures and carries on.
    unreachable = prometheus_client.REGISTRY.get_sample_value(
        "rosetta_operator_progress_scrapes_total", {"outcome": "unreachable"}) or 0
    wait_for(lambda: (prometheus_client.REGISTRY.get_sample_value(
        "rosetta_operator_progress_scrapes_total", {"outcome": "unreachable"}) or 0) > unreachable,
        "a failed scrape")
    assert progress(cluster, namespace, "mt")["step"] == 300
    assert operator.running

    # The operator's own figures, read from its registry (it runs in this process).
    sample = prometheus_client.REGISTRY.get_sample_value
    assert sample("rosetta_operator_reconciles_total", {"handler": "reconcile", "outcome": "applied"}) >= 1
    assert sample("rosetta_operator_jobsets_created_total") >= 1
    assert sample("rosetta_operator_time_to_running_seconds_count") >= 1
    assert sample("rosetta_operator_trainings", {"phase": "Running"}) >= 1
    uid = obj["metadata"]["uid"]
    assert operator_metrics._PHASES.get(uid) == "Running"
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mt")
    wait_for(lambda: uid not in operator_metrics._PHASES, "the deleted training to leave the phase gauge")


def exposed(text: str) -> set[str]:
    """Every name a scrape shows, as listed in metric_names (counters with _total, info with _info)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "info":
            names.add(family.name + "_info")
    return names


APPLIED = 'rosetta_operator_reconciles_total{handler="reconcile",outcome="applied"} 1.0'


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_live_endpoints_expose_every_listed_metric(cluster, namespace, tmp_path):
    trainer = live_trainer(tmp_path, "names", namespace)
    try:
        missing = sorted(set(TRAINER_METRICS) - exposed(scrape(trainer.port)))
    finally:
        trainer.close()
    assert not missing, f"the trainer's endpoint lacks {missing}"

    # The operator as deployed (`rosetta operator --metrics-port`), after one reconcile.
    metrics, liveness = free_port(), free_port()
    op = OperatorProcess(cluster, f"operator-{namespace}", "--namespace", namespace,
                         "--liveness-port", str(liveness), "--metrics-port", str(metrics))
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, training_doc("mt", 9400))

        def reconciled():
            op.check_alive()
            try:
                text = scrape(metrics)
            except OSError:
                return None
            return APPLIED in text and text
        text = wait_for(reconciled, "the operator's metrics after a reconcile", timeout=30)
    finally:
        op.stop()
    missing = sorted(set(OPERATOR_METRICS) - exposed(text))
    assert not missing, f"the operator's endpoint lacks {missing}"
    assert "rosetta_operator_jobsets_created_total 1.0" in text
