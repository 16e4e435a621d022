"""charts/rosetta against a real kube-apiserver (the version tests/envtest/versions.env pins, RBAC on):
every rendered object is created and read back as sent, and the apiserver's authorizer confirms the
operator's ServiceAccount may do what the handlers do, where the install mode says, and nothing more:
by default only in the release namespace (never kube-system), cluster-wide only with clusterWide.

Each case renders the chart into a fresh namespace (the release namespace), so cluster-scoped names
(ClusterRole rosetta-<namespace>, …) are unique; they are deleted afterwards. The Prometheus
operator's CRDs are stood in for by minimal ones (any spec accepted). No controller runs the
Deployment: this is about what the API accepts and authorizes.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
from kubernetes.client.rest import ApiException

from support.chart import CHART, GUIDES, MONITORING_APIS, helm_installs, render
from support.cluster import Cluster

pytestmark = pytest.mark.integration

MONITORING_KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors",
                    "PrometheusRule": "prometheusrules"}
TT_CRD = "translationtrainings.rosetta.dev"


def stand_in_crd(group: str, kind: str, plural: str, scope: str = "Namespaced") -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": scope,
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Cluster) -> None:
    for kind, plural in MONITORING_KINDS.items():
        try:
            cluster.install_crd(stand_in_crd("monitoring.coreos.com", kind, plural))
        except ApiException as exc:
            if exc.status != 409:
                raise


def fresh_namespace(cluster: Cluster, base: str) -> str:
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    return name


def missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Where `got` lacks or changed what `sent` has (the server may add defaults, nothing else)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [f"{path or '(root)'}: sent a mapping, got {got!r}"]
        return [p for k, v in sent.items()
                for p in ([f"{path}.{k}: pruned or dropped"] if k not in got else missing(v, got[k], f"{path}.{k}"))]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [f"{path}: sent {len(sent)} items, got {got!r}"]
        return [p for i, (s, g) in enumerate(zip(sent, got)) for p in missing(s, g, f"{path}[{i}]")]
    if sent != got and str(sent) == str(got):
        return []  # quantities and the like come back as strings
    return [] if sent == got else [f"{path}: sent {sent!r}, got {got!r}"]


def without_cel(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_cel(v) for k, v in value.items() if k != "x-kubernetes-validations"}
    if isinstance(value, list):
        return [without_cel(v) for v in value]
    return value


class Applied:
    """Create the chart's objects in order; remember the cluster-scoped ones to delete them."""

    def __init__(self, cluster: Cluster):
        from kubernetes.dynamic import DynamicClient

        self.cluster = cluster
        self.dyn = DynamicClient(cluster.api)
        self.cluster_scoped: list[tuple[str, str, str]] = []

    def resource(self, obj: dict):
        return self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    def create(self, objects: list[dict]) -> list[dict]:
        """Server-side creation of every object, CRDs first; each is read back and compared."""
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            name = crd["metadata"]["name"]
            if name == TT_CRD:
                # Installed by the session: the chart's must be the same CRD (compared without its CEL
                # rules, which an apiserver older than 1.25 drops).
                installed = self.cluster.api.sanitize_for_serialization(
                    self.cluster.ext.read_custom_resource_definition(name))
                assert missing(without_cel(crd["spec"]), installed["spec"], "spec") == []
                continue
            self.cluster.install_crd(crd)
            self.cluster_scoped.append((crd["apiVersion"], crd["kind"], name))
        if crds:
            self.dyn.resources.invalidate_cache()
        got = []
        for obj in objects:
            if obj["kind"] == "CustomResourceDefinition":
                continue
            resource = self.resource(obj)
            namespace = obj["metadata"].get("namespace")
            created = resource.create(body=obj, namespace=namespace).to_dict()
            if not resource.namespaced:
                self.cluster_scoped.append((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]))
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            back = resource.get(name=obj["metadata"]["name"], namespace=namespace).to_dict()
            assert missing(body, {k: back.get(k) for k in body}) == [], f"{obj['kind']} {obj['metadata']['name']}"
            assert missing(obj["metadata"].get("labels", {}), back["metadata"].get("labels", {})) == []
            got.append(created)
        return got

    def cleanup(self) -> None:
        for api_version, kind, name in reversed(self.cluster_scoped):
            try:
                self.dyn.resources.get(api_version=api_version, kind=kind).delete(name=name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def applied(cluster: Cluster) -> Iterator[Applied]:
    a = Applied(cluster)
    try:
        yield a
    finally:
        a.cleanup()


# ------------------------------------------------------------------------------ authorization


def can(cluster: Cluster, sa_namespace: str, sa: str, verb: str, group: str, resource: str,
        namespace: str | None = None) -> bool:
    """The apiserver's authorizer: may system:serviceaccount:SA_NAMESPACE:SA do this?"""
    from kubernetes import client

    subresource = ""
    if "/" in resource:
        resource, subresource = resource.split("/", 1)
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if namespace:
        attributes["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{sa_namespace}:{sa}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"],
        "resourceAttributes": attributes}}
    result = client.AuthorizationV1Api(cluster.api).create_subject_access_review(review)
    return bool(result.status.allowed)


