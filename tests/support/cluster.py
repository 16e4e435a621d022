"""Shared by the integration tests and their fixtures: the control plane handle and polling."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(REPO / "tests" / "envtest"))
from control_plane import Assets, ControlPlane, ControlPlaneError, cache_dir, find_assets  # noqa: E402

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"

# Short polls: every wait below ends as soon as the API shows what it waits for.
POLL = 0.1
TIMEOUT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}")
        time.sleep(POLL)


def start_control_plane() -> tuple[ControlPlane, Assets]:
    """Build (first run on a machine) and start etcd + kube-apiserver; fail the test clearly."""
    log = cache_dir().parent / "build-cluster.log"
    try:
        assets = find_assets(build=True, log=log)
    except (ControlPlaneError, OSError) as exc:
        pytest.fail(f"cannot get the cluster binaries: {exc}\n(build log, when built here: {log})", pytrace=False)
    cp = ControlPlane(assets)
    try:
        cp.start()
    except (ControlPlaneError, OSError) as exc:
        cp.stop()
        pytest.fail(f"cannot start the control plane from {assets.origin}: {exc}", pytrace=False)
    return cp, assets


class Cluster:
    """What a test needs of the control plane."""

    def __init__(self, cp: ControlPlane):
        import kubernetes

        self.cp = cp
        self.kubeconfig = str(cp.kubeconfig)
        self.kubectl = cp.kubectl
        self.api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.ext = kubernetes.client.ApiextensionsV1Api(self.api)

    def install_crd(self, crd: dict, timeout: float = 30) -> None:
        self.ext.create_custom_resource_definition(crd)
        name = crd["metadata"]["name"]

        def established():
            got = self.ext.read_custom_resource_definition(name)
            return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

        wait_for(established, f"CRD {name} to be Established", timeout)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.cp.logs(name, 15)}" for name in self.cp.procs)

    def new_namespace(self, name: str) -> None:
        """Create it and wait for its default ServiceAccount: until the controller manager has made
        it, the apiserver refuses every pod in the namespace."""
        self.core.create_namespace({"metadata": {"name": name}})

        def has_default_account() -> bool:
            try:
                return bool(self.core.read_namespaced_service_account("default", name))
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return False
        # Generous: after a test restarts the apiserver, the controller manager's watches come back
        # with a backoff of their own.
        wait_for(has_default_account, f"the default ServiceAccount of namespace {name}", 120)

    @contextlib.contextmanager
    def test_namespace(self, test_name: str) -> Iterator[str]:
        """A fresh namespace named after the test, deleted afterwards (nobody waits for that).

        The test's operator has stopped by the time it is deleted, so nobody would remove the
        finalizers its daemons left: the next test's operator would then handle those deletions
        and retry events into a terminating namespace while it shuts down. Released here.
        """
        base = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
        name = f"{base}-{uuid.uuid4().hex[:5]}"
        self.new_namespace(name)
        yield name
        for training in self.trainings(name):
            try:
                self.custom.patch_namespaced_custom_object(GROUP, VERSION, name, PLURAL, training,
                                                           {"metadata": {"finalizers": None}})
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.core.delete_namespace(name)

    # TranslationTrainings and their children, as the operator's tests look at them.

    def create_training(self, namespace: str, doc: dict) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)

    def trainings(self, namespace: str) -> dict[str, dict]:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return {t["metadata"]["name"]: t for t in items}

    def jobsets(self, namespace: str) -> dict[str, dict]:
        items = self.custom.list_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL)["items"]
        return {j["metadata"]["name"]: j for j in items}

    def configmaps(self, namespace: str) -> dict[str, Any]:
        """Only the operator's: the apiserver puts kube-root-ca.crt in every namespace on newer versions."""
        items = self.core.list_namespaced_config_map(namespace).items
        return {c.metadata.name: c for c in items if c.metadata.owner_references}

    def play_jobset(self, namespace: str, name: str, *, ready: int, active: int, restarts: int = 0) -> None:
        """Write JobSet status as the JobSet controller would (one replicated job, `node`)."""
        body = {"status": {"restarts": restarts, "restartsCountTowardsMax": restarts, "replicatedJobsStatus": [
            {"name": "node", "ready": ready, "active": active, "succeeded": 0, "failed": 0, "suspended": 0}]}}
        self.custom.patch_namespaced_custom_object_status(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, name, body)


class OperatorProcess:
    """`rosetta operator ARGS` as deployed: its own process, logging to the control plane's workdir."""

    def __init__(self, cluster: Cluster, log_name: str, *args: str, kubeconfig: str = ""):
        env = {**os.environ, "KUBECONFIG": kubeconfig or cluster.kubeconfig}
        env.pop("KUBERNETES_SERVICE_HOST", None)  # never the cluster this test process may run in
        self.log = Path(cluster.cp.workdir) / f"{log_name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "rosetta_cli", "operator", *args],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, port: int, timeout: float = 60) -> None:
        """Until its /healthz answers (kopf serves it once its watches run); fails if it exits."""
        def healthy() -> bool:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_for(healthy, f"the operator's /healthz on port {port}", timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finished handler, as when a node dies or the OOM killer strikes."""
        self.proc.kill()
        self.proc.wait()

    def check_alive(self) -> None:
        """Fail the test with the operator's log when it has exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"rosetta operator exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def stop(self) -> int:
        """SIGTERM, as the kubelet stops a pod; SIGKILL if it does not exit within 20 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode
