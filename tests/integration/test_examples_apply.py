"""Every manifests/examples/ file against a real kube-apiserver, no operator running.

What `rosetta render -f FILE | kubectl apply -f -` creates (the ConfigMap and the JobSet) and what
`kubectl apply -f FILE` creates (the TranslationTraining) must be accepted by the apiserver with the
CRDs the session fixture installs, and read back as sent: nothing rejected, nothing pruned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rosetta_contract.documents import read_yaml
from rosetta_contract.spec import load_training, parse_spec
from rosetta_operator.render import jobset_suspend, render
from support.cluster import REPO, Cluster

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))


def missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Where `got` lacks or changed what `sent` has (the server may add defaults, nothing else)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [f"{path or '(root)'}: sent a mapping, got {got!r}"]
        out = []
        for key, value in sent.items():
            if key not in got:
                out.append(f"{path}.{key}: pruned or dropped")
            else:
                out += missing(value, got[key], f"{path}.{key}")
        return out
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [f"{path}: sent {len(sent)} items, got {got!r}"]
        return [p for i, (s, g) in enumerate(zip(sent, got)) for p in missing(s, g, f"{path}[{i}]")]
    return [] if sent == got else [f"{path}: sent {sent!r}, got {got!r}"]


def _gang(jobset: dict) -> dict:
    """The nodes' replicated job (model.source/data.source add a stage job before it)."""
    (job,) = [j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node"]
    return job


def _pod_spec(jobset: dict) -> dict:
    return _gang(jobset)["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_rendered_configmap_and_jobset_are_accepted(cluster: Cluster, namespace: str, path: Path):
    training = load_training(path)
    rendered = render(training.metadata.name, namespace, training.spec)

    cluster.core.create_namespaced_config_map(namespace, rendered.configmap)
    cm = cluster.api.sanitize_for_serialization(
        cluster.core.read_namespaced_config_map(rendered.names.configmap, namespace))
    assert cm["data"] == rendered.configmap["data"]

    cluster.custom.create_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, rendered.jobset)
    got = cluster.custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL,
                                                      rendered.names.jobset)
    assert missing(rendered.jobset["spec"], got["spec"], "spec") == []
    assert [j["name"] for j in got["spec"]["replicatedJobs"]] == [j["name"] for j in rendered.jobset["spec"]["replicatedJobs"]]
    sent_job, got_job = _gang(rendered.jobset), _gang(got)
    assert got_job["replicas"] == sent_job["replicas"] == 1
    job = got_job["template"]["spec"]
    assert job["parallelism"] == job["completions"] == training.spec.nodes
    sent_pod, got_pod = _pod_spec(rendered.jobset), _pod_spec(got)
    assert [c["name"] for c in got_pod["containers"]] == [c["name"] for c in sent_pod["containers"]]
    (container,) = got_pod["containers"]
    assert container["image"] == training.spec.image
    assert container["resources"] == sent_pod["containers"][0]["resources"]
    if training.spec.gpus_per_node:
        gpus = container["resources"]["limits"][training.spec.resources.gpu_resource]
        assert int(gpus) == training.spec.gpus_per_node
    assert {v["name"] for v in got_pod["volumes"]} >= {v.name for v in training.spec.volumes}
    assert got["spec"].get("suspend", False) == jobset_suspend(training.spec)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_translation_training_is_accepted_by_its_crd(cluster: Cluster, namespace: str, path: Path):
    doc = read_yaml(path)  # the TranslationTraining; the file may also hold the claim it mounts
    doc["metadata"] = {**doc["metadata"], "namespace": namespace}
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
    got = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc["metadata"]["name"])
    assert missing(doc["spec"], got["spec"], "spec") == []
    # What the apiserver stored is still a valid spec, as the operator will read it.
    assert parse_spec(got["spec"]) == load_training(path).spec
