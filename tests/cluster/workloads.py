"""What a namespace needs before an example's pods can be scheduled, as a platform team sets it up:
the PersistentVolumeClaims it mounts (bound to volumes of the test's own), its ServiceAccount,
its PriorityClass and Kueue queues. Plus small readers of the state the tests wait for."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any, Optional

from kubernetes.client.exceptions import ApiException

from support.cluster import GROUP, JS_GROUP, JS_PLURAL, JS_VERSION, PLURAL, VERSION

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"


def provision(cluster, namespace: str, doc: dict) -> None:
    spec = doc["spec"]
    for volume in spec.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            bound_claim(cluster, namespace, claim)
    account = spec.get("serviceAccountName")
    if account:
        _create(lambda: cluster.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}}))
    priority = (spec.get("scheduling") or {}).get("priorityClassName")
    if priority:
        import kubernetes
        _create(lambda: kubernetes.client.SchedulingV1Api(cluster.api).create_priority_class(
            {"metadata": {"name": priority}, "value": 1000}))


def bound_volume(cluster, namespace: str, claim: str, folder: Optional[Path] = None, size: str = "10Gi") -> str:
    """A ReadWriteMany hostPath PersistentVolume reserved for `claim` in `namespace` (what an EFS or
    Filestore class provisions on a cloud cluster); returns its name. `folder` is the node directory
    behind it, made writable for the trainer's UID (a hostPath volume gets no fsGroup ownership)."""
    pv = f"{namespace}-{claim}"[:63]
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
    path = str(folder or f"/tmp/rosetta-pv/{pv}")
    _create(lambda: cluster.core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": path},
                 "claimRef": {"namespace": namespace, "name": claim}}}))
    return pv


def bound_claim(cluster, namespace: str, claim: str, size: str = "10Gi", folder: Optional[Path] = None) -> None:
    """A ReadWriteMany claim bound to a hostPath volume made for it (the PV controller binds them)."""
    pv = bound_volume(cluster, namespace, claim, folder, size)
    _create(lambda: cluster.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": size}}}}))


def kueue_queue(cluster, namespace: str, local_queue: str, cluster_queue: str, gpus: int,
                cpu: int = 1000, memory: str = "10000Gi", flavor: str = "default-flavor") -> None:
    """A ClusterQueue with a GPU quota (one ResourceFlavor) and a LocalQueue in `namespace`. The
    default flavor, made here, stands for every node; another `flavor` must exist already."""
    custom = cluster.custom
    if flavor == "default-flavor":
        _create(lambda: custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": "default-flavor"}}))
    resources = [("cpu", cpu), ("memory", memory), ("nvidia.com/gpu", gpus), ("vpc.amazonaws.com/efa", 1000)]
    _create(lambda: custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
        "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": [r for r, _ in resources],
            "flavors": [{"name": flavor,
                         "resources": [{"name": r, "nominalQuota": q} for r, q in resources]}]}]}}))
    _create(lambda: custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
        "metadata": {"name": local_queue, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue}}))


def _create(call) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 409:
            raise


def documents(path) -> dict[str, dict]:
    """An example file's documents by kind (some ship the PersistentVolumeClaim they mount beside
    the TranslationTraining)."""
    import yaml

    return {d["kind"]: d for d in yaml.safe_load_all(Path(path).read_text()) if d}


def training_doc(path) -> dict:
    return documents(path)["TranslationTraining"]


def kubectl(cluster, *args: str, stdin: Optional[str] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def in_namespace(doc: dict, namespace: str, name: Optional[str] = None) -> dict:
    doc = copy.deepcopy(doc)
    doc["metadata"] = {**doc["metadata"], "namespace": namespace}
    if name:
        doc["metadata"]["name"] = name
    return doc


# ------------------------------------------------------------------------------ readers


def training(cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def status(cluster, namespace: str, name: str) -> dict:
    return training(cluster, namespace, name).get("status") or {}


def condition(cluster, namespace: str, name: str, type_: str) -> Optional[dict]:
    for cond in status(cluster, namespace, name).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def jobset(cluster, namespace: str, name: str) -> Optional[dict]:
    try:
        return cluster.custom.get_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def running_pods(cluster, namespace: str, jobset_name: str) -> list[Any]:
    return [p for p in cluster.pods(namespace, jobset_name)
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
