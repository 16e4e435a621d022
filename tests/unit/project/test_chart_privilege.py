"""What each install mode of charts/rosetta grants the operator (RBAC), and the NetworkPolicy around
its pod: by default, writes only in the release namespace and no cluster-wide write at all;
cluster-wide only when asked for. The apiserver's authorizer confirms the same grants in
tests/integration/test_chart_apply.py."""

from __future__ import annotations

import pytest

from rosetta_contract.spec import load_training
from rosetta_operator.names import BASE_LABELS
from rosetta_operator.render import render as render_training
from support.chart import GUIDES, REPO, RenderError, helm_installs, render, render_install

QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
READ = {"get", "list", "watch"}
RBAC = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    (found,) = of_kind(objects, kind)
    return found


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def args(objects: list[dict]) -> list[str]:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def role_namespaces(objects: list[dict]) -> dict[str, list[str]]:
    return {kind: sorted(o["metadata"]["namespace"] for o in of_kind(objects, kind)) for kind in ("Role", "RoleBinding")}


# ------------------------------------------------------------------------------------- RBAC


@pytest.mark.parametrize("namespace", ["rosetta-system", "ml-ops"])
def test_default_install_writes_only_in_the_release_namespace(namespace):
    objects = render(namespace=namespace)
    assert role_namespaces(objects) == {"Role": [namespace], "RoleBinding": [namespace]}
    assert f"--namespace={namespace}" in args(objects) and "--all-namespaces" not in args(objects)
    cluster_role = one(objects, "ClusterRole")
    # Cluster-wide, reads only, and only the CRDs kopf's discovery reads.
    assert {verb for _, _, verb in grants(cluster_role["rules"])} <= READ
    assert grants(cluster_role["rules"]) == {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in READ}
    role = one(objects, "Role")
    assert ("", "configmaps", "patch") in grants(role["rules"]) and ("jobset.x-k8s.io", "jobsets", "create") in \
        grants(role["rules"])
    assert one(objects, "RoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "rosetta", "namespace": namespace}]


def test_watched_namespaces_replace_the_release_namespace():
    objects = render({"watchNamespaces": ["ml", "nlp", "ml"]})
    assert role_namespaces(objects) == {"Role": ["ml", "nlp"], "RoleBinding": ["ml", "nlp"]}
    assert [a for a in args(objects) if a.startswith("--namespace")] == ["--namespace=ml", "--namespace=nlp"]
    assert {verb for _, _, verb in grants(one(objects, "ClusterRole")["rules"])} <= READ


def test_cluster_wide_is_opt_in_and_then_writes_everywhere():
    objects = render({"clusterWide": True})
    assert "--all-namespaces" in args(objects)
    assert not [a for a in args(objects) if a.startswith("--namespace")]
    assert of_kind(objects, "Role") == of_kind(objects, "RoleBinding") == []
    cluster = grants(one(objects, "ClusterRole")["rules"])
    assert {("", "configmaps", "patch"), ("jobset.x-k8s.io", "jobsets", "create"), ("batch", "jobs", "create"),
            ("", "namespaces", "list")} <= cluster
    # Even so: no delete, no secrets, no pods created.
    assert not {g for g in cluster if g[2] in ("delete", "deletecollection", "update", "*") and g[1] !=
                "translationtrainings/finalizers"}
    assert not {g for g in cluster if g[1] in ("secrets", "*")}
    assert ("", "pods", "create") not in cluster


def test_cluster_wide_with_watched_namespaces_is_refused():
    with pytest.raises(RenderError, match=r"clusterWide=true watches every namespace, and watchNamespaces lists "
                                          r"ml: set one or the other"):
        render({"clusterWide": True, "watchNamespaces": ["ml"]})


def test_no_rbac_renders_no_grant_in_any_mode():
    for values in ({}, {"clusterWide": True}, {"watchNamespaces": ["ml"]}):
        assert not [o for o in render({**values, "rbac": {"create": False}}) if o["kind"] in RBAC]


@pytest.mark.parametrize("cloud", sorted(GUIDES))
def test_the_cloud_guides_install_the_narrow_mode(cloud):
    (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
    objects = render_install(install)
    assert "clusterWide" not in install.values
    (watched,) = install.values["watchNamespaces"]
    assert watched != install.namespace  # trainings apart from the operator's own namespace
    assert role_namespaces(objects) == {"Role": [watched], "RoleBinding": [watched]}
    assert {verb for _, _, verb in grants(one(objects, "ClusterRole")["rules"])} <= READ


# ---------------------------------------------------------------------------- NetworkPolicy


def rules_by_port(rules: list[dict]) -> dict[object, list[dict]]:
    out: dict[object, list[dict]] = {}
    for rule in rules:
        for port in rule["ports"]:
            out.setdefault(port["port"], []).append(rule)
    return out


def test_network_policy_selects_the_operator_pods_both_ways():
    objects = render()
    policy = one(objects, "NetworkPolicy")
    deploy = one(objects, "Deployment")
    assert policy["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert policy["spec"]["podSelector"] == {"matchLabels": deploy["spec"]["selector"]["matchLabels"]}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # Every rule names its ports: nothing is allowed on every port.
    for rule in policy["spec"]["ingress"] + policy["spec"]["egress"]:
        assert rule["ports"], rule


def test_ingress_is_the_metrics_port_from_monitoring_and_helm_test_and_the_health_port():
    objects = render(tests=True)
    policy = one(objects, "NetworkPolicy")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"] for p in container["ports"]} == {"metrics", "healthz"}
    by_port = rules_by_port(policy["spec"]["ingress"])
    assert set(by_port) == {"metrics", "healthz"}
    (metrics,) = by_port["metrics"]
    monitoring, test_pod = metrics["from"]
    assert monitoring == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    pod = one(objects, "Pod")  # `helm test`'s, of this release, in this namespace
    assert test_pod["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "namespaceSelector" not in test_pod and pod["metadata"]["namespace"] == policy["metadata"]["namespace"]
    assert not test_pod["podSelector"]["matchLabels"].items() <= \
        one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    (healthz,) = by_port["healthz"]
    assert "from" not in healthz  # the kubelet's probes, whatever the network plugin


def test_metrics_sources_are_values():
    peers = [{"namespaceSelector": {"matchLabels": {"team": "observability"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    (metrics,) = rules_by_port(one(render({"networkPolicy": {"metricsFrom": peers}}), "NetworkPolicy")[
        "spec"]["ingress"])["metrics"]
    assert metrics["from"][:-1] == peers
    (metrics,) = rules_by_port(one(render({"networkPolicy": {"metricsFrom": []}}), "NetworkPolicy")[
        "spec"]["ingress"])["metrics"]
    assert [list(p) for p in metrics["from"]] == [["podSelector"]]  # helm test's pod alone


def egress(values: dict | None = None) -> dict[object, list[dict]]:
    return rules_by_port(one(render(values), "NetworkPolicy")["spec"]["egress"])


def test_egress_is_the_api_server_dns_and_the_progress_scrape():
    by_port = egress()
    assert set(by_port) == {443, 6443, 53, "metrics"}
    (api,) = by_port[443]
    assert api is by_port[6443][0] and "to" not in api  # any address, on these ports only
    assert {p["protocol"] for rule in by_port[53] for p in rule["ports"]} == {"UDP", "TCP"}
    (scrape,) = by_port["metrics"]
    (peer,) = scrape["to"]
    assert peer["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["rosetta-system"]}]}

    # The peer is rank 0 of a training the operator rendered, on the port it scrapes.
    training = load_training(QUICKSTART)
    jobset = render_training(training.metadata.name, "rosetta-system", training.spec).jobset
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert peer["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert peer["podSelector"]["matchLabels"] == {k: BASE_LABELS[k] for k in peer["podSelector"]["matchLabels"]}
    assert "metrics" in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]


@pytest.mark.parametrize("values, selector", [
    ({"watchNamespaces": ["ml", "nlp"]},
     {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml", "nlp"]}]}),
    ({"clusterWide": True}, {}),
], ids=["watched", "cluster-wide"])
def test_progress_scrape_follows_the_watched_namespaces(values, selector):
    ((peer,),) = [rule["to"] for rule in egress(values)["metrics"]]
    assert peer["namespaceSelector"] == selector


def test_api_server_addresses_ports_and_extra_egress_are_values():
    proxy = {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [{"port": 3128, "protocol": "TCP"}]}
    by_port = egress({"networkPolicy": {"apiServerPorts": [443], "apiServerCIDRs": ["172.16.0.2/32", "172.16.0.3/32"],
                                        "extraEgress": [proxy]}})
    assert set(by_port) == {443, 53, "metrics", 3128}
    assert by_port[443][0]["to"] == [{"ipBlock": {"cidr": "172.16.0.2/32"}}, {"ipBlock": {"cidr": "172.16.0.3/32"}}]
    assert by_port[3128] == [proxy]


def test_network_policy_can_be_left_out():
    assert of_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []
