"""charts/rosetta installed by the real Helm engine (the helm binary envtest/versions.env pins), and
the operator run exactly as the chart's Deployment runs it, with the chart's ServiceAccount: a
training goes from created to Succeeded with nothing but the chart's RBAC.

The Deployment's own pod runs on a kwok node, which does not run containers, so the operator runs
here as a process with the Deployment's arguments and a token of its ServiceAccount (issued by the
TokenRequest API, as the kubelet would mount it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from control_plane import free_port
from support.cluster import OperatorProcess, wait_for
from test_lifecycle import small_training, wait_running
from workloads import provision, status

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rosetta"


def helm(cluster, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run([str(cluster.cp.assets.bin("helm")), *args], env=env, capture_output=True, text=True,
                          timeout=180)


def service_account_kubeconfig(cluster, namespace: str, account: str, path: Path) -> str:
    token = cluster.core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_chart_install_runs_a_training_with_the_charts_rbac(live_cluster, live_namespace, tmp_path):
    ns = live_namespace
    liveness, metrics = free_port(), free_port()
    installed = helm(live_cluster, tmp_path, "install", "rosetta", str(CHART), "--namespace", ns,
                     "--set", "crd.install=false",  # the session's cluster has the CRD already
                     "--set", f"watchNamespaces={{{ns}}}",
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
    account = deployment.spec.template.spec.service_account_name
    kubeconfig = service_account_kubeconfig(live_cluster, ns, account, tmp_path / "operator.kubeconfig")

    op = OperatorProcess(live_cluster, f"operator-helm-{ns}", *container.args, kubeconfig=kubeconfig)
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
