"""The controllers a Rosetta cluster runs beside Kubernetes' own: JobSet, Kueue and kwok.

Each runs as a host process against a ControlPlane, as it would run in a pod: the released binary,
its own CRDs and its own webhook configurations (from the same Go module, so they always match).
Only two things differ from an in-cluster install, both because no pod network reaches the host:
webhook configurations name `https://127.0.0.1:<port>/<path>` instead of a Service, and their
serving certificate comes from a test CA instead of the controller's internal cert rotator.

    cp = ControlPlane(assets); cp.start()
    install_crds(cp, assets)              # before the controller manager: its GC must know JobSets
    cp.start_controller_manager(); cp.start_scheduler()
    start_jobset(cp, assets); start_kueue(cp, assets)
    kwok = start_kwok(cp, assets); kwok.add_nodes(NODE_POOLS["p5"], count=2)
"""

from __future__ import annotations

import base64
import copy
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import yaml

from control_plane import Assets, ControlPlane, ControlPlaneError, free_port, wait_until

LOAD = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# A test ends a simulated pod's container by annotating the pod with its exit code (kwok_stages.yaml).
EXIT_CODE_ANNOTATION = "rosetta.test/exit-code"
KWOK_STAGES = Path(__file__).with_name("kwok_stages.yaml")


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=LOAD) if d]


# ----------------------------------------------------------------------------- CRDs


def crd_files(assets: Assets, component: str) -> list[Path]:
    return sorted(p for p in (assets.manifests / component).glob("*.yaml") if p.name != "manifests.yaml")


def install_crds(cp: ControlPlane, assets: Assets, components: Iterable[str] = ("jobset", "kueue"),
                 extra: Iterable[Mapping] = ()) -> None:
    """Create the components' CRDs (and `extra` ones) and wait until each is Established."""
    import kubernetes

    api = kubernetes.config.new_client_from_config(config_file=str(cp.kubeconfig))
    ext = kubernetes.client.ApiextensionsV1Api(api)
    names = []
    crds = [*extra, *(d for c in components for p in crd_files(assets, c) for d in _docs(p))]
    for crd in crds:
        try:
            ext.create_custom_resource_definition(crd)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
        names.append(crd["metadata"]["name"])
    for name in names:
        wait_until(lambda: _true(ext.read_custom_resource_definition(name).status.conditions, "Established"),
                   f"CRD {name} not Established")
    api.close()


def _true(conditions, type_: str) -> bool:
    return any(c.type == type_ and c.status == "True" for c in conditions or [])


# ------------------------------------------------------------------------- webhooks


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_dir: Path  # tls.crt + tls.key, the controller-runtime convention


def serving_cert(folder: Path) -> ServingCert:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ext = folder / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7", "-subj", "/CN=rosetta-test-webhook-ca",
         "-keyout", "ca.key", "-out", "ca.crt"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "tls.key", "-out", "tls.csr"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "7",
         "-extfile", "san.cnf", "-out", "tls.crt"],
    ]
    for step in steps:
        subprocess.run(["openssl", *step], cwd=folder, check=True, capture_output=True)
    return ServingCert((folder / "ca.crt").read_bytes(), folder)


def webhook_configurations(manifest: Path, prefix: str, port: int, ca_pem: bytes,
                           keep: Callable[[Mapping], bool] = lambda hook: True,
                           patch: Callable[[dict], None] = lambda hook: None) -> list[dict]:
    """The component's webhook configurations, each webhook pointed at 127.0.0.1:`port`."""
    out = []
    for doc in _docs(manifest):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"{prefix}-{doc['metadata']['name']}"
        hooks = []
        for hook in doc.get("webhooks") or []:
            if not keep(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_pem).decode()}
            patch(hook)
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def apply_webhooks(cp: ControlPlane, configurations: Iterable[dict]) -> None:
    import kubernetes

    api = kubernetes.config.new_client_from_config(config_file=str(cp.kubeconfig))
    adm = kubernetes.client.AdmissionregistrationV1Api(api)
    for doc in configurations:
        create = (adm.create_mutating_webhook_configuration if doc["kind"] == "MutatingWebhookConfiguration"
                  else adm.create_validating_webhook_configuration)
        create(doc)
    api.close()


def _wait_healthy(cp: ControlPlane, name: str, health_port: int, timeout: float = 90) -> None:
    """controller-runtime's /readyz: the manager started, and its webhook server serves."""
    deadline = time.monotonic() + timeout
    while True:
        cp.check_alive(name)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{name} not ready after {timeout:.0f} s:\n{cp.logs(name)}")
        time.sleep(0.25)


def _controller_config(cp: ControlPlane, name: str, config: dict) -> tuple[Path, int, ServingCert, int]:
    """The config file of a controller-runtime manager: webhooks on 127.0.0.1 with a test cert,
    no metrics, health on a free port, no leader election (one replica), no cert rotator."""
    cert = serving_cert(cp.workdir / f"{name}-certs")
    port, health = free_port(), free_port()
    config.update({
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert.cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
    })
    path = cp.workdir / f"{name}-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, port, cert, health


