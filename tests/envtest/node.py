"""A real Kubernetes node on this machine: kubelet + containerd + runc, a CNI bridge, kube-proxy, CoreDNS.

Where kwok (controllers.py) only pretends to run pods, this node runs them: the kubelet of the control
plane's version asks containerd and runc (both built from their Go modules by build-cluster.sh:
Debian 12's are older than this kubelet and containerd need) to start the pod's containers, the CNI bridge plugin gives each pod an address on a bridge that this module
creates (10.244.0.0/24, nowhere else), kube-proxy turns Service IPs into iptables rules, and CoreDNS
answers the cluster's names (a JobSet's `<jobset>-<job>-0-0.<jobset>` included).

Images cannot be pulled (no registry is reachable): `RealNode.load_image` copies one from the Docker
engine into containerd through a registry of its own on 127.0.0.1 (node_registry.py: only the
layers that changed travel), once per image ID; containerd's image store is kept between runs under
${ROSETTA_NODE_CACHE:-~/.cache/rosetta/node}. The pod sandbox image and CoreDNS are built here from
the binaries build-cluster.sh compiled.

Needs root (bridges, iptables, cgroups, mounts), Debian's CNI plugins and iptables (node-packages.sh
installs them) and a Docker engine for the images.

    prepare_network()
    cp = ControlPlane(assets, address=NODE_IP); cp.start(); ...controller manager, scheduler, JobSet
    node = RealNode(cp, assets); node.start(); node.load_image("rosetta-trainer:test")
    deploy_coredns(cp, node)
    ...
    node.stop(); cp.stop(); remove_network()
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

import node_registry
from control_plane import Assets, ControlPlane, ControlPlaneError, _tail, free_port, versions, wait_until

HERE = Path(__file__).resolve().parent
NODE_NAME = "rosetta-node"
BRIDGE = "rosetta-br0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"  # the bridge's own address: the host's side of the pod network
CLUSTER_CIDR = "10.244.0.0/16"
DNS_IP = "10.0.0.10"  # inside the control plane's --service-cluster-ip-range (10.0.0.0/24)
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
STATE = Path("/run/rosetta-node")  # sockets: short paths (a unix socket path has at most 107 bytes)


def node_cache() -> Path:
    return Path(os.environ.get("ROSETTA_NODE_CACHE") or "~/.cache/rosetta/node").expanduser()


def pause_image() -> str:
    return f"registry.k8s.io/pause:{versions()['PAUSE_VERSION']}"


def coredns_image() -> str:
    return f"registry.k8s.io/coredns/coredns:{versions()['COREDNS_VERSION']}"


def _run(*argv: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode:
        raise ControlPlaneError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


# --------------------------------------------------------------------------- host


def install_packages() -> None:
    """The CNI plugins and iptables from Debian (node-packages.sh, a no-op once installed)."""
    proc = subprocess.run(["bash", str(HERE / "node-packages.sh")], capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise ControlPlaneError(f"node-packages.sh failed: {proc.stderr[-2000:]}")


def prepare_network() -> None:
    """The pod network's bridge with the node's address on it, before the apiserver binds to it.
    The CNI bridge plugin finds the bridge already there and attaches pods to it."""
    if os.geteuid() != 0:
        raise ControlPlaneError("a real node needs root (bridges, iptables, cgroups, mounts)")
    if _run("ip", "link", "show", BRIDGE, check=False).returncode:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    if NODE_IP not in _run("ip", "-4", "addr", "show", BRIDGE).stdout:
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # Pods reach each other through the bridge and Services through kube-proxy's NAT: both need
    # forwarding and bridged packets passing iptables (kube-proxy's hairpin and masquerade rules).
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    bridge_nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if bridge_nf.exists():
        bridge_nf.write_text("1")


def remove_network() -> None:
    _run("ip", "link", "del", BRIDGE, check=False)


# ------------------------------------------------------------------------ the node


class RealNode:
    def __init__(self, cp: ControlPlane, assets: Assets, workdir: Optional[Path] = None):
        self.cp, self.assets = cp, assets
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rosetta-node-"))
        self.cache = node_cache()
        self.socket = STATE / "containerd.sock"
        self.kubelet_root = self.workdir / "kubelet"
        self.ports: dict[str, int] = {}
        self.registry: Optional[str] = None  # 127.0.0.1:PORT once started

    # ------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # What a killed test session left behind: its pods' processes and sandbox mounts.
        _kill_pod_processes()
        self._unmount_all(STATE)
        try:
            self._start_containerd()
            self.remove_superseded_images()
            self._load_pause()
            self._start_kubelet()
            self._start_kube_proxy()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Pods first (the kubelet tears down their networks and mounts), then the daemons."""
        if "kubelet" in self.cp.procs and self.cp.procs["kubelet"].poll() is None:
            try:
                self._drain()
            except Exception:  # noqa: BLE001 - teardown goes on; leftovers are removed below
                pass
        for name in ("kube-proxy", "kubelet"):
            self.cp.stop_process(name)
        _run(str(self.assets.bin("kube-proxy")), "--cleanup", check=False)  # its iptables chains
        self._kill_containers()
        self.cp.stop_process("containerd")
        self.cp.stop_process(node_registry.PROCESS)
        self.registry = None
        self._unmount_all(self.kubelet_root)
        self._unmount_all(STATE)  # sandboxes' /dev/shm mounts
        shutil.rmtree(STATE, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _drain(self, timeout: float = 120) -> None:
        import kubernetes

        api = kubernetes.config.new_client_from_config(config_file=str(self.cp.kubeconfig))
        core = kubernetes.client.CoreV1Api(api)
        # Cordoned first, as `kubectl drain` does: a Deployment's replacement pods must not come back.
        core.patch_node(NODE_NAME, {"spec": {"unschedulable": True}})
        selector = f"spec.nodeName={NODE_NAME}"
        for pod in core.list_pod_for_all_namespaces(field_selector=selector).items:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=5)
        wait_until(lambda: not core.list_pod_for_all_namespaces(field_selector=selector).items,
                   "pods still on the node", timeout, interval=1)
        api.close()

    def _kill_containers(self) -> None:
        """Shims outlive containerd by design; whatever the kubelet left running goes here."""
        if not self.socket.exists():
            return
        ctr = [str(self.assets.bin("ctr")), "--address", str(self.socket), "--namespace", "k8s.io"]
        tasks = _run(*ctr, "tasks", "list", "--quiet", check=False).stdout.split()
        for task in tasks:
            _run(*ctr, "tasks", "kill", "--signal", "SIGKILL", task, check=False)
        for task in tasks:
            _run(*ctr, "tasks", "delete", "--force", task, check=False, timeout=30)
        out = _run("pgrep", "-f", f"containerd-shim-runc-v2 .*-address {self.socket}", check=False).stdout
        for pid in out.split():
            _run("kill", "-9", pid, check=False)
        _kill_pod_processes()

    @staticmethod
    def _unmount_all(root: Path) -> None:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(root))), key=len, reverse=True):
            _run("umount", "-l", mount, check=False)

    # ---------------------------------------------------------------- containerd

    def _start_containerd(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        root = self.cache / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        cni_conf = self.workdir / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-rosetta.conflist").write_text(json.dumps(self.cni_config(), indent=2))
        config = self.workdir / "containerd.toml"
        config.write_text(f"""version = 3
root = '{root}'
state = '{STATE / "state"}'
[grpc]
  address = '{self.socket}'
[ttrpc]
  address = '{self.socket}.ttrpc'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{pause_image()}'
[plugins.'io.containerd.cri.v1.runtime']
  # Some machines (VMs with a restricted /proc, user namespaces) refuse a negative oom_score_adj;
  # the kubelet asks -998 for every pod sandbox. Clamp to containerd's own score instead.
  restrict_oom_score_adj = {'true' if _negative_oom_refused() else 'false'}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{CNI_BIN}']
    conf_dir = '{cni_conf}'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '{self.assets.bin("runc")}'
      SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '{free_port()}'
""")
        bin_dir = self.assets.bin("containerd").parent
        # The shim is found on containerd's PATH.
        self.cp.spawn("containerd", [str(self.assets.bin("containerd")), "--config", str(config)],
                      env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
        wait_until(lambda: self.socket.exists() and self._ctr("version", check=False).returncode == 0,
                   f"containerd not answering on {self.socket}:\n{self.cp.logs('containerd')}", 60)

    @staticmethod
    def cni_config() -> dict:
        return {
            "cniVersion": "1.0.0", "name": "rosetta-pods",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                # A Docker engine on the same machine sets the FORWARD policy to DROP: the firewall
                # plugin accepts each pod's traffic explicitly, as on a node that runs Docker too.
                {"type": "firewall", "backend": "iptables"},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _ctr(self, *args: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        return _run(str(self.assets.bin("ctr")), "--address", str(self.socket), "--namespace", "k8s.io",
                    *args, check=check, timeout=timeout, **kw)

    def has_image(self, ref: str) -> bool:
        return bool(self._ctr("images", "list", "--quiet", f"name=={_qualified(ref)}", check=False).stdout.strip())

    def images(self) -> dict[str, str]:
        """Every name in the node's store and the manifest digest it points at."""
        rows = [line.split() for line in self._ctr("images", "list", check=False).stdout.splitlines()[1:]]
        return {row[0]: row[2] for row in rows if len(row) >= 3}

    def remove_superseded_images(self) -> None:
        """CRI gives every image in its namespace a second name, its ID (`sha256:...`). Untagging a
        superseded build leaves it alive under that name: several GB of trainer per source change, until
        the disk fills. An ID that no tag points at any more is such a build."""
        images = self.images()
        tagged = {digest for ref, digest in images.items() if not ref.startswith("sha256:")}
        orphans = [ref for ref, digest in images.items() if ref.startswith("sha256:") and digest not in tagged]
        if orphans:
            self._ctr("images", "rm", "--sync", *orphans, timeout=600)

    def load_image(self, ref: str, *also: str, docker: str = "docker") -> bool:
        """Copy `ref` from the Docker engine into the node (once per image ID, through the node's
        registry) and tag it `also`.
        Returns whether it was copied (False: already there)."""
        image_id = _run(docker, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        marker = self.cache / "imported" / re.sub(r"[^A-Za-z0-9_.-]", "_", ref)
        copied = False
        if not (marker.exists() and marker.read_text() == image_id and self.has_image(ref)):
            # The superseded build stays until the new one is in: its layers are the new build's too
            # (a source change alters the trainer's last few MB, not its GBs), and containerd neither
            # fetches nor unpacks a layer it has a snapshot of. Removed after, below: one copy in the store.
            remote = node_registry.remote_name(self._registry(), _qualified(ref))
            node_registry.push(ref, remote, docker)
            try:
                self._ctr("images", "pull", "--plain-http", remote, timeout=1800)
                self._ctr("images", "tag", "--force", remote, _qualified(ref))
            finally:
                self._ctr("images", "rm", remote, check=False)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(image_id)
            copied = True
        for name in also:
            self._ctr("images", "tag", "--force", _qualified(ref), _qualified(name))
        if copied:
            self.remove_superseded_images()
        return copied

    def _registry(self) -> str:
        """The node's registry (node_registry.py), started on the first image that must be copied."""
        if self.registry is None:
            self.registry = node_registry.start(self.cp, self.cache / "registry")
        return self.registry

    def _load_pause(self) -> None:
        if self.has_image(pause_image()):
            return
        _docker_image_from_binary(self.assets.bin("pause"), "/pause", pause_image(), self.workdir)
        self.load_image(pause_image())

    # ------------------------------------------------------------------- kubelet

    def _start_kubelet(self) -> None:
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        self.ports["kubelet"] = free_port()
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": self.ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            # The apiserver reaches the kubelet (logs, exec) without a client certificate; the
            # kubelet listens only on the test's own bridge.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            # Machines with the cgroup v1 hierarchy still exist; 1.35+ refuses them unless told.
            "failCgroupV1": False, "failSwapOn": False,
            "clusterDNS": [DNS_IP], "clusterDomain": "cluster.local",
            "podCIDR": POD_SUBNET, "maxPods": 30,
            "podLogsDir": str(self.workdir / "pod-logs"),
            # A test machine's disk is shared with other work: evict and collect images only
            # when it is really full, not at the production thresholds.
            "evictionHard": {"memory.available": "200Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                             "nodefs.inodesFree": "2%"},
            "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
            "serializeImagePulls": False,
            "staticPodPath": "",
            "shutdownGracePeriod": "0s",
        }))
        kubeconfig = self.cp.kubeconfig
        self.cp.spawn("kubelet", [
            str(self.assets.bin("kubelet")),
            f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
            f"--root-dir={self.kubelet_root}", f"--cert-dir={self.workdir / 'kubelet-pki'}",
            "--v=1",
        ])
        wait_until(self._node_ready, f"node {NODE_NAME} not Ready:\n{self.cp.logs('kubelet')}", 120, interval=1)

    def _node_ready(self) -> bool:
        self.cp.check_alive("kubelet")
        proc = _run(self.cp.kubectl, "--kubeconfig", str(self.cp.kubeconfig), "get", "node", NODE_NAME,
                    "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return proc.stdout.strip() == "True"

    def _start_kube_proxy(self) -> None:
        config = self.workdir / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cp.kubeconfig)},
            "mode": "iptables", "clusterCIDR": CLUSTER_CIDR, "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "metricsBindAddress": f"127.0.0.1:{free_port()}", "healthzBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack limits and localhost routing alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }))
        self.cp.spawn("kube-proxy", [str(self.assets.bin("kube-proxy")), f"--config={config}", "--v=1"])
        time.sleep(1)
        self.cp.check_alive("kube-proxy")


