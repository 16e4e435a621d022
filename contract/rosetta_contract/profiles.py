"""Network presets: what a pod needs for fast collectives on a given fabric.

Pure data. The spec validates `network.profile` against PROFILES, rejects user
env that a profile sets, and pod_template.py copies env, devices and node selectors
into the pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

EFA_RESOURCE = "vpc.amazonaws.com/efa"


@dataclass(frozen=True)
class NetworkProfile:
    name: str
    description: str
    env: Mapping[str, str] = field(default_factory=dict)
    efa_devices: int = 0  # per node, requested as EFA_RESOURCE
    max_gpus_per_node: int | None = None  # None: no fixed machine shape
    node_selector: Mapping[str, str] = field(default_factory=dict)

    @property
    def needs_gpus(self) -> bool:
        return self.max_gpus_per_node is not None


# Common to p4d and p5: libfabric's EFA provider with GPUDirect RDMA.
_EFA_ENV = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    # Dataloader workers fork after libfabric registered memory; without this
    # the child can corrupt the parent's registrations.
    "FI_EFA_FORK_SAFE": "1",
    # Huge pages need a hugepages-2Mi request on the pod; plain pages cost
    # little for NCCL's buffers and keep the pod spec portable.
    "FI_EFA_USE_HUGE_PAGE": "0",
    # The EFA plugin, not TCP sockets, carries inter-node traffic; sockets are
    # only NCCL's bootstrap, which must avoid the loopback and docker bridges.
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "NCCL_DEBUG": "WARN",
}

# GKE A3 (8×H100, GPUDirect-TCPX over 4 data NICs eth1-4, eth0 for control).
# Values follow Google's published A3 NCCL settings; without the TCPX plugin
# in the image they are ignored and NCCL falls back to sockets on eth0.
_TCPX_BINDINGS = "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"
_GKE_A3_ENV = {
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_CROSS_NIC": "0",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_NSOCKS_PERTHREAD": "4",
    "NCCL_SOCKET_NTHREADS": "1",
    "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "524288",
    "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_P2P_PXN_LEVEL": "0",
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "eth1,eth2,eth3,eth4",
    "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
    "NCCL_GPUDIRECTTCPX_TX_BINDINGS": _TCPX_BINDINGS,
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS": _TCPX_BINDINGS,
    "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "1000000",
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
    "NCCL_DEBUG": "WARN",
}


# A profile's defaults that a training may set itself: diagnostics, e.g. NCCL_DEBUG=INFO to see why a
# collective hangs. Everything else a profile sets is what makes the fabric work, and stays the profile's.
USER_OVERRIDABLE = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})


def _profile(**kwargs: Any) -> NetworkProfile:
    kwargs["env"] = MappingProxyType(dict(kwargs.get("env", {})))
    kwargs["node_selector"] = MappingProxyType(dict(kwargs.get("node_selector", {})))
    return NetworkProfile(**kwargs)


PROFILES: Mapping[str, NetworkProfile] = MappingProxyType({
    "generic": _profile(
        name="generic",
        description="Any cluster: NCCL picks its transport; no devices or env are added.",
    ),
    "eks-p4d": _profile(
        name="eks-p4d",
        description="AWS p4d.24xlarge on EKS: 8 A100, 4 EFA devices, libfabric EFA with GPUDirect RDMA.",
        env=_EFA_ENV,
        efa_devices=4,
        max_gpus_per_node=8,
        node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
    ),
    "eks-p5": _profile(
        name="eks-p5",
        description="AWS p5.48xlarge on EKS: 8 H100, 32 EFA devices, libfabric EFA with GPUDirect RDMA.",
        env=_EFA_ENV,
        efa_devices=32,
        max_gpus_per_node=8,
        node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge"},
    ),
    "gke-a3": _profile(
        name="gke-a3",
        description="GKE A3 (a3-highgpu-8g): 8 H100, GPUDirect-TCPX NCCL settings.",
        env=_GKE_A3_ENV,
        max_gpus_per_node=8,
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    ),
})
