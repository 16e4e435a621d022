"""charts/rosetta installed by the real Helm engine (the helm binary envtest/versions.env pins) with
its default install mode, and the operator run exactly as the chart's Deployment runs it, with the
chart's ServiceAccount and policy: a training goes from created to Succeeded with nothing but the
chart's RBAC in the release namespace.

The Deployment's own pod runs on a kwok node, which does not run containers, so the operator runs
here as a process with the Deployment's arguments, a token of its ServiceAccount (issued by the
TokenRequest API, as the kubelet would mount it) and the policy ConfigMap's file at the path the
pod would mount it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import yaml
from test_lifecycle import small_training, wait_running
from workloads import provision, status

from control_plane import find_helm, free_port, versions
from support.chart import GUIDES, MONITORING_APIS, helm_installs
from support.cluster import OperatorProcess, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rosetta"


def helm(cluster, tmp_path: Path, *args: str, kubeconfig: str = "") -> subprocess.CompletedProcess:
    # Without a cluster, an empty kubeconfig: never the user's own.
    kubeconfig = kubeconfig or (cluster.kubeconfig if cluster is not None else str(tmp_path / "no-kubeconfig"))
    env = {**os.environ, "KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}
    binary = cluster.cp.assets.bin("helm") if cluster is not None else find_helm()
    return subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=180)


def service_account_kubeconfig(cluster, namespace: str, account: str, path: Path) -> str:
    token = cluster.core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return str(path)


def with_policy_file(cluster, namespace: str, deployment, args: list[str], tmp_path: Path) -> list[str]:
    """The Deployment's arguments, its `--policy` pointed at a copy of the ConfigMap the pod mounts."""
    pod = deployment.spec.template.spec
    (mount,) = [m for m in pod.containers[0].volume_mounts if m.name == "policy"]
    (volume,) = [v for v in pod.volumes if v.name == "policy"]
    configmap = cluster.core.read_namespaced_config_map(volume.config_map.name, namespace)
    (name,) = configmap.data
    (tmp_path / name).write_text(configmap.data[name])
    flag = f"--policy={mount.mount_path}/{name}"
    assert flag in args, args
    return [f"--policy={tmp_path / name}" if a == flag else a for a in args]


def test_chart_install_runs_a_training_with_the_charts_rbac(live_cluster, live_namespace, tmp_path):
    ns = live_namespace
    # The JobSet check (a lookup of its CRD, which this cluster has) lets the install through. No
    # watchNamespaces: by default the operator watches the release namespace, where the training goes.
    liveness, metrics = free_port(), free_port()
    installed = helm(live_cluster, tmp_path, "install", "rosetta", str(CHART), "--namespace", ns,
                     "--set", "crd.install=false",  # the session's cluster has the CRD already
                     "--set", f"operator.livenessPort={liveness}", "--set", f"operator.metricsPort={metrics}",
                     "--wait", "--timeout", "120s")
    assert installed.returncode == 0, installed.stderr
    listed = helm(live_cluster, tmp_path, "list", "--namespace", ns, "--output", "yaml")
    assert yaml.safe_load(listed.stdout)[0]["status"] == "deployed"

    import kubernetes
    apps = kubernetes.client.AppsV1Api(live_cluster.api)
    (deployment,) = apps.list_namespaced_deployment(ns).items
    assert deployment.status.available_replicas == 1  # scheduled and Ready (on a kwok node)
    container = deployment.spec.template.spec.containers[0]
    assert container.command == ["rosetta", "operator"]
    assert f"--namespace={ns}" in container.args and "--all-namespaces" not in container.args
    account = deployment.spec.template.spec.service_account_name
    kubeconfig = service_account_kubeconfig(live_cluster, ns, account, tmp_path / "operator.kubeconfig")
    args = with_policy_file(live_cluster, ns, deployment, container.args, tmp_path)

    op = OperatorProcess(live_cluster, f"operator-helm-{ns}", *args, kubeconfig=kubeconfig)
    try:
        op.wait_healthy(liveness)
        doc = small_training(ns, "charted")
        provision(live_cluster, ns, doc)
        live_cluster.create_training(ns, doc)
        pods = wait_running(live_cluster, ns, "charted")
        for pod in pods:
            live_cluster.end_pod(ns, pod.metadata.name, 0)
        wait_for(lambda: status(live_cluster, ns, "charted").get("phase") == "Succeeded", "Succeeded", 90)
        op.check_alive()
        # kopf lists namespaces when it may and falls back to the given ones when it may not (the chart
        # grants no cluster-wide namespace access to a namespaced release); anything else is a gap.
        denied = [line for line in op.log.read_text().splitlines()
                  if "Forbidden" in line and "/api/v1/namespaces ->" not in line]
        assert not denied, "\n".join(denied[:5])
    finally:
        op.stop()

    removed = helm(live_cluster, tmp_path, "uninstall", "rosetta", "--namespace", ns, "--wait")
    assert removed.returncode == 0, removed.stderr
    assert not apps.list_namespaced_deployment(ns).items