# --------------------------------------------------------------------------- JobSet


def start_jobset(cp: ControlPlane, assets: Assets) -> None:
    """The JobSet controller with its defaulting and validating webhooks serving."""
    name = "jobset-controller"
    config, port, cert, health = _controller_config(cp, name, {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "clientConnection": {"qps": 500, "burst": 500}})

    def pods_of_jobsets_only(hook: dict) -> None:
        # Upstream's kustomize patch: its pod webhooks see only the pods of JobSets.
        if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
            hook["objectSelector"] = {"matchExpressions": [
                {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}

    cp.spawn(name, [str(assets.bin(name)), f"--config={config}", f"--kubeconfig={cp.kubeconfig}"])
    _wait_healthy(cp, name, health)
    apply_webhooks(cp, webhook_configurations(assets.manifests / "jobset" / "manifests.yaml", "jobset", port,
                                              cert.ca_pem, patch=pods_of_jobsets_only))


# ---------------------------------------------------------------------------- Kueue

KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")


def _kueue_webhook_wanted(hook: Mapping) -> bool:
    """Kueue's own objects and the frameworks it is configured for; a webhook for a framework it
    does not serve would answer 404 and, with failurePolicy Fail, block those objects."""
    path = hook["clientConfig"]["service"]["path"]
    return any(part in path for part in ("-kueue-x-k8s-io-", "-batch-v1-job", "-jobset-x-k8s-io-"))


# The CRDs upstream's config/components/crd/kustomization.yaml hands to Kueue's conversion webhook:
# v1beta1 is their storage version and Kueue reads and writes v1beta2. Without it the apiserver only
# relabels the version, and whatever v1beta2 writes differently is pruned on the way to storage, e.g. a
# Workload's topology assignment (v1beta1 lists domains, v1beta2 slices).
KUEUE_CONVERTED = ("clusterqueues", "cohorts", "localqueues", "multikueueclusters", "workloads")


def convert_through(cp: ControlPlane, group: str, plurals: Iterable[str], port: int, ca_pem: bytes) -> None:
    """Point the CRDs' conversion at the controller's /convert on 127.0.0.1:`port`."""
    import kubernetes

    api = kubernetes.config.new_client_from_config(config_file=str(cp.kubeconfig))
    ext = kubernetes.client.ApiextensionsV1Api(api)
    webhook = {"clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": base64.b64encode(ca_pem).decode()},
               "conversionReviewVersions": ["v1"]}
    for plural in plurals:
        ext.patch_custom_resource_definition(f"{plural}.{group}", {"spec": {"conversion": {
            "strategy": "Webhook", "webhook": webhook}}})
    api.close()


def start_kueue(cp: ControlPlane, assets: Assets) -> None:
    name = "kueue"
    subprocess.run([cp.kubectl, "--kubeconfig", str(cp.kubeconfig), "create", "namespace", "kueue-system"],
                   capture_output=True)
    config, port, cert, health = _controller_config(cp, name, {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": "kueue-system",
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 200, "burst": 300},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)}})
    # Without its cert rotator Kueue reads a metrics certificate from this fixed path, even with
    # metrics off; it must exist before it starts. (A Kueue pod has it mounted from a Secret.)
    metrics_certs = Path("/etc/kueue/metrics/certs")
    if not (metrics_certs / "tls.crt").exists():
        try:
            metrics_certs.mkdir(parents=True, exist_ok=True)
            for file in ("tls.crt", "tls.key"):
                (metrics_certs / file).write_bytes((cert.cert_dir / file).read_bytes())
        except OSError as exc:
            raise ControlPlaneError(f"Kueue needs {metrics_certs}/tls.crt and tls.key: {exc}") from exc
    # The on-demand visibility API is an aggregated apiserver of its own: not what these tests use.
    cp.spawn(name, [str(assets.bin(name)), f"--config={config}", f"--kubeconfig={cp.kubeconfig}",
                     "--feature-gates=VisibilityOnDemand=false"])
    _wait_healthy(cp, name, health)
    apply_webhooks(cp, webhook_configurations(assets.manifests / "kueue" / "manifests.yaml", "kueue", port,
                                              cert.ca_pem, keep=_kueue_webhook_wanted))
    convert_through(cp, "kueue.x-k8s.io", KUEUE_CONVERTED, port, cert.ca_pem)


# ----------------------------------------------------------------------------- kwok


