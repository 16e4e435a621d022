"""Topology-aware placement: Kueue admits a gang into one block of nodes that holds all of it, and
a gang no block holds stays Queued with Kueue's reason in its status.

The nodes are kwok nodes of their own, in two blocks: block-a has two, block-b three, one pod fits
on each. A three-pod gang fits in block-b only; spread by the scheduler alone, it would land there
by chance one time in ten. They carry a taint that only the test's ResourceFlavor tolerates, so no
other test's pods land on them, and they are deleted when this module is done.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from workloads import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    condition,
    in_namespace,
    jobset,
    kubectl,
    kueue_queue,
    provision,
    running_pods,
    status,
    training_doc,
)

from controllers import NodePool
from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
WAIT = 90

BLOCK, RACK = "rosetta.test/topology-block", "rosetta.test/topology-rack"
POOL = {"rosetta.test/pool": "topology"}
TAINT = {"key": "rosetta.test/topology", "value": "true", "effect": "NoSchedule"}
TOPOLOGY, FLAVOR = "rosetta-test-blocks", "rosetta-test-blocks"
# rack -> (block, nodes): block-a holds 2 pods, block-b 3.
RACKS = {"rack-a1": ("block-a", 1), "rack-a2": ("block-a", 1), "rack-b1": ("block-b", 2), "rack-b2": ("block-b", 1)}
CAPACITY = {"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}
POD_RESOURCES = {"cpu": 6, "memory": "8Gi", "shmSize": "1Gi"}  # one pod per node


def _kueue(cluster, plural: str, body: dict) -> None:
    cluster.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body})


@pytest.fixture(scope="module")
def blocks(live_cluster) -> Iterator[dict[str, str]]:
    """The block of each of the module's nodes, and the Topology and ResourceFlavor over them."""
    nodes: dict[str, str] = {}
    try:
        for rack, (block, count) in RACKS.items():
            pool = NodePool(f"topo-{rack}", CAPACITY, {**POOL, BLOCK: block, RACK: rack}, (TAINT,))
            nodes.update((name, block) for name in live_cluster.kwok.add_nodes(pool, count))
        _kueue(live_cluster, "topologies", {"kind": "Topology", "metadata": {"name": TOPOLOGY}, "spec": {"levels": [
            {"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]}})
        # The admin's flavor tolerates the pool's taint for the pods it admits: a training need not know it.
        _kueue(live_cluster, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {
            "nodeLabels": POOL, "topologyName": TOPOLOGY,
            "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]}})
        yield nodes
    finally:
        # Kueue holds the flavor until the ClusterQueues over it are gone: nobody waits for that.
        for plural, name in (("resourceflavors", FLAVOR), ("topologies", TOPOLOGY)):
            _gone(lambda: live_cluster.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name))
        for name in nodes:
            live_cluster.core.delete_node(name)


def _gone(delete) -> None:
    try:
        delete()
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def topology_queue(live_cluster, live_namespace, blocks) -> Iterator[str]:
    """A LocalQueue whose ClusterQueue has only the blocks' flavor, with quota for more than they hold:
    what keeps a gang out is where it fits, never how much it asks."""
    cluster_queue = f"cq-{live_namespace}"[:63]
    kueue_queue(live_cluster, live_namespace, "blocks", cluster_queue, gpus=0, cpu=100, memory="1000Gi",
                flavor=FLAVOR)
    yield "blocks"
    live_cluster.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cluster_queue)


def block_training(namespace: str, name: str, nodes: int, queue: str) -> dict:
    doc = in_namespace(training_doc(QUICKSTART), namespace, name)
    spec = doc["spec"]
    spec["nodes"], spec["resources"] = nodes, POD_RESOURCES
    spec["scheduling"] = {"queueName": queue, "topology": {"level": BLOCK, "mode": "Required"}}
    return doc


def test_a_gang_is_admitted_into_the_one_block_that_holds_it(live_cluster, live_namespace, live_operator,
                                                             topology_queue, blocks):
    ns = live_namespace
    doc = block_training(ns, "packed", 3, topology_queue)
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)

    pods = wait_for(lambda: (p := running_pods(live_cluster, ns, "packed")) and len(p) == 3 and p,
                    "3 running pods", WAIT)
    placed = {p.metadata.name: p.spec.node_name for p in pods}
    assert all(node in blocks for node in placed.values()), placed
    assert {blocks[node] for node in placed.values()} == {"block-b"}, placed
    assert len(set(placed.values())) == 3, placed
    wait_for(lambda: status(live_cluster, ns, "packed").get("phase") == "Running", "packed Running", WAIT)
    assert condition(live_cluster, ns, "packed", "Admitted")["status"] == "True"


def test_a_gang_larger_than_any_block_stays_queued_and_says_why(live_cluster, live_namespace, live_operator,
                                                                topology_queue, blocks):
    ns = live_namespace
    doc = block_training(ns, "too-big", 4, topology_queue)
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)

    said = re.compile(rf'topology "{TOPOLOGY}" allows to fit only \d out of 4 pod\(s\)')
    admitted = wait_for(lambda: (c := condition(live_cluster, ns, "too-big", "Admitted"))
                        and said.search(c.get("message", "")) and c,
                        "too-big's Admitted condition with Kueue's topology reason", WAIT)
    assert admitted["status"] == "False" and admitted["reason"] == "Queued", admitted
    got = status(live_cluster, ns, "too-big")
    assert got["phase"] == "Queued" and said.search(got["message"]), got
    assert jobset(live_cluster, ns, "too-big")["spec"]["suspend"] is True
    assert not live_cluster.pods(ns)


def test_the_documented_kueue_objects_pass_kueues_validation(live_cluster, live_namespace):
    """docs/operator.md's Topology, ResourceFlavor, ClusterQueue and LocalQueue, as the apiserver and
    Kueue's webhooks take them (a server-side dry run: nothing is created)."""
    text = (REPO / "docs" / "operator.md").read_text()
    section = text[text.index("### Topology-aware placement"):]
    section = section[:section.index("\n### ", 1)]
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", section, re.S) for d in yaml.safe_load_all(block)
            if d and d.get("apiVersion", "").startswith(f"{KUEUE_GROUP}/")]
    assert {d["kind"] for d in docs} == {"Topology", "ResourceFlavor", "ClusterQueue", "LocalQueue"}
    for doc in docs:
        if doc["kind"] == "LocalQueue":
            doc["metadata"]["namespace"] = live_namespace
    applied = kubectl(live_cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("(server dry run)") == len(docs), applied.stdout