# What the handlers and kopf do in a watched namespace: (verb, group, resource).
HANDLERS_NEED = [
    *[(v, "rosetta.dev", "translationtrainings") for v in ("get", "list", "watch", "patch")],
    ("patch", "rosetta.dev", "translationtrainings/status"),
    ("update", "rosetta.dev", "translationtrainings/finalizers"),
    *[(v, "jobset.x-k8s.io", "jobsets") for v in ("get", "list", "watch", "create", "patch")],
    # create: the after-training evaluation; patch: ending a stalled attempt (activeDeadlineSeconds)
    *[(v, "batch", "jobs") for v in ("get", "list", "watch", "create", "patch")],
    *[(v, "", "configmaps") for v in ("get", "create", "patch")],
    ("list", "", "pods"),
    ("create", "", "events"),
]
NEVER_IN_NAMESPACE = [
    ("get", "", "secrets"), ("list", "", "secrets"), ("create", "", "pods"), ("delete", "", "pods"),
    ("create", "", "pods/exec"), ("delete", "jobset.x-k8s.io", "jobsets"), ("delete", "", "configmaps"),
    ("delete", "batch", "jobs"),
    ("delete", "rosetta.dev", "translationtrainings"), ("update", "rosetta.dev", "translationtrainings"),
    ("create", "rosetta.dev", "translationtrainings"), ("create", "apps", "deployments"),
    ("create", "rbac.authorization.k8s.io", "rolebindings"), ("create", "", "serviceaccounts/token"),
]
NEVER_CLUSTER = [
    ("delete", "", "namespaces"), ("create", "", "namespaces"), ("list", "", "secrets"), ("list", "", "nodes"),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("delete", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
]
CRD_READ = [(v, "apiextensions.k8s.io", "customresourcedefinitions") for v in ("get", "list", "watch")]


def assert_access(cluster: Cluster, sa_ns: str, sa: str, allowed: list, denied: list, namespace: str | None):
    wrong = [f"cannot {v} {g or 'core'}/{r} in {namespace or 'the cluster'}" for v, g, r in allowed
             if not can(cluster, sa_ns, sa, v, g, r, namespace)]
    wrong += [f"CAN {v} {g or 'core'}/{r} in {namespace or 'the cluster'}" for v, g, r in denied
              if can(cluster, sa_ns, sa, v, g, r, namespace)]
    assert wrong == []


# ------------------------------------------------------------------------------------ tests


def guide_install(cloud: str | None, watched: str) -> tuple[list, dict]:
    """(values files, --set values) of the guide's helm install (docs/eks.md, docs/gke.md), watching
    `watched` instead of the guide's trainings' namespace (which this apiserver lacks): the cloud
    values files alone name placeholder images, which the chart refuses."""
    if cloud is None:
        return [], {}
    (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
    assert install.values_files == [CHART / f"values-{cloud}.yaml"]
    assert len(install.values["watchNamespaces"]) == 1, "the guide watches its trainings' namespace"
    return install.values_files, {**install.values, "watchNamespaces": [watched]}


# A stolen token of the operator must not reach the cluster's own plumbing: CoreDNS's and
# aws-auth's ConfigMaps live in kube-system.
KUBE_SYSTEM_WRITES = [("patch", "", "configmaps"), ("update", "", "configmaps"), ("create", "jobset.x-k8s.io", "jobsets"),
                      ("create", "batch", "jobs")]


@pytest.mark.parametrize("cloud", [None, "eks", "gke"], ids=["default", "eks", "gke"])
def test_default_release_writes_only_where_it_watches(cluster: Cluster, monitoring_crds: None, applied: Applied,
                                                      cloud):
    """The default install (the release namespace) and the guides' (their trainings' namespace)."""
    release_ns = fresh_namespace(cluster, "rosetta-system")
    other_ns = fresh_namespace(cluster, "ml")
    trainings_ns = fresh_namespace(cluster, "mt") if cloud else release_ns
    try:
        values_files, values = guide_install(cloud, trainings_ns)
        objects = render(values, values_files=values_files, namespace=release_ns, api_versions=MONITORING_APIS)
        created = applied.create(objects)
        kinds = {o["kind"] for o in created}
        assert {"ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
                "Deployment", "NetworkPolicy"} <= kinds
        if cloud:
            assert set(MONITORING_KINDS) <= kinds
        assert [o["metadata"]["namespace"] for o in created if o["kind"] in ("Role", "RoleBinding")] == [
            trainings_ns] * 2

        sa = "rosetta"
        assert_access(cluster, release_ns, sa, HANDLERS_NEED, NEVER_IN_NAMESPACE, trainings_ns)
        for ns in {other_ns, release_ns, "kube-system"} - {trainings_ns}:
            assert_access(cluster, release_ns, sa, [], HANDLERS_NEED + NEVER_IN_NAMESPACE, ns)
        assert_access(cluster, release_ns, sa, [], KUBE_SYSTEM_WRITES, "kube-system")
        # Cluster-wide: reading CRDs, nothing else (not even namespaces).
        assert_access(cluster, release_ns, sa, CRD_READ,
                      NEVER_CLUSTER + [("list", "", "namespaces"), ("watch", "", "namespaces"),
                                       ("list", "rosetta.dev", "translationtrainings"),
                                       ("list", "jobset.x-k8s.io", "jobsets"), ("patch", "", "configmaps")], None)
        # Another namespace's ServiceAccount of the same name gets nothing.
        assert not can(cluster, other_ns, sa, "list", "rosetta.dev", "translationtrainings", trainings_ns)
    finally:
        for ns in {release_ns, other_ns, trainings_ns}:
            cluster.core.delete_namespace(ns)


def test_cluster_wide_release_is_what_it_says(cluster: Cluster, monitoring_crds: None, applied: Applied):
    """clusterWide=true: the handlers' rules in every namespace, kube-system included (RBAC cannot
    leave a namespace out; docs/helm.md, Install modes), and still nothing beyond them."""
    release_ns = fresh_namespace(cluster, "rosetta-system")
    other_ns = fresh_namespace(cluster, "ml")
    try:
        created = applied.create(render({"clusterWide": True}, namespace=release_ns, api_versions=MONITORING_APIS))
        kinds = {o["kind"] for o in created}
        assert {"ClusterRole", "ClusterRoleBinding", "NetworkPolicy"} <= kinds and "Role" not in kinds

        sa = "rosetta"
        for ns in (other_ns, release_ns, "kube-system"):
            assert_access(cluster, release_ns, sa, HANDLERS_NEED, NEVER_IN_NAMESPACE, ns)
        assert_access(cluster, release_ns, sa,
                      CRD_READ + [("list", "", "namespaces"), ("watch", "", "namespaces")], NEVER_CLUSTER, None)
        assert not can(cluster, other_ns, sa, "list", "rosetta.dev", "translationtrainings", other_ns)
    finally:
        for ns in (release_ns, other_ns):
            cluster.core.delete_namespace(ns)


def test_watched_namespaces_release_is_confined_to_them(cluster: Cluster, monitoring_crds: None,
                                                        applied: Applied):
    release_ns = fresh_namespace(cluster, "rosetta-system")
    watched = fresh_namespace(cluster, "ml")
    other = fresh_namespace(cluster, "other")
    try:
        values = {"watchNamespaces": [watched], "monitoring": {
            "podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}}
        objects = render(values, namespace=release_ns, api_versions=MONITORING_APIS)
        created = applied.create(objects)
        assert [o["metadata"]["namespace"] for o in created if o["kind"] in ("Role", "RoleBinding")] == [watched] * 2

        sa = "rosetta"
        assert_access(cluster, release_ns, sa, HANDLERS_NEED, NEVER_IN_NAMESPACE, watched)
        # Nothing outside the watched namespace: not the release's own, not another, not kube-system.
        for ns in (other, release_ns, "kube-system"):
            assert_access(cluster, release_ns, sa, [], HANDLERS_NEED + NEVER_IN_NAMESPACE, ns)
        # Cluster-wide: reading CRDs, nothing else (not even namespaces).
        assert_access(cluster, release_ns, sa, CRD_READ,
                      NEVER_CLUSTER + [("list", "", "namespaces"), ("watch", "", "namespaces"),
                                       ("list", "rosetta.dev", "translationtrainings"),
                                       ("list", "jobset.x-k8s.io", "jobsets")], None)
    finally:
        for ns in (release_ns, watched, other):
            cluster.core.delete_namespace(ns)


def test_peering_objects_are_accepted(cluster: Cluster, applied: Applied):
    """Two replicas: kopf's peering CRDs, the ClusterKopfPeering, the rights kopf needs on it, and
    their PodDisruptionBudget."""
    release_ns = fresh_namespace(cluster, "rosetta-system")
    try:
        objects = render({"replicaCount": 2, "clusterWide": True, "peering": {"name": f"rosetta-{release_ns}"}},
                         namespace=release_ns)
        created = applied.create(objects)
        (peering,) = [o for o in created if o["kind"] == "ClusterKopfPeering"]
        # Two replicas: drains evict one at a time.
        assert [o["kind"] for o in created].count("PodDisruptionBudget") == 1
        assert peering["metadata"]["name"] == f"rosetta-{release_ns}"
        # kopf writes its replicas' presence into the peering object's status: it must be kept.
        resource = applied.dyn.resources.get(api_version="kopf.dev/v1", kind="ClusterKopfPeering")
        resource.patch(name=peering["metadata"]["name"], body={"status": {"pod-a": {"priority": 0}}},
                       content_type="application/merge-patch+json")
        got = resource.get(name=peering["metadata"]["name"]).to_dict()
        assert got["status"] == {"pod-a": {"priority": 0}}
        assert_access(cluster, release_ns, "rosetta",
                      [(v, "kopf.dev", "clusterkopfpeerings") for v in ("get", "list", "watch", "patch")],
                      [("delete", "kopf.dev", "clusterkopfpeerings"), ("create", "kopf.dev", "clusterkopfpeerings")],
                      None)
    finally:
        cluster.core.delete_namespace(release_ns)