@dataclass(frozen=True)
class NodePool:
    """A simulated node shape: what a cloud's GPU node group looks like to the scheduler."""

    name: str
    capacity: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_POOLS = {
    # EKS managed node groups with the NVIDIA device plugin and the EFA device plugin.
    "p5": NodePool("p5", {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": "8",
                          "vpc.amazonaws.com/efa": "32", "ephemeral-storage": "3800Gi"},
                   {"node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "us-east-1a",
                    "eks.amazonaws.com/nodegroup": "p5"}, (GPU_TAINT,)),
    "p4d": NodePool("p4d", {"cpu": "96", "memory": "1152Gi", "pods": "110", "nvidia.com/gpu": "8",
                            "vpc.amazonaws.com/efa": "4", "ephemeral-storage": "3800Gi"},
                    {"node.kubernetes.io/instance-type": "p4d.24xlarge", "topology.kubernetes.io/zone": "us-east-1b",
                     "eks.amazonaws.com/nodegroup": "p4d"}, (GPU_TAINT,)),
    # GKE labels GPU nodes with their accelerator and taints them itself.
    "a3": NodePool("a3", {"cpu": "208", "memory": "1872Gi", "pods": "110", "nvidia.com/gpu": "8",
                          "ephemeral-storage": "6000Gi"},
                   {"node.kubernetes.io/instance-type": "a3-highgpu-8g",
                    "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                    "cloud.google.com/gke-nodepool": "a3-pool", "topology.kubernetes.io/zone": "us-central1-a"},
                   (GPU_TAINT,)),
    # EKS g5 node groups (A10G): the instance types examples select by nodeSelector.
    "g5-12x": NodePool("g5-12x", {"cpu": "48", "memory": "192Gi", "pods": "110", "nvidia.com/gpu": "4",
                                  "ephemeral-storage": "3800Gi"},
                       {"node.kubernetes.io/instance-type": "g5.12xlarge", "eks.amazonaws.com/nodegroup": "g5-12x"},
                       (GPU_TAINT,)),
    "g5-4x": NodePool("g5-4x", {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "1",
                                "ephemeral-storage": "600Gi"},
                      {"node.kubernetes.io/instance-type": "g5.4xlarge", "eks.amazonaws.com/nodegroup": "g5-4x"},
                      (GPU_TAINT,)),
    "cpu": NodePool("cpu", {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "200Gi"},
                    {"node.kubernetes.io/instance-type": "m6i.4xlarge", "eks.amazonaws.com/nodegroup": "cpu"}),
}


class Kwok:
    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self._count = 0

    def node(self, pool: NodePool, name: str) -> dict:
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok", "rosetta.test/pool": pool.name,
                                    **pool.labels}},
            "spec": {"taints": [dict(t) for t in pool.taints]},
            "status": {"capacity": dict(pool.capacity), "allocatable": dict(pool.capacity)},
        }

    def add_nodes(self, pool: NodePool, count: int = 1) -> list[str]:
        import kubernetes

        api = kubernetes.config.new_client_from_config(config_file=str(self.cp.kubeconfig))
        core = kubernetes.client.CoreV1Api(api)
        names = []
        for _ in range(count):
            self._count += 1
            name = f"kwok-{pool.name}-{self._count}"
            core.create_node(self.node(pool, name))
            names.append(name)
        for name in names:  # kwok's node stages make them Ready
            wait_until(lambda: _true(core.read_node(name).status.conditions, "Ready"),
                       f"kwok node {name} not Ready:\n{self.cp.logs('kwok')}", interval=0.2)
        api.close()
        return names


def kwok_stages(assets: Assets) -> list[dict]:
    """kwok's own stages for nodes (Ready, leases) and for a pod's start and removal, made quick;
    then ours (kwok_stages.yaml): a pod ends only when a test says so, and a pod being deleted ends
    Failed first, as a kubelet stopping its containers does. kwok's pod-complete stage, which ends
    every Job's pods at once, is left out."""
    stages = _docs(assets.manifests / "kwok" / "stage" / "node" / "fast" / "node-initialize.yaml")
    stages += _docs(assets.manifests / "kwok" / "stage" / "node" / "heartbeat-with-lease" /
                    "node-heartbeat-with-lease.yaml")
    for name in ("pod-create", "pod-ready", "pod-delete"):
        for stage in _docs(assets.manifests / "kwok" / "stage" / "pod" / "general" / f"{name}.yaml"):
            stage["spec"]["delay"] = {"durationMilliseconds": 200, "jitterDurationMilliseconds": 300}
            stages.append(stage)
    return [*stages, *_docs(KWOK_STAGES)]


def start_kwok(cp: ControlPlane, assets: Assets) -> Kwok:
    config = cp.workdir / "kwok.yaml"
    config.write_text(yaml.safe_dump_all(kwok_stages(assets)))
    cp.spawn("kwok", [
        str(assets.bin("kwok")), f"--kubeconfig={cp.kubeconfig}", f"--config={config}",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40",
        "--cidr=10.88.0.1/16", "--node-ip=10.99.0.1",
        f"--server-address=127.0.0.1:{free_port()}",
    ])
    time.sleep(0.5)
    cp.check_alive("kwok")
    return Kwok(cp)
