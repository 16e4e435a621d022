"""The CRD as a current kube-apiserver enforces it: every CEL rule rejects its example (and the valid
specs beside them pass), and `kubectl apply` refuses unknown fields, as on any current cluster.
Dry-run requests: the apiserver validates fully and stores nothing."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from rosetta_operator.crd_validations import cel_rules
from support.cel_cases import CASES, _raw
from support.cluster import GROUP, PLURAL, VERSION


def document(namespace: str, spec: dict, name: str = "mt") -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TranslationTraining",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def dry_run_create(cluster, namespace: str, spec: dict) -> ApiException | None:
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, document(namespace, spec),
                                                       dry_run="All")
    except ApiException as exc:
        return exc
    return None


@pytest.mark.parametrize("case, raw, valid", CASES, ids=[c[0] for c in CASES])
def test_cel_rule_is_enforced_by_the_apiserver(cluster, namespace, case, raw, valid):
    error = dry_run_create(cluster, namespace, raw)
    if valid:
        assert error is None, error.body
        return
    assert error is not None and error.status == 422, f"{case}: accepted"
    said = json.loads(error.body)["message"]
    assert any(rule.message in said for rule in cel_rules()), f"{case}: rejected, but not by a CEL rule: {said}"


def kubectl_apply(cluster, namespace: str, doc: dict) -> subprocess.CompletedProcess:
    return subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "apply", "-n", namespace, "-f", "-"],
                          input=yaml.safe_dump(doc), capture_output=True, text=True, timeout=60)


def test_kubectl_apply_rejects_an_unknown_field(cluster, namespace):
    spec = _raw()
    spec["training"] = {"maxStep": 10}  # a typo of maxSteps
    result = kubectl_apply(cluster, namespace, document(namespace, spec))
    assert result.returncode != 0
    assert 'unknown field "spec.training.maxStep"' in result.stderr, result.stderr
    # The corrected spelling goes through.
    spec["training"] = {"maxSteps": 10}
    result = kubectl_apply(cluster, namespace, document(namespace, spec))
    assert result.returncode == 0, result.stderr