# ------------------------------------------------------------------ the helm binary, no cluster


def test_helm_binary_lints_and_validates_values_against_the_schema(tmp_path):
    # Offline, Helm checks Chart.yaml's kubeVersion against --kube-version (a helm built from Go
    # modules would otherwise assume v1.20.0): the version the tests run.
    offline = ["--kube-version", versions()["KUBERNETES_VERSION"]]
    linted = helm(None, tmp_path, "lint", str(CHART), "--strict", "--set", "icon=x")
    assert linted.returncode != 0 and "additional properties 'icon' not allowed" in linted.stdout + linted.stderr
    linted = helm(None, tmp_path, "lint", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    monitoring = [f"--api-versions={api}" for api in MONITORING_APIS]
    for cloud in ("eks", "gke"):
        # The guide's command (docs/eks.md, docs/gke.md) installs; the cloud values alone, which name
        # placeholder images, are refused, saying which value to set.
        (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
        linted = helm(None, tmp_path, "lint", str(CHART), *install.flags)
        assert linted.returncode == 0, linted.stdout + linted.stderr
        rendered = helm(None, tmp_path, "template", "r", str(CHART), *install.flags, *monitoring, *offline)
        assert rendered.returncode == 0, rendered.stderr
        refused = helm(None, tmp_path, "template", "r", str(CHART), "-f", str(CHART / f"values-{cloud}.yaml"),
                       *monitoring, *offline)
        assert refused.returncode != 0 and "image.repository is" in refused.stderr, refused.stderr
        assert "are placeholders of values-eks.yaml/values-gke.yaml" in refused.stderr, refused.stderr
    wrong = helm(None, tmp_path, "template", "r", str(CHART), "--set", "replicaCount=two", *offline)
    assert wrong.returncode != 0
    assert "at '/replicaCount': got string, want integer" in wrong.stderr, wrong.stderr
    # Offline (`helm template`), the JobSet check has no cluster to ask and lets everything through.
    rendered = helm(None, tmp_path, "template", "r", str(CHART), *offline)
    assert rendered.returncode == 0, rendered.stderr
    old = helm(None, tmp_path, "template", "r", str(CHART), "--kube-version", "v1.30.9")
    assert old.returncode != 0 and "chart requires kubeVersion: >=1.31.0-0" in old.stderr, old.stderr


@contextlib.contextmanager
def apiserver_without_jobset() -> Iterator[str]:
    """Just enough of a Kubernetes API for Helm's `lookup`: discovery, the kube-system namespace,
    and no CRD at all. A kubeconfig's server URL."""
    resources = {
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
             "verbs": ["get", "list"]}]},
        "/apis/apiextensions.k8s.io/v1": {"kind": "APIResourceList", "groupVersion": "apiextensions.k8s.io/v1",
                                          "resources": [{"name": "customresourcedefinitions",
                                                         "singularName": "customresourcedefinition",
                                                         "namespaced": False, "kind": "CustomResourceDefinition",
                                                         "verbs": ["get", "list"]}]},
        "/version": {"major": "1", "minor": "36", "gitVersion": "v1.36.3"},
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
            "name": "apiextensions.k8s.io", "versions": [{"groupVersion": "apiextensions.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "apiextensions.k8s.io/v1", "version": "v1"}}]},
        "/api/v1/namespaces/kube-system": {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": "kube-system"}},
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_GET(self):
            body = resources.get(self.path.split("?")[0])
            code = 200 if body else 404
            data = json.dumps(body or {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_install_without_jobset_fails_saying_how_to_install_it(tmp_path):
    with apiserver_without_jobset() as url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": url}}], "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        # --dry-run=server: the templates see the cluster as `helm install` does, and nothing is written.
        # `helm template` still checks kubeVersion against --kube-version (default 1.20), not the server.
        kube = ["--kube-version", versions()["KUBERNETES_VERSION"]]
        refused = helm(None, tmp_path, "template", "r", str(CHART), "--dry-run=server", *kube,
                       kubeconfig=str(kubeconfig))
        assert refused.returncode != 0
        assert "JobSet is not installed in this cluster (no CustomResourceDefinition jobsets.jobset.x-k8s.io)" \
            in refused.stderr, refused.stderr
        assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/" \
            "manifests.yaml" in refused.stderr
        skipped = helm(None, tmp_path, "template", "r", str(CHART), "--dry-run=server", *kube,
                       "--set", "jobset.requireCRD=false",
                       kubeconfig=str(kubeconfig))
        assert skipped.returncode == 0, skipped.stderr
