"""An image the real kubelet cannot pull fails the training within a minute, naming the image,
instead of leaving its pods Pending in ImagePullBackOff for ever."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from workloads import bound_claim, condition, documents, jobset, kubectl, status

from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
# .invalid never resolves (RFC 6761): the kubelet's pull fails at once, as it does for a typo'd
# registry, a repository that is not there or credentials the node lacks.
IMAGE = "registry.invalid/rosetta/trainer:missing"


def test_an_image_the_kubelet_cannot_pull_fails_the_training_naming_it(node_cluster, node_namespace, node_operator):
    docs = documents(QUICKSTART)
    training = docs["TranslationTraining"]
    name = training["metadata"]["name"]
    training["spec"].update(image=IMAGE, imagePullPolicy="Always")
    # The example's claim, bound here (the node has no provisioner): the rest of the file is applied.
    bound_claim(node_cluster, node_namespace, docs.pop("PersistentVolumeClaim")["metadata"]["name"])
    started = time.monotonic()
    applied = kubectl(node_cluster, "apply", "-n", node_namespace, "-f", "-",
                      stdin=yaml.safe_dump_all(docs.values()))
    assert applied.returncode == 0, applied.stderr

    got = wait_for(lambda: (s := status(node_cluster, node_namespace, name)).get("phase") == "Failed" and s,
                   f"{name} Failed", timeout=120)
    assert time.monotonic() - started < 90
    failed = condition(node_cluster, node_namespace, name, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ImagePullFailed")
    assert IMAGE in failed["message"] and IMAGE in got["message"]
    (attempt,) = got["attempts"]
    assert attempt["reason"] == "ImagePullFailed" and attempt["pod"] and IMAGE in attempt["message"]
    # Stopped, not left pulling: the JobSet is suspended (once the failed status is written: the
    # operator acts after its write lands) and its pods go.
    wait_for(lambda: jobset(node_cluster, node_namespace, name)["spec"].get("suspend") is True,
             f"JobSet {name} suspended", timeout=30)
    wait_for(lambda: not [p for p in node_cluster.core.list_namespaced_pod(node_namespace).items
                          if p.metadata.labels.get("jobset.sigs.k8s.io/jobset-name") == name],
             "the gang's pods gone", timeout=120)
    events = [e for e in node_cluster.core.list_namespaced_event(node_namespace).items
              if e.involved_object.name == name and e.reason == "ImagePullFailed"]
    assert len(events) == 1 and IMAGE in events[0].message
