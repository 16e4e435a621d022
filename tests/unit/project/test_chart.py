"""charts/rosetta rendered by Helm's own engine (support/chart.py): default, EKS, GKE, watched-namespace
and cluster-wide values; CRD, RBAC, Deployment, policy, monitors, dashboards, alerts; manifests/operator.yaml.
What each install mode grants, and the NetworkPolicy: test_chart_privilege.py."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout

import pytest
import yaml

from rosetta_cli.main import main
from rosetta_contract import metric_names
from rosetta_contract.spec import load_training
from rosetta_operator.names import BASE_LABELS
from rosetta_operator.policy import Policy
from rosetta_operator.render import render as render_training
from support.chart import (
    CHART,
    GUIDES,
    MONITORING_APIS,
    OPERATOR_MANIFEST,
    REGENERATE,
    RenderError,
    helm_installs,
    raw_manifest_text,
    raw_manifests,
    render,
    render_install,
)

EKS = CHART / "values-eks.yaml"
GKE = CHART / "values-gke.yaml"
CHART_CRD = CHART / "files" / "crd.yaml"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
QUICKSTART = CHART.parents[1] / "manifests" / "examples" / "quickstart-cpu.yaml"
MONITORS_ON = {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True},
                              "prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}}


def crd_text() -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["crd"]) == 0
    return out.getvalue()


def kinds(objects: list[dict]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {kinds(found)}"
    return found[0]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def container(objects: list[dict]) -> dict:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every combination a rule list grants."""
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


NAMESPACED = {
    ("rosetta.dev", "translationtrainings", v) for v in ("get", "list", "watch", "patch")
} | {
    ("rosetta.dev", "translationtrainings/status", "get"), ("rosetta.dev", "translationtrainings/status", "patch"),
    ("rosetta.dev", "translationtrainings/finalizers", "update"),
} | {
    ("jobset.x-k8s.io", "jobsets", v) for v in ("get", "list", "watch", "create", "patch")
} | {
    ("batch", "jobs", v) for v in ("get", "list", "watch", "create", "patch")
} | {
    ("", "configmaps", "get"), ("", "configmaps", "create"), ("", "configmaps", "patch"),
    ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
    ("", "events", "create"),
} | {
    ("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch", "patch")
}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")}
NAMESPACES = {("", "namespaces", "list"), ("", "namespaces", "watch")}


# ------------------------------------------------------------------------------ the CRD


def test_chart_crd_file_is_rosetta_crd_output():
    assert CHART_CRD.read_text() == crd_text(), \
        "charts/rosetta/files/crd.yaml is stale; regenerate it with: rosetta crd > charts/rosetta/files/crd.yaml"


def test_rendered_crd_equals_rosetta_crd():
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"].pop("labels")["app.kubernetes.io/part-of"] == "rosetta"
    assert crd == yaml.safe_load(crd_text())


