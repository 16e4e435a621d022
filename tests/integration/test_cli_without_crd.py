"""`rosetta` against a real kube-apiserver that does not serve the TranslationTraining resource: one
error line that says to install the CRD, exit 1; where the resource is served, a missing training is
still `not found`.

The session's control plane has the CRD, and other tests share it, so it stays installed: the verbs
are pointed at an API group the apiserver does not serve. It answers that exactly as it answers for
a CRD that was never installed (`404 page not found`, no Status naming an object), which is what
tells the two 404s apart.
"""

from __future__ import annotations

import pytest

from rosetta_cli.main import main
from rosetta_operator import cluster_errors, kube
from support.cluster import Cluster

pytestmark = pytest.mark.integration

ABSENT = "absent.rosetta.dev"


@pytest.mark.parametrize("argv", [
    ["get"], ["get", "-A"], ["get", "q"], ["status", "q"], ["logs", "q"], ["delete", "q"],
    ["wait", "q", "--for", "delete", "--timeout", "10s"],
], ids=lambda argv: "-".join(argv))
def test_without_the_resource_every_verb_says_to_install_the_crd(cluster: Cluster, capsys, monkeypatch, argv):
    monkeypatch.setattr(kube, "GROUP", ABSENT)  # what the verbs ask for
    monkeypatch.setattr(cluster_errors, "GROUP", ABSENT)  # what their error names
    assert main([*argv, "--kubeconfig", cluster.kubeconfig, "-n", "default"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: the cluster at {cluster.cp.server} (context envtest, kubeconfig {cluster.kubeconfig}) has no "
        f"TranslationTraining resource ({ABSENT}/v1alpha1): install the CRD (how: `kubectl apply -f "
        "manifests/crd.yaml` or the Helm chart)"]


def test_with_the_resource_a_missing_training_is_not_found(cluster: Cluster, capsys):
    for argv in (["get", "q"], ["delete", "q"]):
        assert main([*argv, "--kubeconfig", cluster.kubeconfig, "-n", "default"]) == 1
        assert capsys.readouterr().err.splitlines() == [
            'error: translationtrainings.rosetta.dev "q" not found in namespace "default"']


def test_submit_without_the_resource_applies_nothing_of_the_file(cluster: Cluster, monkeypatch):
    """The file's claim comes before its training: without the CRD, neither is applied."""
    from kubernetes.client.exceptions import ApiException

    from rosetta_operator import Client, VerbError

    monkeypatch.setattr(cluster_errors, "GROUP", ABSENT)
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "no-crd-claim"},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    training = {"apiVersion": f"{ABSENT}/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "q"},
                "spec": {}}
    with pytest.raises(VerbError) as exc:
        Client(cluster.kubeconfig, namespace="default").apply([claim, training])
    assert str(exc.value) == (
        f"the cluster at {cluster.cp.server} (context envtest, kubeconfig {cluster.kubeconfig}) has no "
        f"TranslationTraining resource ({ABSENT}/v1alpha1): install the CRD (how: `kubectl apply -f "
        "manifests/crd.yaml` or the Helm chart)")
    with pytest.raises(ApiException) as missing:
        cluster.core.read_namespaced_persistent_volume_claim("no-crd-claim", "default")
    assert missing.value.status == 404
