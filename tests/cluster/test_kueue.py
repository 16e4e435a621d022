"""Kueue decides when a training starts: quota, queueing, admission, and an operator that leaves
Kueue's decisions alone across its own restarts."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from workloads import condition, in_namespace, jobset, kueue_queue, provision, running_pods, status

from support.cluster import GROUP, PLURAL, VERSION, wait_for

REPO = Path(__file__).resolve().parents[2]
P5_EXAMPLE = REPO / "manifests" / "examples" / "flan-t5-xl-deepspeed-p5.yaml"
WAIT = 90


def whole_quota_training(namespace: str, name: str, queue: str, suspend: bool = False) -> dict:
    """The p5 example on two nodes: 16 GPUs, all of the ClusterQueue's quota. `suspend: true` with a
    queue name is the pattern Kueue's own docs (and ours, once) give: it must behave the same."""
    doc = in_namespace(yaml.safe_load(P5_EXAMPLE.read_text()), namespace, name)
    doc["spec"]["nodes"] = 2
    doc["spec"]["suspend"] = suspend
    doc["spec"].setdefault("scheduling", {})["queueName"] = queue
    return doc


def phase(cluster, namespace: str, name: str) -> str:
    return status(cluster, namespace, name).get("phase") or ""


def test_second_training_waits_for_quota_and_runs_when_the_first_ends(live_cluster, live_namespace,
                                                                       live_operator):
    ns = live_namespace
    kueue_queue(live_cluster, ns, "team", f"cq-{ns}"[:63], gpus=16)
    for name in ("first", "second"):
        doc = whole_quota_training(ns, name, "team", suspend=name == "first")
        provision(live_cluster, ns, doc)
        live_cluster.create_training(ns, doc)
        if name == "first":
            wait_for(lambda: phase(live_cluster, ns, "first") == "Running", "first Running", WAIT)

    # The second one is queued, and says why in Kueue's words.
    wait_for(lambda: phase(live_cluster, ns, "second") == "Queued", "second Queued", WAIT)
    # First "waiting for Kueue", then Kueue's own reason once it has tried to fit the gang.
    admitted = wait_for(lambda: (c := condition(live_cluster, ns, "second", "Admitted"))
                        and "nvidia.com/gpu" in c.get("message", "") and c,
                        "second's Admitted condition with Kueue's reason (the GPU quota)", WAIT)
    assert admitted["status"] == "False"
    assert jobset(live_cluster, ns, "second")["spec"]["suspend"] is True
    assert condition(live_cluster, ns, "first", "Admitted")["status"] == "True"

    # An operator restart must not suspend what Kueue admitted: the gang keeps its pods.
    before = {p.metadata.uid for p in running_pods(live_cluster, ns, "first")}
    live_operator.restart()
    time.sleep(5)  # the resumed handlers have run by the time /healthz answers; give the watch a beat too
    assert jobset(live_cluster, ns, "first")["spec"]["suspend"] is False
    assert {p.metadata.uid for p in running_pods(live_cluster, ns, "first")} == before
    assert phase(live_cluster, ns, "first") == "Running"

    # The first ends: its quota goes to the second.
    for pod in running_pods(live_cluster, ns, "first"):
        live_cluster.end_pod(ns, pod.metadata.name, 0)
    wait_for(lambda: phase(live_cluster, ns, "first") == "Succeeded", "first Succeeded", WAIT)
    wait_for(lambda: phase(live_cluster, ns, "second") == "Running", "second admitted and Running", WAIT)
    assert condition(live_cluster, ns, "second", "Admitted")["status"] == "True"


def test_user_suspend_and_resume_of_a_queued_training(live_cluster, live_namespace, live_operator):
    ns = live_namespace
    kueue_queue(live_cluster, ns, "team", f"cq-{ns}"[:63], gpus=16)
    doc = whole_quota_training(ns, "held", "team")
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)
    wait_for(lambda: phase(live_cluster, ns, "held") == "Running", "Running", WAIT)

    patch = live_cluster.custom.patch_namespaced_custom_object
    patch(GROUP, VERSION, ns, PLURAL, "held", {"spec": {"suspend": True}})
    wait_for(lambda: phase(live_cluster, ns, "held") == "Suspended", "Suspended by the user", WAIT)
    wait_for(lambda: not running_pods(live_cluster, ns, "held"), "its pods stopped", WAIT)

    patch(GROUP, VERSION, ns, PLURAL, "held", {"spec": {"suspend": False}})
    # Back in the queue, admitted again, a new gang: the JobSet's ready count can say so a beat
    # before the pod watch shows both pods Running.
    wait_for(lambda: phase(live_cluster, ns, "held") == "Running", "Running again after resume", WAIT)
    wait_for(lambda: len(running_pods(live_cluster, ns, "held")) == 2, "both pods Running again", WAIT)
    assert condition(live_cluster, ns, "held", "Admitted")["status"] == "True"