def test_crd_can_be_left_out_and_released_on_uninstall():
    assert of_kind(render({"crd": {"install": False}}), "CustomResourceDefinition") == []
    crd = one(render({"crd": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


# -------------------------------------------------------------------------- default values


def test_default_objects():
    objects = render()
    assert kinds(objects) == [
        ("ServiceAccount", "rosetta"), ("ConfigMap", "rosetta-policy"),
        ("CustomResourceDefinition", "translationtrainings.rosetta.dev"),
        ("ClusterRole", "rosetta-rosetta-system"), ("ClusterRoleBinding", "rosetta-rosetta-system"),
        ("Role", "rosetta"), ("RoleBinding", "rosetta"), ("Service", "rosetta-metrics"), ("Deployment", "rosetta"),
        ("NetworkPolicy", "rosetta"),
    ]
    assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {"rosetta-system"}


def test_deployment_runs_rosetta_operator_on_its_own_namespace():
    objects = render()
    deploy = one(objects, "Deployment")
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}  # never two unpeered operators at once
    c = container(objects)
    assert c["image"] == "ghcr.io/rosetta-dev/rosetta-operator:0.1.0"
    assert c["command"] == ["rosetta", "operator"]
    assert c["args"] == ["--namespace=rosetta-system", "--liveness-port=8080", "--metrics-port=8000",
                         "--log-level=info", "--log-format=text", f"--policy={POLICY_FILE}"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"healthz": 8080, "metrics": 8000}
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_operator_flags_match_the_cli():
    """Every flag the chart passes is one `rosetta operator` accepts."""
    import argparse

    from rosetta_operator.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    c = container(render({"watchNamespaces": ["ml", "nlp"], "operator": {"allowHostPath": True},
                          "logging": {"level": "debug", "format": "json"}}))
    args = parser.parse_args(c["command"][1:] + c["args"])
    assert args.namespaces == ["ml", "nlp"] and not args.all_namespaces
    assert parser.parse_args(["operator", *container(render())["args"]]).namespaces == ["rosetta-system"]
    assert parser.parse_args(["operator", *container(render({"clusterWide": True}))["args"]]).all_namespaces
    assert args.liveness_port == 8080 and args.metrics_port == 8000 and args.allow_host_path
    assert args.log_level == "debug" and args.log_format == "json"


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
@pytest.mark.parametrize("format_", ["text", "json"])
def test_logging_values_are_the_operators_log_flags(level, format_):
    args = container(render({"logging": {"level": level, "format": format_}}))["args"]
    assert [a for a in args if a.startswith("--log-")] == [f"--log-level={level}", f"--log-format={format_}"]


@pytest.mark.parametrize("logging, message", [
    ({"level": "verbose"}, "/logging/level"), ({"format": "xml"}, "/logging/format"),
], ids=["level", "format"])
def test_logging_values_outside_the_flags_choices_are_refused(logging, message):
    with pytest.raises(RenderError, match=message):
        render({"logging": logging})


def test_security_context_is_non_root_read_only_without_capabilities():
    objects = render()
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objects)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Python and the client libraries may still want a scratch directory.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(objects)["volumeMounts"]


def test_cluster_wide_rbac_is_exactly_what_the_handlers_need():
    objects = render({"clusterWide": True})
    assert "--all-namespaces" in container(objects)["args"]
    role = one(objects, "ClusterRole")
    assert grants(role["rules"]) == NAMESPACED | CRD_READ | NAMESPACES
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rosetta", "namespace": "rosetta-system"}]
    assert of_kind(objects, "Role") == []
    # Never: deleting anything, secrets, creating pods.
    assert not {g for g in grants(role["rules"]) if g[2] in ("delete", "deletecollection", "*")}
    assert not {g for g in grants(role["rules"]) if g[1] in ("secrets", "*")}


def test_single_namespace_mode():
    objects = render({"watchNamespaces": ["ml"]})
    assert container(objects)["args"][0] == "--namespace=ml"
    assert "--all-namespaces" not in container(objects)["args"]
    # Cluster-wide, only what kopf's discovery reads.
    assert grants(one(objects, "ClusterRole")["rules"]) == CRD_READ
    role, binding = one(objects, "Role"), one(objects, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ml"
    assert grants(role["rules"]) == NAMESPACED
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rosetta", "namespace": "rosetta-system"}]


def test_several_watched_namespaces_get_a_role_each():
    objects = render({"watchNamespaces": ["ml", "nlp"]})
    assert sorted(r["metadata"]["namespace"] for r in of_kind(objects, "Role")) == ["ml", "nlp"]
    assert sorted(r["metadata"]["namespace"] for r in of_kind(objects, "RoleBinding")) == ["ml", "nlp"]


def test_allow_host_path_flag():
    assert "--allow-host-path" not in container(render())["args"]
    assert "--allow-host-path" in container(render({"operator": {"allowHostPath": True}}))["args"]


# --------------------------------------------------------------------------------- policy

POLICY_FILE = "/etc/rosetta/policy.yaml"


def rendered_policy(objects: list[dict], tmp_path):
    """The operator's reading of the chart's policy ConfigMap (policy.load_policy)."""
    from rosetta_operator.policy import load_policy

    configmap = next(c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == "rosetta-policy")
    (tmp_path / "policy.yaml").write_text(configmap["data"]["policy.yaml"])
    return load_policy(tmp_path / "policy.yaml")


def test_policy_values_are_the_policy_fields_and_limit_what_the_operators_defaults_limit(tmp_path):
    from rosetta_operator.policy import Policy

    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    aliases = {f.alias for f in Policy.model_fields.values()}
    assert set(values) <= aliases, set(values) - aliases
    # allowHostPath stays with operator.allowHostPath (--allow-host-path): one switch, not two.
    assert aliases - set(values) == {"allowHostPath"}
    assert Policy.model_validate(values, by_alias=True, by_name=False) == Policy()
    # What the operator reads is the defaults it would apply without a file: a default install
    # limits exactly what `rosetta validate` without --policy checks.
    objects = render()
    assert rendered_policy(objects, tmp_path) == Policy()
    assert rendered_policy(objects, tmp_path).limits() == Policy().limits() != []
    assert f"--policy={POLICY_FILE}" in container(objects)["args"]


def test_policy_is_a_configmap_the_operator_reads(tmp_path):
    import argparse

    from rosetta_operator.cli import add_commands

    policy = {"allowedRegistries": ["ghcr.io/rosetta-dev/"], "allowedServiceAccounts": ["default", "s3"],
              "allowServiceAccountToken": False, "allowedPriorityClasses": ["batch"],
              "requireQueue": True, "allowedQueues": ["team-a"],
              "allowedTolerationKeys": ["nvidia.com/gpu"], "allowTolerateAll": True, "allowControlPlane": True,
              "allowedNodeSelectorKeys": ["node.kubernetes.io/instance-type"],
              "allowedNodeSelectorValues": {"node.kubernetes.io/instance-type": ["p5.48xlarge"]},
              "allowedGpuResources": ["nvidia.com/gpu"], "maxEfaPerNode": 32,
              "allowedHostPaths": ["/mnt/data"], "maxNodes": 8, "maxGpusPerNode": 8, "maxGpusPerTraining": 64,
              "maxCpuPerPod": 96, "maxMemoryPerPod": "1Ti", "maxShmSize": "64Gi", "maxCpuPerTraining": "768",
              "maxMemoryPerTraining": "8Ti", "allowRootGroup": False,
              "namespaces": {"research": {"maxNodes": 16, "maxGpusPerTraining": None},
                             "sandbox-*": {"maxGpusPerNode": 0}}}
    objects = render({"policy": policy})
    configmap = one(objects, "ConfigMap")
    assert configmap["metadata"]["name"] == "rosetta-policy"
    read = rendered_policy(objects, tmp_path)
    assert read.model_dump(by_alias=True, exclude={"namespaces"}) == {
        "allowHostPath": False, **{k: v for k, v in policy.items() if k != "namespaces"},
        "maxCpuPerPod": "96"}  # a quantity, whether written as a number or a string
    assert read.for_namespace("research").max_nodes == 16
    assert read.for_namespace("research").max_gpus_per_training is None  # null lifts the limit there
    assert read.for_namespace("sandbox-1").max_gpus_per_node == 0 and read.for_namespace("ml").max_nodes == 8

    pod = one(objects, "Deployment")["spec"]["template"]
    c = container(objects)
    assert c["args"][-1] == f"--policy={POLICY_FILE}"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "policy")
    assert mount == {"name": "policy", "mountPath": POLICY_FILE.rsplit("/", 1)[0], "readOnly": True}
    assert {"name": "policy", "configMap": {"name": "rosetta-policy"}} in pod["spec"]["volumes"]
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    assert parser.parse_args(c["command"][1:] + c["args"]).policy == POLICY_FILE
    # The operator reads it at startup: another policy, another pod template.
    other = one(render({"policy": {**policy, "maxNodes": 4}}), "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["checksum/policy"] != other["metadata"]["annotations"]["checksum/policy"]


NULLABLE = ["maxEfaPerNode", "maxNodes", "maxGpusPerNode", "maxGpusPerTraining", "maxCpuPerPod", "maxMemoryPerPod",
            "maxShmSize", "maxCpuPerTraining", "maxMemoryPerTraining"]


def test_nullable_policy_values_are_the_limits_null_lifts():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["policy"]["properties"]
    assert sorted(k for k in values if "null" in schema[k]["type"]) == sorted(NULLABLE)


@pytest.mark.parametrize("name", NULLABLE)
def test_null_reaches_the_operator_and_lifts_a_limit(name, tmp_path):
    # Helm drops a key a user sets to null; written back, it lifts the operator's default too.
    read = rendered_policy(render({"policy": {name: None}}), tmp_path).model_dump(by_alias=True)
    assert read == {**Policy().model_dump(by_alias=True), name: None}


@pytest.mark.parametrize("policy, limits", [
    ({}, ["allowTolerateAll", "allowControlPlane", "maxNodes", "maxGpusPerTraining"]),
    ({"maxNodes": None, "maxGpusPerTraining": None, "allowTolerateAll": True, "allowControlPlane": True}, []),
    ({"maxGpusPerNode": 0, "maxNodes": None}, ["allowTolerateAll", "allowControlPlane", "maxGpusPerNode",
                                               "maxGpusPerTraining"]),
    ({"allowRootGroup": False, "namespaces": {"ml": {"maxNodes": 2}}},
     ["allowTolerateAll", "allowControlPlane", "maxNodes", "maxGpusPerTraining", "allowRootGroup", "namespaces"]),
], ids=["defaults", "nothing", "zero-is-a-limit", "false-and-namespaces"])
def test_policy_limits_what_the_values_say(policy, limits, tmp_path):
    assert sorted(rendered_policy(render({"policy": policy}), tmp_path).limits()) == sorted(limits)


def test_policy_beside_pod_annotations():
    pod = one(render({"podAnnotations": {"a": "b"}, "policy": {"maxNodes": 2}}), "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["a"] == "b" and "checksum/policy" in pod["metadata"]["annotations"]


def test_existing_service_account_and_no_rbac():
    objects = render({"serviceAccount": {"create": False, "name": "ops"}, "rbac": {"create": False}})
    assert of_kind(objects, "ServiceAccount") == []
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


# ------------------------------------------------------------------------------- peering


def test_two_replicas_turn_on_kopf_peering_cluster_wide():
    objects = render({"replicaCount": 2, "clusterWide": True})
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    assert one(objects, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--peering=rosetta" in container(objects)["args"]
    crds = {c["metadata"]["name"]: c for c in of_kind(objects, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= set(crds)
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    peering = one(objects, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1" and peering["metadata"]["name"] == "rosetta"
    # After its CRD is served: a post-install hook.
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    assert grants(one(objects, "ClusterRole")["rules"]) == (
        NAMESPACED | CRD_READ | NAMESPACES | {("kopf.dev", "clusterkopfpeerings", v)
                                             for v in ("get", "list", "watch", "patch")})


@pytest.mark.parametrize("values, namespace", [
    ({"watchNamespaces": ["ml"]}, "ml"), ({}, "rosetta-system"),
], ids=["watched", "release-namespace"])
def test_peering_in_namespaced_mode_uses_a_kopfpeering_per_namespace(values, namespace):
    objects = render({"peering": {"enabled": True, "name": "p"}, **values})
    assert "--peering=p" in container(objects)["args"]
    peering = one(objects, "KopfPeering")
    assert peering["metadata"] == {**peering["metadata"], "name": "p", "namespace": namespace}
    assert of_kind(objects, "ClusterKopfPeering") == []
    assert grants(one(objects, "Role")["rules"]) == NAMESPACED | {
        ("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
    assert grants(one(objects, "ClusterRole")["rules"]) == CRD_READ


def test_two_replicas_get_a_disruption_budget_and_spread_over_nodes():
    objects = render({"replicaCount": 2})
    deploy = one(objects, "Deployment")
    selector = deploy["spec"]["selector"]["matchLabels"]
    budget = one(objects, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1" and budget["metadata"]["namespace"] == "rosetta-system"
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    (term,) = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": selector}}
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    # One replica: a budget could only block drains, and there is nothing to spread.
    single = render()
    assert of_kind(single, "PodDisruptionBudget") == []
    assert "affinity" not in one(single, "Deployment")["spec"]["template"]["spec"]
    assert of_kind(render({"peering": {"enabled": True}}), "PodDisruptionBudget") == []


def test_anti_affinity_keeps_the_users_affinity():
    node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    affinity = one(render({"replicaCount": 2, "affinity": node}), "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node["nodeAffinity"] and "podAntiAffinity" in affinity
    own = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"a": "b"}}}]}}
    assert one(render({"replicaCount": 2, "affinity": own}), "Deployment")["spec"]["template"]["spec"][
        "affinity"] == own


def test_extra_labels_cannot_replace_the_charts_own():
    objects = render({"podLabels": {"team": "ml", "app.kubernetes.io/component": "other"}})
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["app.kubernetes.io/component"] == "operator"
    monitors = render({"monitoring": {"serviceMonitor": {"enabled": True, "labels": {
        "release": "kps", "app.kubernetes.io/name": "other"}}}}, api_versions=MONITORING_APIS)
    labels = one(monitors, "ServiceMonitor")["metadata"]["labels"]
    assert labels["release"] == "kps" and labels["app.kubernetes.io/name"] == "rosetta"


def test_no_peering_by_default():
    objects = render()
    assert not [a for a in container(objects)["args"] if a.startswith("--peering")]
    assert not [o for o in objects if o["apiVersion"].startswith("kopf.dev")]


# ------------------------------------------------------------------------------ monitoring


@pytest.mark.parametrize("kind,value", [("PodMonitor", "podMonitor"), ("ServiceMonitor", "serviceMonitor"),
                                        ("PrometheusRule", "prometheusRule")])
def test_monitor_without_prometheus_operator_fails_clearly(kind, value):
    with pytest.raises(RenderError) as err:
        render({"monitoring": {value: {"enabled": True}}})
    message = str(err.value)
    assert f"monitoring.{value}.enabled=true needs the Prometheus operator's {kind} CRD" in message
    assert f"--api-versions monitoring.coreos.com/v1/{kind}" in message
    # Given the API, it renders.
    assert one(render({"monitoring": {value: {"enabled": True}}}, api_versions=[f"monitoring.coreos.com/v1/{kind}"]),
               kind)


def test_pod_monitor_selects_training_pods_and_not_the_operator():
    objects = render(MONITORS_ON, api_versions=MONITORING_APIS)
    monitor = one(objects, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["rosetta-system"]}

    training = load_training(QUICKSTART)
    jobset = render_training(training.metadata.name, "ml", training.spec).jobset
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == {k: BASE_LABELS[k] for k in selector}
    assert "metrics" in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]

    operator_pod = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= operator_pod.items()


def test_pod_monitor_follows_watched_namespaces():
    objects = render({**MONITORS_ON, "watchNamespaces": ["ml"]}, api_versions=MONITORING_APIS)
    assert one(objects, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    objects = render({**MONITORS_ON, "clusterWide": True}, api_versions=MONITORING_APIS)
    assert one(objects, "PodMonitor")["spec"]["namespaceSelector"] == {"any": True}


def test_service_monitor_scrapes_the_operator_service():
    objects = render(MONITORS_ON, api_versions=MONITORING_APIS)
    monitor, service, deploy = one(objects, "ServiceMonitor"), one(objects, "Service"), one(objects, "Deployment")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["rosetta-system"]}


def alerts(objects: list[dict]) -> dict[str, dict]:
    return {r["alert"]: r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}


def test_alerts():
    rules = alerts(render(MONITORS_ON, api_versions=MONITORING_APIS))
    assert set(rules) == {"RosettaTrainingNoProgress", "RosettaTrainingLossNaN", "RosettaTrainingRestarting",
                          "RosettaTrainingRestartsBurning", "RosettaTrainingFailed", "RosettaTrainingStalled",
                          "RosettaAttemptsFailing", "RosettaNodeExcluded", "RosettaOperatorDown"}
    assert "max_over_time(rosetta_operator_training_stalled[15m])" in rules["RosettaTrainingStalled"]["expr"]
    assert "rosetta_step[15m]" in rules["RosettaTrainingNoProgress"]["expr"]
    assert "rosetta_world_size" in rules["RosettaTrainingNoProgress"]["expr"]
    assert "rosetta_loss != rosetta_loss" in rules["RosettaTrainingLossNaN"]["expr"]
    assert "rosetta_restarts[1h]" in rules["RosettaTrainingRestarting"]["expr"]
    assert 'max by (namespace, training) (rosetta_operator_training_phase{phase="Failed"}) == 1' in \
        rules["RosettaTrainingFailed"]["expr"]
    assert '"name", "$1", "training", "(.*)"' in rules["RosettaTrainingFailed"]["expr"]
    # Prometheus' own templating survives Helm's.
    assert "{{ $labels.training }}" in rules["RosettaTrainingNoProgress"]["annotations"]["summary"]
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_alert_thresholds_are_values():
    values = {"monitoring": {"prometheusRule": {"enabled": True, "noProgressMinutes": 42, "restartsThreshold": 5,
                                                "restartsWindow": "3h"}}}
    rules = alerts(render(values, api_versions=MONITORING_APIS))
    assert "rosetta_step[42m]" in rules["RosettaTrainingNoProgress"]["expr"]
    assert "42 minutes" in rules["RosettaTrainingNoProgress"]["annotations"]["summary"]
    assert "rosetta_restarts[3h]" in rules["RosettaTrainingRestarting"]["expr"]
    assert rules["RosettaTrainingRestarting"]["expr"].rstrip().endswith(">= 5")


# ------------------------------------------------------------------------------ dashboards


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    objects = render({"monitoring": {"dashboards": {"enabled": True}}})
    maps = {cm["metadata"]["name"]: cm for cm in of_kind(objects, "ConfigMap") if "grafana_dashboard" in
            cm["metadata"]["labels"]}
    assert set(maps) == {f"rosetta-dashboard-{p.stem}" for p in DASHBOARDS}
    for path in DASHBOARDS:
        cm = maps[f"rosetta-dashboard-{path.stem}"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {path.name: path.read_text().rstrip("\n")}
    custom = render({"monitoring": {"dashboards": {"enabled": True, "label": "dash", "labelValue": "yes",
                                                   "namespace": "grafana"}}})
    for cm in of_kind(custom, "ConfigMap"):
        if cm["metadata"]["name"] != "rosetta-policy":
            assert cm["metadata"]["labels"]["dash"] == "yes" and cm["metadata"]["namespace"] == "grafana"


def test_dashboard_files():
    assert [p.name for p in DASHBOARDS] == ["gpu-and-network.json", "operator-health.json", "training-overview.json"]
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    assert uids == {"rosetta-training-overview", "rosetta-operator-health", "rosetta-gpu-network"}
    titles = {p["title"] for p in json.loads((CHART / "dashboards" / "training-overview.json").read_text())["panels"]}
    for wanted in ("Training loss", "Learning rate", "Validation BLEU per language", "Throughput (tokens/s)", "MFU",
                   "Step time", "Restarts"):
        assert wanted in titles
    gpu = json.loads((CHART / "dashboards" / "gpu-and-network.json").read_text())
    assert {v["name"] for v in gpu["templating"]["list"]} == {"datasource", "namespace", "training", "node"}
    assert {p["title"] for p in gpu["panels"]} >= {
        "Step time breakdown", "Tokens/s per node", "Is the network the bottleneck?", "GPU utilisation",
        "Tensor-core activity", "GPU memory", "NVLink bytes/s", "PCIe bytes/s", "Network bytes/s per node"}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            # A sentence that says what the panel shows, not an empty string or its title again.
            description = panel.get("description", "")
            assert len(description.split()) >= 5 and description != panel["title"], (path.name, panel["title"])


def promql_of_dashboards() -> list[str]:
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        out += [t["expr"] for p in board["panels"] for t in p["targets"]]
        out += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    return out


def promql_of_rules() -> list[str]:
    return [rule["expr"] for rule in alerts(render(MONITORS_ON, api_versions=MONITORING_APIS)).values()]


def test_every_metric_in_dashboards_and_alerts_is_exposed():
    """Names come from rosetta_contract.metric_names: the exact names the endpoints expose."""
    known = set(metric_names.TRAINER_METRICS) | set(metric_names.OPERATOR_METRICS)
    histograms = set(getattr(metric_names, "HISTOGRAMS", ()))
    used = {name for expr in promql_of_dashboards() + promql_of_rules()
            for name in re.findall(r"\brosetta_[a-z0-9_]*[a-z0-9]", expr)}
    assert len(used) > 20

    def exposed(name: str) -> bool:
        if name in known:
            return True
        base, _, suffix = name.rpartition("_")
        return suffix in ("bucket", "sum", "count") and base in histograms

    assert sorted(n for n in used if not exposed(n)) == []


# ------------------------------------------------------------------------------ clouds


@pytest.mark.parametrize("cloud,registry", [("eks", ".dkr.ecr."), ("gke", "-docker.pkg.dev/")])
def test_cloud_values(cloud, registry):
    """The cloud values with the helm install command of docs/eks.md and docs/gke.md (whose images
    test_chart_images.py checks)."""
    (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
    assert [p.name for p in install.values_files] == [f"values-{cloud}.yaml"]
    with pytest.raises(RenderError, match="needs the Prometheus operator's"):
        render_install(install, api_versions=())
    objects = render_install(install)
    c = container(objects)
    assert registry in c["image"]
    assert "annotations" not in one(objects, "ServiceAccount")["metadata"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] and pod["tolerations"]
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
        assert one(objects, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert len(of_kind(objects, "ConfigMap")) == len(DASHBOARDS) + 1  # and the policy
    # The guide's trainings' namespace is the one watched, with a Role there; everything else is as by
    # default.
    (watched,) = install.values["watchNamespaces"]
    assert [(r["kind"], r["metadata"]["namespace"]) for r in objects if r["kind"] in ("Role", "RoleBinding")] == [
        ("Role", watched), ("RoleBinding", watched)]
    assert c["args"] == container(render({"watchNamespaces": [watched]}))["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


# ------------------------------------------------------------------------ raw manifests


def test_raw_operator_manifest_is_fresh():
    assert OPERATOR_MANIFEST.exists(), f"manifests/operator.yaml is missing; generate it with: {REGENERATE}"
    assert OPERATOR_MANIFEST.read_text() == raw_manifest_text(), \
        f"manifests/operator.yaml is stale; regenerate it with: {REGENERATE}"


def test_raw_operator_manifest_contents():
    objects = [d for d in yaml.safe_load_all(OPERATOR_MANIFEST.read_text()) if d]
    assert objects == raw_manifests()
    assert kinds(objects) == [("Namespace", "rosetta-system"), ("ServiceAccount", "rosetta"),
                              ("ConfigMap", "rosetta-policy"), ("ClusterRole", "rosetta-rosetta-system"),
                              ("ClusterRoleBinding", "rosetta-rosetta-system"), ("Role", "rosetta"),
                              ("RoleBinding", "rosetta"), ("Service", "rosetta-metrics"), ("Deployment", "rosetta"),
                              ("NetworkPolicy", "rosetta")]
