"""Facts about the chart that its objects alone do not show: every rendered document is YAML a
strict parser reads (no key twice), and Chart.yaml's kubeVersion is what the CRD's CEL rules and
the Jobs the operator renders need."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from rosetta_contract import strict_yaml
from rosetta_contract.documents import deep_merge
from rosetta_contract.spec import load_training
from rosetta_operator.render import render as render_training
from support.chart import CHART, GUIDES, MONITORING_APIS, REPO, helm_installs, load_values, render_files

MONITORS_ON = {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True},
                              "prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}}
# Values that reach every template and every optional branch: two replicas (peering, the budget,
# the anti-affinity), watched namespaces (Roles), a policy (its ConfigMap), and extra labels that
# repeat the chart's own keys.
EVERYTHING = deep_merge(MONITORS_ON, {
    "replicaCount": 2, "watchNamespaces": ["ml", "nlp"], "policy": {"maxNodes": 4},
    "podLabels": {"app.kubernetes.io/component": "mine", "team": "ml"},
    "monitoring": {"podMonitor": {"labels": {"app.kubernetes.io/name": "other", "release": "kps"}},
                   "serviceMonitor": {"labels": {"app.kubernetes.io/part-of": "other"}},
                   "prometheusRule": {"labels": {"helm.sh/chart": "other"}},
                   "dashboards": {"label": "app.kubernetes.io/instance", "labelValue": "grafana"}},
})


def cloud_values(cloud: str) -> dict:
    (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
    merged: dict = {}
    for path in install.values_files:
        merged = deep_merge(merged, load_values(path))
    return deep_merge(merged, install.values)


@pytest.mark.parametrize("values", [
    {}, MONITORS_ON, "eks", "gke", EVERYTHING, {"replicaCount": 3, "affinity": {"nodeAffinity": {}}},
], ids=["defaults", "monitoring", "eks", "gke", "everything", "affinity"])
def test_every_rendered_document_is_strict_yaml(values: Any):
    """Duplicate keys are legal to Go's YAML writer and silently collapsed by PyYAML and the
    apiserver's reader, but strict parsers (kubeconform, yq, the project's own loader) refuse them."""
    if isinstance(values, str):
        values = cloud_values(values)
    files = render_files(values, api_versions=MONITORING_APIS)
    assert any("/templates/tests/" in path for path in files), "helm test's pod is rendered too"
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        try:
            strict_yaml.load_all(text)
        except strict_yaml.YamlError as exc:
            pytest.fail(f"{path}: {exc}", pytrace=False)


def test_strict_loader_refuses_a_duplicate_label():
    with pytest.raises(strict_yaml.YamlError, match="duplicate key 'app.kubernetes.io/component'"):
        strict_yaml.load_all("metadata:\n  labels:\n    app.kubernetes.io/component: operator\n"
                             "    app.kubernetes.io/component: test\n")


# ----------------------------------------------------------------------------- kubeVersion

# The first Kubernetes minor whose apiserver enforces each part of a CRD's CEL rules by default.
CEL_RULE_FIELDS = {"rule": 25, "message": 25, "messageExpression": 27, "reason": 28, "fieldPath": 28,
                   "optionalOldSelf": 30}
# CEL's base functions and macros, there since the rules themselves (1.25, beta and on by default).
# Kubernetes' own libraries came later (isSorted, url, quantity, format, ...): a rule calling one
# needs adding here with its release.
CEL_FUNCTIONS = {name: 25 for name in (
    "has", "size", "all", "exists", "exists_one", "filter", "map", "matches", "startsWith", "endsWith",
    "contains", "int", "uint", "double", "string", "bool", "bytes", "duration", "timestamp", "type", "dyn")}
# Job podFailurePolicy (the operator tells a preemption from a failure with it): GA in 1.31.
POD_FAILURE_POLICY = 31
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"


def validations(node: Any) -> list[dict]:
    if isinstance(node, dict):
        return node.get("x-kubernetes-validations", []) + [v for child in node.values() for v in validations(child)]
    if isinstance(node, list):
        return [v for child in node for v in validations(child)]
    return []


def called(rule: str) -> set[str]:
    """The functions and macros a CEL expression calls (string literals left out)."""
    rule = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", rule)
    return set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", rule))


def chart_minimum() -> tuple[int, int]:
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    found = re.fullmatch(r">=\s*1\.(\d+)\.0-0", constraint)
    assert found, f"kubeVersion {constraint!r}: expected >=1.MINOR.0-0 (-0 admits v1.31.4-eks-... and the like)"
    return 1, int(found.group(1))


def test_cel_function_parser():
    assert called("self.all(e, !(e.name in ['a(b)']) && e.x.matches('^(x)$')) && has(self.y)") == {
        "all", "matches", "has"}


def test_kube_version_is_what_the_crd_and_the_jobs_need():
    crd = yaml.safe_load((CHART / "files" / "crd.yaml").read_text())
    rules = validations(crd["spec"])
    assert rules, "the CRD has CEL rules"
    needs: dict[str, int] = {}
    for rule in rules:
        unknown = set(rule) - set(CEL_RULE_FIELDS)
        assert not unknown, f"a CEL rule uses {unknown}: add it to CEL_RULE_FIELDS with its Kubernetes release"
        needs.update({f"rule field {k}": CEL_RULE_FIELDS[k] for k in rule})
        for name in called(rule["rule"]):
            assert name in CEL_FUNCTIONS, (f"the CEL rule {rule['rule']!r} calls {name}(): add it to CEL_FUNCTIONS "
                                           "with the first Kubernetes release that has it")
            needs[f"CEL {name}()"] = CEL_FUNCTIONS[name]

    training = load_training(QUICKSTART)
    jobset = render_training(training.metadata.name, "ml", training.spec).jobset
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert "podFailurePolicy" in job
    needs["Job podFailurePolicy"] = POD_FAILURE_POLICY

    needed = max(needs.values())
    assert chart_minimum() == (1, needed), (
        f"Chart.yaml's kubeVersion should be >=1.{needed}.0-0, for "
        + ", ".join(sorted(k for k, v in needs.items() if v == needed)))


def test_docs_state_the_same_minimum():
    major, minor = chart_minimum()
    assert f"Kubernetes {major}.{minor} or later" in (REPO / "docs" / "helm.md").read_text()
    assert f"`>={major}.{minor}.0-0`" in (CHART / "README.md").read_text()
