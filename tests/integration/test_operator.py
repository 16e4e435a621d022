"""The operator against a real kube-apiserver: what a user sees with kubectl, end to end.

Every test gets its own namespace and a fresh operator (tests/conftest.py). The JobSet
controller is played by the tests: they patch JobSet .status the way it would.
"""

from __future__ import annotations

import copy
import subprocess
import time
import urllib.request

import pytest
import yaml
from kubernetes.client.rest import ApiException

from control_plane import free_port
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import ConditionType, Reason
from support.cluster import REPO, Cluster, OperatorProcess, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


# ------------------------------------------------------------------------------ helpers


def training(name: str, nodes: int = 2, gpus: int = 1, **spec) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"].update(nodes=nodes, gpusPerNode=gpus, **spec)
    return doc


def create(cluster: Cluster, ns: str, doc: dict) -> dict:
    return cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def get(cluster: Cluster, ns: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def patch_spec(cluster: Cluster, ns: str, name: str, spec: dict) -> dict:
    return cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})


def status(cluster: Cluster, ns: str, name: str) -> dict:
    return get(cluster, ns, name).get("status") or {}


def cond(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def jobsets(cluster: Cluster, ns: str) -> list[dict]:
    return cluster.custom.list_namespaced_custom_object(JS_GROUP, JS_VERSION, ns, JS_PLURAL)["items"]


def get_jobset(cluster: Cluster, ns: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, ns, JS_PLURAL, name)


def wait_phase(cluster: Cluster, ns: str, name: str, phase: str, timeout: float = 20) -> dict:
    def check():
        st = status(cluster, ns, name)
        return st if st.get("phase") == phase else None
    try:
        return wait_for(check, f"{ns}/{name} phase {phase}", timeout)
    except pytest.fail.Exception:
        raise pytest.fail.Exception(
            f"{ns}/{name} never reached phase {phase}; status: {status(cluster, ns, name)}") from None


def play_jobset(cluster: Cluster, ns: str, name: str, *, ready: int = 0, active: int = 0, restarts: int = 0,
                conditions: tuple = ()) -> None:
    """Write JobSet status as the JobSet controller would (one replicated job, `node`); every restart
    here is a failure's (tests/cluster shows preemptions with the real controller)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {
        "restarts": restarts, "restartsCountTowardsMax": restarts,
        "replicatedJobsStatus": [{"name": "node", "ready": ready, "active": active, "succeeded": 0,
                                  "failed": 0, "suspended": 0}],
        "conditions": [{"type": t, "status": "True", "reason": reason, "message": message,
                        "lastTransitionTime": stamp} for t, reason, message in conditions],
    }}
    cluster.custom.patch_namespaced_custom_object_status(JS_GROUP, JS_VERSION, ns, JS_PLURAL, name, body)


def created(cluster: Cluster, ns: str, name: str) -> dict:
    """Wait until the operator created the JobSet and wrote its first status."""
    return wait_for(lambda: status(cluster, ns, name).get("jobSetName") and status(cluster, ns, name),
                    f"{ns}/{name} to get a JobSet")


# -------------------------------------------------------------------------------- tests


def test_create_makes_owned_configmap_and_jobset(cluster, namespace, operator):
    obj = create(cluster, namespace, training("mt", nodes=2, gpus=1))
    st = created(cluster, namespace, "mt")

    assert st["phase"] == Phase.PENDING
    assert st["observedGeneration"] == obj["metadata"]["generation"]
    assert (st["jobSetName"], st["configMapName"]) == ("mt", "mt-config")
    assert (st["nodes"], st["gpusPerNode"], st["worldSize"]) == (2, 1, 2)
    assert cond(st, ConditionType.VALID)["status"] == "True"
    assert cond(st, ConditionType.CREATED)["status"] == "True"
    assert cond(st, ConditionType.RUNNING)["reason"] == Reason.JOBS_STARTING

    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TranslationTraining", "name": "mt",
             "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    js = get_jobset(cluster, namespace, "mt")
    assert js["metadata"]["ownerReferences"] == [owner]
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["parallelism"], job["completions"]) == (2, 2)
    assert js["spec"]["suspend"] is False
    pod = job["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    cm = cluster.core.read_namespaced_config_map("mt-config", namespace)
    assert [r.to_dict() for r in cm.metadata.owner_references] == [
        {"api_version": owner["apiVersion"], "kind": owner["kind"], "name": "mt", "uid": owner["uid"],
         "controller": True, "block_owner_deletion": True}]
    assert yaml.safe_load(cm.data["training.yaml"])["spec"]["nodes"] == 2


def test_operator_restart_is_idempotent(cluster, namespace, operator):
    create(cluster, namespace, training("mt"))
    before = created(cluster, namespace, "mt")
    js_uid = get_jobset(cluster, namespace, "mt")["metadata"]["uid"]
    cm_uid = cluster.core.read_namespaced_config_map("mt-config", namespace).metadata.uid

    operator.stop()
    # While it is down: the JobSet moves on, and a second training arrives.
    play_jobset(cluster, namespace, "mt", ready=1, active=1)
    create(cluster, namespace, training("second", nodes=1))
    operator.start()

    # The restarted operator picks up both: it watches, and it creates what is missing ...
    after = wait_phase(cluster, namespace, "mt", Phase.RUNNING)
    created(cluster, namespace, "second")
    # ... and never a second JobSet or ConfigMap for what exists.
    assert sorted(j["metadata"]["name"] for j in jobsets(cluster, namespace)) == ["mt", "second"]
    assert get_jobset(cluster, namespace, "mt")["metadata"]["uid"] == js_uid
    assert cluster.core.read_namespaced_config_map("mt-config", namespace).metadata.uid == cm_uid
    for key in ("jobSetName", "configMapName", "observedGeneration", "nodes", "gpusPerNode", "worldSize"):
        assert after[key] == before[key], key
    assert cond(after, ConditionType.CREATED)["lastTransitionTime"] == \
        cond(before, ConditionType.CREATED)["lastTransitionTime"]

    # A restart with nothing new to do changes no status (kopf's own annotations aside).
    settled = status(cluster, namespace, "mt")
    operator.stop()
    operator.start()
    uid = get(cluster, namespace, "mt")["metadata"]["uid"]
    wait_for(lambda: any("Resuming is processed: 1 succeeded" in m for m in operator.messages(uid)),
             "the restarted operator to resume mt")
    assert status(cluster, namespace, "mt") == settled
    assert len(jobsets(cluster, namespace)) == 2


def test_suspend_and_resume(cluster, namespace, operator):
    create(cluster, namespace, training("mt"))
    created(cluster, namespace, "mt")
    play_jobset(cluster, namespace, "mt", ready=1, active=1)
    wait_phase(cluster, namespace, "mt", Phase.RUNNING)

    patch_spec(cluster, namespace, "mt", {"suspend": True})
    st = wait_phase(cluster, namespace, "mt", Phase.SUSPENDED)
    assert get_jobset(cluster, namespace, "mt")["spec"]["suspend"] is True
    assert cond(st, ConditionType.SUSPENDED)["status"] == "True"
    assert cond(st, ConditionType.SPEC_APPLIED)["reason"] == Reason.SPEC_IN_SYNC

    patch_spec(cluster, namespace, "mt", {"suspend": False})
    wait_for(lambda: get_jobset(cluster, namespace, "mt")["spec"]["suspend"] is False, "JobSet resumed")
    st = wait_phase(cluster, namespace, "mt", Phase.RUNNING)  # the JobSet still says its job is ready
    assert cond(st, ConditionType.SUSPENDED)["status"] == "False"
    assert len(jobsets(cluster, namespace)) == 1


def test_immutable_change_is_refused(cluster, namespace, operator):
    create(cluster, namespace, training("mt", nodes=2))
    created(cluster, namespace, "mt")
    js_before = get_jobset(cluster, namespace, "mt")

    obj = patch_spec(cluster, namespace, "mt", {"nodes": 3})
    generation = obj["metadata"]["generation"]

    def refused():
        st = status(cluster, namespace, "mt")
        c = cond(st, ConditionType.SPEC_APPLIED)
        return st if c.get("reason") == Reason.SPEC_CHANGE_REFUSED and c.get("status") == "False" else None

    st = wait_for(refused, "the nodes change to be refused")
    assert "spec.nodes" in cond(st, ConditionType.SPEC_APPLIED)["message"]
    assert st["observedGeneration"] == generation
    # Status describes what runs, not what was asked for.
    assert (st["nodes"], st["worldSize"]) == (2, 2)
    assert st["phase"] == Phase.PENDING
    js_after = get_jobset(cluster, namespace, "mt")
    assert js_after["spec"] == js_before["spec"]
    assert js_after["metadata"]["uid"] == js_before["metadata"]["uid"]
    events = wait_for(lambda: events_for(cluster, namespace, "mt", Reason.SPEC_CHANGE_REFUSED),
                      "a SpecChangeRefused event")
    assert "spec.nodes" in events[0].message

    # Reverting the change is recognised as back in sync.
    patch_spec(cluster, namespace, "mt", {"nodes": 2})
    wait_for(lambda: cond(status(cluster, namespace, "mt"), ConditionType.SPEC_APPLIED).get("status") == "True",
             "SpecApplied back to True after the revert")
    assert get_jobset(cluster, namespace, "mt")["metadata"]["resourceVersion"] == \
        js_after["metadata"]["resourceVersion"]


def events_for(cluster: Cluster, ns: str, name: str, reason: str) -> list:
    events = cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == reason and e.involved_object.kind == "TranslationTraining"]


def test_invalid_spec_fails_with_condition_and_event(cluster, namespace, operator):
    # The CRD's CEL rules stop what they can at the apiserver, naming the field ...
    with pytest.raises(ApiException) as refused:
        create(cluster, namespace, training("clash", env=[{"name": "MASTER_ADDR", "value": "10.0.0.1"}]))
    assert refused.value.status == 422 and "spec.env" in refused.value.body
    # ... and what passes the schema but not the operator's own validation (hostPath needs
    # --allow-host-path, a choice of the operator's installation) is refused by the operator.
    create(cluster, namespace, training("hostpath", nodes=1, volumes=[{"name": "scratch", "mountPath": "/scratch",
                                                                        "hostPath": {"path": "/var/tmp"}}]))
    name, field = "hostpath", "spec.volumes[0].hostPath"
    st = wait_phase(cluster, namespace, name, Phase.FAILED)
    valid = cond(st, ConditionType.VALID)
    assert (valid["status"], valid["reason"]) == ("False", Reason.INVALID_SPEC)
    assert field in valid["message"], valid
    assert cond(st, ConditionType.FAILED)["reason"] == Reason.INVALID_SPEC
    assert field in st["message"]
    assert "jobSetName" not in st
    events = wait_for(lambda: events_for(cluster, namespace, name, Reason.INVALID_SPEC),
                      f"an InvalidSpec event for {name}")
    assert events[0].type == "Warning"
    assert events[0].involved_object.uid == get(cluster, namespace, name)["metadata"]["uid"]
    assert field in events[0].message
    assert jobsets(cluster, namespace) == []
    assert cluster.configmaps(namespace) == {}  # (kube-root-ca.crt is the cluster's own)

    # The operator is still there for the next, valid resource.
    assert operator.running
    create(cluster, namespace, training("fine"))
    assert created(cluster, namespace, "fine")["phase"] == Phase.PENDING
    assert [j["metadata"]["name"] for j in jobsets(cluster, namespace)] == ["fine"]


def test_kubectl_printer_columns(cluster, namespace, operator):
    assert cluster.kubectl, "no kubectl next to the control plane binaries"
    create(cluster, namespace, training("mt", nodes=2, gpus=4))
    created(cluster, namespace, "mt")
    # What the trainer's reporter writes; the operator leaves status.progress alone.
    cluster.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "mt", {"status": {"progress": {"display": "45% 450/1000", "bleu": 27.5}}})
    out = subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "-n", namespace,
                          "get", "translationtrainings"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "NODES", "GPUS/NODE", "PROGRESS", "BLEU", "AGE"]
    assert row.split()[:7] == ["mt", "Pending", "2", "4", "45%", "450/1000", "27.5"]
    short = subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "-n", namespace,
                            "get", "tt", "-o", "name"], capture_output=True, text=True, timeout=30)
    assert short.stdout.strip() == "translationtraining.rosetta.dev/mt"


@pytest.mark.parametrize("nodes", ["two", 0])
def test_schema_rejects_bad_nodes(cluster, namespace, nodes):
    with pytest.raises(ApiException) as err:
        create(cluster, namespace, training("mt", nodes=nodes))
    assert err.value.status == 422, err.value.body
    assert "spec.nodes" in err.value.body


def test_cli_operator_serves_liveness(cluster, namespace):
    """`rosetta operator` as deployed: a process with /healthz; it reconciles and stops on SIGTERM."""
    port, metrics = free_port(), free_port()
    op = OperatorProcess(cluster, f"operator-{namespace}", "--namespace", namespace,
                         "--liveness-port", str(port), "--metrics-port", str(metrics))
    try:
        op.wait_healthy(port, timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as resp:
            assert b"rosetta_operator_reconciles" in resp.read()
        create(cluster, namespace, training("mt"))
        created(cluster, namespace, "mt")
    finally:
        code = op.stop()
    assert code == 0, op.tail()


def install_peering_crds(cluster: Cluster) -> None:
    """kopf's KopfPeering CRDs, as the Helm chart installs them (present already if another test left them)."""
    for crd in yaml.safe_load_all((REPO / "charts" / "rosetta" / "files" / "kopf-peering-crds.yaml").read_text()):
        def installed():
            try:
                cluster.install_crd(crd)
                return True
            except ApiException as exc:
                if exc.status != 409:
                    raise
            got = cluster.ext.read_custom_resource_definition(crd["metadata"]["name"])
            # 409 while a previous test's copy is still being deleted: try again once it is gone.
            return got.metadata.deletion_timestamp is None
        wait_for(installed, f"CRD {crd['metadata']['name']}", timeout=60)


def test_two_peered_operators_make_one_jobset(cluster, namespace):
    """`rosetta operator --peering NAME` x2, as the chart runs two replicas: both join, one acts."""
    install_peering_crds(cluster)
    cluster.custom.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "rosetta"}})
    ops = [OperatorProcess(cluster, f"operator-{namespace}-peer{i}", "--namespace", namespace,
                           "--peering", "rosetta", "--liveness-port", "0", "--metrics-port", "0")
           for i in range(2)]
    try:
        def peers():
            for op in ops:
                op.check_alive()
            obj = cluster.custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", "rosetta")
            return len(obj.get("status") or {}) == 2
        wait_for(peers, "both operators in the KopfPeering's status", timeout=60)

        create(cluster, namespace, training("mt"))
        created(cluster, namespace, "mt")
        time.sleep(3)  # room for a second, wrong JobSet from the standby replica
        jobsets = cluster.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")
        assert [j["metadata"]["name"] for j in jobsets["items"]] == ["mt"]
    finally:
        for op in ops:
            op.stop()
