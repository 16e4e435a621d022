"""The `cluster` tier: Kubernetes itself acts on what the operator creates.

One session-wide cluster built from the versions in tests/envtest/versions.env: etcd, kube-apiserver,
kube-controller-manager (Job controller, garbage collector, ...), kube-scheduler, the JobSet controller
with its webhooks, Kueue, and kwok simulating GPU and CPU nodes shaped like the network profiles'
instance types. Nothing here patches a status the way a controller "would": pods are scheduled by the
scheduler, created by the Job controller for the Jobs the JobSet controller made, and run by kwok
until a test ends their container (`end_pod`) or evicts them.

The operator runs as its own process (`rosetta operator`), watching each test's namespace.

`node_cluster` is a second, smaller cluster whose one node is real (tests/envtest/node.py): kubelet,
containerd, runc, a CNI bridge, kube-proxy and CoreDNS run the trainer image built from the
Dockerfile, so the pods there train for real. It starts only when a test asks for it.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from kubernetes.client.rest import ApiException

import node as real_node
from control_plane import ControlPlane, ControlPlaneError, find_assets, free_port
from controllers import EXIT_CODE_ANNOTATION, NODE_POOLS, Kwok, install_crds, start_jobset, start_kueue, start_kwok
from support.cluster import Cluster, OperatorProcess, start_control_plane, wait_for
from support.images import Images

# The simulated fleet: enough nodes of each shape for every example in manifests/examples.
FLEET = {"p5": 2, "p4d": 1, "a3": 2, "g5-12x": 2, "g5-4x": 4, "cpu": 2}


class LiveCluster(Cluster):
    """A Cluster whose controllers are real; `kwok` adds nodes."""

    def __init__(self, cp, kwok: Kwok):
        super().__init__(cp)
        self.kwok = kwok

    def pods(self, namespace: str, jobset: str = "") -> list:
        selector = f"jobset.sigs.k8s.io/jobset-name={jobset}" if jobset else None
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def end_pod(self, namespace: str, name: str, exit_code: int, message: str | None = None,
                reason: str | None = None) -> None:
        """The pod's container exits with `exit_code` and, if given, `message` as its termination
        message and `reason` as the runtime's reason, e.g. OOMKilled (kwok_stages.yaml's rosetta-pod-exit)."""
        annotations = {EXIT_CODE_ANNOTATION: str(exit_code)}
        if message is not None:
            annotations["rosetta.test/termination-message"] = message
        if reason is not None:
            annotations["rosetta.test/terminated-reason"] = reason
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})

    def evict(self, namespace: str, name: str) -> None:
        """Through the eviction API, as `kubectl drain`, a spot reclaim or a preemption does: the
        apiserver sets the DisruptionTarget condition before the pod is deleted."""
        self.core.create_namespaced_pod_eviction(name, namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}})


@pytest.fixture(scope="session")
def live_cluster() -> Iterator[LiveCluster]:
    from rosetta_operator.crd import build_crd

    cp, assets = start_control_plane()
    try:
        install_crds(cp, assets, components=("jobset", "kueue"), extra=[build_crd()])
        cp.start_controller_manager()
        cp.start_scheduler()
        start_jobset(cp, assets)
        start_kueue(cp, assets)
        kwok = start_kwok(cp, assets)
        for pool, count in FLEET.items():
            kwok.add_nodes(NODE_POOLS[pool], count)
        yield LiveCluster(cp, kwok)
    except ControlPlaneError as exc:
        pytest.fail(f"cluster: {exc}", pytrace=False)
    finally:
        cp.stop()


@pytest.fixture
def live_namespace(live_cluster: LiveCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with live_cluster.test_namespace(request.node.name) as name:
        yield name
    # The nodes are shared: the next test must find them free, not still held by this one's pods.
    # kwok's pods run nothing, so nothing is lost by removing them at once; the namespace is
    # terminating, so no controller can create another (the namespace controller took about 7 s to
    # get to them, after every test of this tier).
    live_cluster.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    # A deleted pod that never ran (unschedulable) or whose node is gone keeps the Job controller's
    # tracking finalizer until the pod garbage collector, which looks every 20 s, fails it: 15-20 s
    # after each such test. Its Job is being deleted with the namespace; nobody needs the count.
    for pod in live_cluster.pods(name):
        if pod.metadata.finalizers:
            try:
                live_cluster.core.patch_namespaced_pod(pod.metadata.name, name, {"metadata": {"finalizers": None}})
            except ApiException as exc:
                if exc.status != 404:
                    raise
    wait_for(lambda: not live_cluster.pods(name), f"the pods of namespace {name} to be gone", 120)


class LiveOperator:
    """`rosetta operator --namespace NS`, restartable."""

    def __init__(self, cluster: LiveCluster, namespace: str):
        self.cluster, self.namespace, self.starts = cluster, namespace, 0
        self.proc: OperatorProcess | None = None

    def start(self) -> None:
        self.starts += 1
        self.port = port = free_port()  # its /healthz
        self.proc = OperatorProcess(self.cluster, f"operator-{self.namespace}-{self.starts}", "--namespace",
                                    self.namespace, "--liveness-port", str(port), "--metrics-port", "0",
                                    "--progress-interval", "2")
        self.proc.wait_healthy(port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.proc.tail() if self.proc else ""


@pytest.fixture
def live_operator(live_cluster: LiveCluster, live_namespace: str) -> Iterator[LiveOperator]:
    op = LiveOperator(live_cluster, live_namespace)
    op.start()
    try:
        yield op
    finally:
        op.stop()


# ------------------------------------------------------------------------ a real node


class NodeCluster(Cluster):
    """A Cluster with one real node: pods run the images built from the Dockerfile."""

    def __init__(self, cp, node: "real_node.RealNode", images: Images):
        super().__init__(cp)
        self.node, self.images = node, images

    def pods(self, namespace: str, jobset: str = "") -> list:
        selector = f"jobset.sigs.k8s.io/jobset-name={jobset}" if jobset else None
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items


@pytest.fixture(scope="session")
def node_cluster(images: Images) -> Iterator[NodeCluster]:
    from rosetta_contract.trainer_pod import DEFAULT_IMAGE
    from rosetta_operator.crd import build_crd

    try:
        real_node.install_packages()
        assets = find_assets()
        real_node.prepare_network()
    except ControlPlaneError as exc:
        pytest.fail(f"real node: {exc}", pytrace=False)
    cp = ControlPlane(assets, address=real_node.NODE_IP)
    node = None
    try:
        cp.start()
        install_crds(cp, assets, components=("jobset",), extra=[build_crd()])
        cp.start_controller_manager()
        cp.start_scheduler()
        start_jobset(cp, assets)
        node = real_node.RealNode(cp, assets)
        node.start()
        real_node.deploy_coredns(cp, node)
        # Also under the image name the operator defaults to, so the examples run unchanged.
        node.load_image(images.trainer, DEFAULT_IMAGE)
        node.load_image(images.operator)
        yield NodeCluster(cp, node, images)
    except ControlPlaneError as exc:
        pytest.fail(f"real node: {exc}", pytrace=False)
    finally:
        if node is not None:
            node.stop()
        cp.stop()
        real_node.remove_network()


@pytest.fixture
def node_namespace(node_cluster: NodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with node_cluster.test_namespace(request.node.name) as name:
        yield name
    # One node, two CPUs: the next test's pods need this one's gone.
    wait_for(lambda: not node_cluster.pods(name), f"the pods of namespace {name} to be gone", 120)


@pytest.fixture
def node_operator(node_cluster: NodeCluster, node_namespace: str) -> Iterator[LiveOperator]:
    """The operator as a host process, as in the other cluster tests: the host reaches pod IPs on the
    node's bridge, so its progress scraper reads the live pods' metrics endpoints."""
    op = LiveOperator(node_cluster, node_namespace)
    op.start()
    try:
        yield op
    finally:
        op.stop()
