"""What a namespace needs before an example's pods can be scheduled, as a platform team sets it up:
the PersistentVolumeClaims it mounts (bound to volumes of the test's own), its ServiceAccount,
its PriorityClass and Kueue queues. Plus small readers of the state the tests wait for."""

from __future__ import annotations

import copy
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


def bound_claim(cluster, namespace: str, claim: str, size: str = "10Gi") -> None:
    """A ReadWriteMany claim bound to a hostPath volume made for it (the PV controller binds them)."""
    pv = f"{namespace}-{claim}"[:63]
    _create(lambda: cluster.core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": f"/tmp/rosetta-pv/{pv}"},
                 "claimRef": {"namespace": namespace, "name": claim}}}))
    _create(lambda: cluster.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": size}}}}))


def kueue_queue(cluster, namespace: str, local_queue: str, cluster_queue: str, gpus: int,
                cpu: int = 1000, memory: str = "10000Gi") -> None:
    """A ClusterQueue with a GPU quota (one ResourceFlavor) and a LocalQueue in `namespace`."""
    custom = cluster.custom
    _create(lambda: custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"}}))
    resources = [("cpu", cpu), ("memory", memory), ("nvidia.com/gpu", gpus), ("vpc.amazonaws.com/efa", 1000)]
    _create(lambda: custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
        "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": [r for r, _ in resources],
            "flavors": [{"name": "default-flavor",
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


def training_doc(path) -> dict:
    """The TranslationTraining of an example file (some ship the PersistentVolumeClaim they mount
    in the same file, as another document)."""
    import yaml

    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    (training,) = [d for d in docs if d.get("kind") == "TranslationTraining"]
    return training


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
