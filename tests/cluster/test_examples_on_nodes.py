"""Every example in manifests/examples, applied with kubectl as a user would, taken by the real
controllers as far as a cluster without GPUs can take it: the JobSet webhook defaults and admits the
JobSet, the JobSet controller makes the Job, the Job controller the pods, the scheduler binds each pod
to a node of the instance type its profile or nodeSelector asks for, and kwok runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from workloads import in_namespace, jobset, kubectl, kueue_queue, provision, running_pods, status, training_doc

from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))


def gpus_of(pod_spec) -> int:
    return int((pod_spec.containers[0].resources.requests or {}).get("nvidia.com/gpu", 0))


def tolerates(pod_spec, taint) -> bool:
    return any(t.operator == "Exists" and t.key in (None, taint.key) and t.effect in (None, taint.effect)
               or (t.key == taint.key and t.value == taint.value and t.effect in (None, taint.effect))
               for t in pod_spec.tolerations or [])


def expected_nodes(cluster, pod_spec) -> set[str]:
    """The nodes whose labels satisfy the pod's nodeSelector, whose taints it tolerates, and that
    have as many GPUs as it asks for."""
    wanted = pod_spec.node_selector or {}
    nodes = set()
    for node in cluster.core.list_node().items:
        labels = node.metadata.labels or {}
        if not all(labels.get(k) == v for k, v in wanted.items()):
            continue
        if int(node.status.allocatable.get("nvidia.com/gpu", 0)) < gpus_of(pod_spec):
            continue
        if all(tolerates(pod_spec, t) for t in node.spec.taints or [] if t.effect == "NoSchedule"):
            nodes.add(node.metadata.name)
    return nodes


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_on_nodes_of_its_profile(live_cluster, live_namespace, live_operator, path: Path):
    doc = training_doc(path)
    name = doc["metadata"]["name"]
    doc = in_namespace(doc, live_namespace)
    provision(live_cluster, live_namespace, doc)
    queue = (doc["spec"].get("scheduling") or {}).get("queueName")
    if queue:
        kueue_queue(live_cluster, live_namespace, queue, f"cq-{live_namespace}"[:63], gpus=64)

    applied = kubectl(live_cluster, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    assert applied.returncode == 0, applied.stderr

    if doc["spec"].get("mode") == "evaluate":  # one evaluation Job, no JobSet (test_evaluation_only_job.py)
        pods = wait_for(lambda: (p := [x for x in live_cluster.core.list_namespaced_pod(
            live_namespace, label_selector=f"job-name={name}-eval").items if x.status.phase == "Running"]) and p,
            f"the evaluation pod of {name}", timeout=90)
        allowed = expected_nodes(live_cluster, pods[0].spec)
        assert allowed and pods[0].spec.node_name in allowed
        wait_for(lambda: status(live_cluster, live_namespace, name).get("phase") == "Running", f"{name} Running",
                 timeout=60)
        assert jobset(live_cluster, live_namespace, name) is None
        return

    js = wait_for(lambda: jobset(live_cluster, live_namespace, name), f"the JobSet of {name}", timeout=30)
    # Only the JobSet webhook sets these (the CRD schema has no default for them): it ran.
    assert js["spec"]["startupPolicy"]["startupPolicyOrder"] == "AnyOrder"
    assert js["spec"]["successPolicy"]["operator"] == "All"

    if any(job["name"] == "stage" for job in js["spec"]["replicatedJobs"]):  # model.source / data.source
        (stage,) = wait_for(lambda: running_pods(live_cluster, live_namespace, name), f"the stage pod of {name}",
                            timeout=90)
        assert stage.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "stage"
        assert stage.spec.node_name in expected_nodes(live_cluster, stage.spec)
        live_cluster.end_pod(live_namespace, stage.metadata.name, 0)  # copied: the gang may start

    nodes = doc["spec"]["nodes"]
    pods = wait_for(lambda: (p := [x for x in running_pods(live_cluster, live_namespace, name)
                                   if x.metadata.labels.get("jobset.sigs.k8s.io/replicatedjob-name") == "node"])
                    and len(p) == nodes and p,
                    f"{nodes} running pods of {name}", timeout=90)
    allowed = expected_nodes(live_cluster, pods[0].spec)
    assert allowed, "no node of the fleet matches the example: the fleet in conftest.py needs that shape"
    placed = {p.spec.node_name for p in pods}
    assert placed <= allowed, f"pods on {placed}, expected only nodes among {allowed}"
    if gpus_of(pods[0].spec):
        # Each pod asks for all of a node's GPUs (or the one it has): one pod per node.
        assert len(placed) == nodes

    got = wait_for(lambda: (s := status(live_cluster, live_namespace, name)).get("phase") == "Running" and s,
                   f"{name} Running", timeout=60)
    assert got["nodes"] == nodes
    listed = kubectl(live_cluster, "get", "translationtrainings", "-n", live_namespace)
    assert name in listed.stdout and "Running" in listed.stdout, listed.stdout + listed.stderr
