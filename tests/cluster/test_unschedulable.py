"""A training the cluster cannot place stays Pending, and says why in the scheduler's words: as a
condition (`kubectl wait`, alerts), in its message (`kubectl get tt`) and as a Warning event."""

from __future__ import annotations

import pytest
from test_lifecycle import small_training
from workloads import condition, provision, status

from support.cluster import wait_for

WAIT = 60


def gpu_training(namespace: str, name: str, gpus: int, **scheduling) -> dict:
    doc = small_training(namespace, name)
    spec = doc["spec"]
    spec["gpusPerNode"] = gpus
    spec.pop("procsPerNode", None)
    spec["training"]["device"] = "cuda"
    spec["scheduling"] = scheduling
    return doc


@pytest.mark.parametrize("case, gpus, scheduling, said", [
    ("more GPUs than any node has", 16, {}, "Insufficient nvidia.com/gpu"),
    ("an instance type the cluster does not have", 8,
     {"nodeSelector": {"node.kubernetes.io/instance-type": "p6-b200.48xlarge"}}, "didn't match Pod's node affinity"),
], ids=["too-many-gpus", "no-such-nodes"])
def test_unschedulable_training_stays_pending_and_says_why(live_cluster, live_namespace, live_operator,
                                                           case, gpus, scheduling, said):
    ns = live_namespace
    doc = gpu_training(ns, "nowhere", gpus, **scheduling)
    provision(live_cluster, ns, doc)  # its checkpoints claim is bound: only the GPUs keep it off the nodes
    live_cluster.create_training(ns, doc)
    scheduled = wait_for(lambda: (c := condition(live_cluster, ns, "nowhere", "Scheduled")) and c, "a Scheduled condition",
                         WAIT)
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert said in scheduled["message"], scheduled
    got = status(live_cluster, ns, "nowhere")
    assert got["phase"] == "Pending"
    assert said in got["message"], got["message"]

    events = wait_for(lambda: [e for e in live_cluster.core.list_namespaced_event(ns).items
                               if e.involved_object.kind == "TranslationTraining" and e.reason == "Unschedulable"],
                      "a Warning event on the training", WAIT)
    assert events[0].type == "Warning" and said in events[0].message
    # Nothing ran anywhere.
    assert all(p.status.phase == "Pending" and not p.spec.node_name for p in live_cluster.pods(ns))