def _kill_pod_processes() -> None:
    """SIGKILL every process in the kubelet's pod cgroups (shims killed first leave them orphaned)."""
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def _negative_oom_refused() -> bool:
    """Whether this machine refuses a process a negative oom_score_adj even as root."""
    proc = subprocess.run(["sh", "-c", "echo -1 > /proc/self/oom_score_adj"], capture_output=True)
    return proc.returncode != 0


def _qualified(ref: str) -> str:
    """The name containerd stores a Docker image under (`rosetta-trainer:test` →
    `docker.io/library/rosetta-trainer:test`), as the kubelet normalizes a pod's image."""
    first = ref.split("/")[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def _docker_image_from_binary(binary: Path, path: str, tag: str, workdir: Path, docker: str = "docker",
                              layers_before: tuple[str, ...] = ()) -> None:
    """An image FROM scratch holding one static binary as its entrypoint; `layers_before` copies it
    to those paths first, a layer each."""
    context = Path(tempfile.mkdtemp(prefix="image-", dir=workdir))
    shutil.copy2(binary, context / binary.name)
    copies = "".join(f"COPY {binary.name} {p}\n" for p in (*layers_before, path))
    (context / "Dockerfile").write_text(f"FROM scratch\n{copies}ENTRYPOINT {json.dumps([path])}\n")
    _run(docker, "build", "--quiet", "--tag", tag, str(context), timeout=300)
    shutil.rmtree(context, ignore_errors=True)


# -------------------------------------------------------------------------- CoreDNS


COREFILE = """.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loop
}
"""


def coredns_manifests() -> list[dict]:
    """What a kubeadm cluster runs as kube-dns, one replica (no upstream: pods here stay offline)."""
    labels = {"k8s-app": "kube-dns"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system",
                                                                     "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": "coredns", "dnsPolicy": "Default",
                      "containers": [{
                          "name": "coredns", "image": coredns_image(), "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"}],
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                      }],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system",
                                                             "labels": labels},
         "spec": {"clusterIP": DNS_IP, "selector": labels,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}},
    ]


def deploy_coredns(cp: ControlPlane, node: RealNode, timeout: float = 180) -> None:
    if not node.has_image(coredns_image()):
        _docker_image_from_binary(node.assets.bin("coredns"), "/coredns", coredns_image(), node.workdir)
        node.load_image(coredns_image())
    manifest = node.workdir / "coredns.yaml"
    manifest.write_text(yaml.safe_dump_all(coredns_manifests()))
    kubectl = [cp.kubectl, "--kubeconfig", str(cp.kubeconfig)]
    _run(*kubectl, "apply", "-f", str(manifest))
    proc = _run(*kubectl, "-n", "kube-system", "rollout", "status", "deployment/coredns",
                f"--timeout={int(timeout)}s", check=False, timeout=timeout + 30)
    if proc.returncode:
        pods = _run(*kubectl, "-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns", check=False)
        raise ControlPlaneError(f"CoreDNS did not become ready: {proc.stderr}\n{pods.stdout[-3000:]}\n"
                                f"kubelet:\n{_tail(cp.workdir / 'kubelet.log')}")
