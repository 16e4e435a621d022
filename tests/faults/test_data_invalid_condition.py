"""A trainer that rejects its data, on a real kube-apiserver: DataInvalid, Failed, and no restarts.

No kubelet and no JobSet controller run here, so the test plays both: it creates the trainer's
pod with the labels the JobSet and Job controllers give it, writes the container's terminated
state with the termination message `data_checks.report_data_invalid` leaves (as the kubelet
copies it from /dev/termination-log), and reports a failed job in the JobSet's status.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from rosetta_contract.exits import TERMINATION_LOG_ENV
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import ConditionType, Reason
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.preparation.data_checks import report_data_invalid
from support.cluster import REPO, Cluster, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
DATA_ERROR = "/data/wmt/train.de:17: not UTF-8 text (invalid start byte at byte 4)"


def create_training(cluster: Cluster, namespace: str, name: str) -> None:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"].update(nodes=2, gpusPerNode=0)
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)


def status(cluster: Cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}


def cond(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def jobset(cluster: Cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, name)


def play_jobset(cluster: Cluster, namespace: str, name: str, *, active: int, failed: int, restarts: int = 0) -> None:
    cluster.custom.patch_namespaced_custom_object_status(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, name, {
        # A failure's restart, as the JobSet controller counts it (a preemption's would not count).
        "status": {"restarts": restarts, "restartsCountTowardsMax": restarts, "replicatedJobsStatus": [
            {"name": "node", "ready": 0, "active": active, "succeeded": 0, "failed": failed, "suspended": 0}]}})


def failed_pod(cluster: Cluster, namespace: str, js: dict, index: int, exit_code: int, message: str) -> str:
    """Node `index`'s pod, its trainer container terminated as the kubelet reports it."""
    name = js["metadata"]["name"]
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod_name = f"{name}-node-0-{index}-x7k2p"
    labels = {**template["metadata"]["labels"], "jobset.sigs.k8s.io/jobset-name": name,
              "jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/job-index": "0",
              "job-name": f"{name}-node-0", "batch.kubernetes.io/job-completion-index": str(index)}
    container = template["spec"]["containers"][0]
    cluster.core.create_namespaced_pod(namespace, {
        "metadata": {"name": pod_name, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": container["name"], "image": container["image"],
             "terminationMessagePolicy": container["terminationMessagePolicy"]}]},
    })
    cluster.core.patch_namespaced_pod_status(pod_name, namespace, {"status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": exit_code, "reason": "Error", "message": message,
                "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:00:09Z"}},
        }],
    }})
    return pod_name


def termination_message(tmp_path, monkeypatch, error: str) -> str:
    """Exactly what the trainer leaves in the pod for this error."""
    path = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(path))
    report_data_invalid(DataError(error))
    return path.read_text()


def test_a_data_error_sets_data_invalid_and_stops_the_jobset(cluster, namespace, operator, tmp_path, monkeypatch):
    create_training(cluster, namespace, "mt")
    js = wait_for(lambda: status(cluster, namespace, "mt").get("jobSetName") and jobset(cluster, namespace, "mt"),
                  "the JobSet")
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "terminationMessagePolicy"] == "FallbackToLogsOnError"

    # torchrun exits 1 whatever its worker returned: the message, not the code, says why.
    pod = failed_pod(cluster, namespace, js, 1, 1, termination_message(tmp_path, monkeypatch, DATA_ERROR))
    play_jobset(cluster, namespace, "mt", active=0, failed=1)

    def data_invalid():
        st = status(cluster, namespace, "mt")
        return st if cond(st, ConditionType.DATA_INVALID).get("status") == "True" else None

    st = wait_for(data_invalid, "the DataInvalid condition", timeout=90)
    expected = f"pod {pod}: {DATA_ERROR}"
    assert cond(st, ConditionType.DATA_INVALID)["reason"] == Reason.DATA_CHECK_FAILED
    assert cond(st, ConditionType.DATA_INVALID)["message"] == expected
    assert st["phase"] == Phase.FAILED and st["message"] == f"data invalid: {expected}"
    assert cond(st, ConditionType.FAILED) == {**cond(st, ConditionType.FAILED), "status": "True",
                                              "reason": Reason.DATA_CHECK_FAILED, "message": expected}
    assert cond(st, ConditionType.RUNNING)["status"] == "False"
    assert st.get("completionTime")
    # A data error does not fix itself: the gang is stopped instead of restarted maxRestarts times.
    wait_for(lambda: jobset(cluster, namespace, "mt")["spec"].get("suspend") is True, "the JobSet to be suspended")
    events = cluster.core.list_namespaced_event(namespace).items
    assert any(e.reason == Reason.DATA_CHECK_FAILED and e.type == "Warning" and DATA_ERROR in e.message
               for e in events), [(e.reason, e.message) for e in events]

    # Whatever the JobSet does next (the controller suspending its jobs, an operator restart
    # resuming the training), the training stays Failed and the JobSet stays stopped.
    play_jobset(cluster, namespace, "mt", active=0, failed=0, restarts=1)
    operator.stop()
    operator.start()
    uid = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mt")["metadata"]["uid"]
    wait_for(lambda: any("Resuming is processed" in m for m in operator.messages(uid)), "the resumed training")
    after = status(cluster, namespace, "mt")
    assert after["phase"] == Phase.FAILED
    assert cond(after, ConditionType.DATA_INVALID) == cond(st, ConditionType.DATA_INVALID)
    assert jobset(cluster, namespace, "mt")["spec"]["suspend"] is True


def test_other_failures_are_left_to_the_jobset(cluster, namespace, operator):
    create_training(cluster, namespace, "mt")
    js = wait_for(lambda: status(cluster, namespace, "mt").get("jobSetName") and jobset(cluster, namespace, "mt"),
                  "the JobSet")
    # A crash whose log tail mentions the data is not a data error: only the trainer's prefix is.
    failed_pod(cluster, namespace, js, 0, 137, "RuntimeError: CUDA out of memory while reading DataInvalid: batch")
    play_jobset(cluster, namespace, "mt", active=1, failed=0, restarts=1)

    st = wait_for(lambda: status(cluster, namespace, "mt").get("phase") == Phase.RESTARTING
                  and status(cluster, namespace, "mt"), "the Restarting phase")
    assert not cond(st, ConditionType.DATA_INVALID)
    assert cond(st, ConditionType.RUNNING)["reason"] == Reason.RESTARTING
    assert jobset(cluster, namespace, "mt")["spec"]["suspend"] is False
