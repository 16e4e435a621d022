"""The one place that says what every pod of a training shares: service account, pod and container
security contexts, image, placement, the user's env, volumes and mounts. The gang's pods (the
JobSet), the stage job's pod and the evaluation Job's pod all take them from here, each through one
of the views below, and templates/pod.yaml.j2 places them the same way in every object. What a pod
runs (command, its own env, resources) is its module's: a Container.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.names import Names
from rosetta_operator.pod_template import (
    container_security_context,
    pod_security_context,
    scheduling,
    scheduling_gates,
    user_env,
    volumes,
)

# /dev/shm as big as the spec asks: for NCCL and dataloader workers, which only the gang's pods run.
SHM_VOLUME = "dshm"


@dataclass(frozen=True)
class Placement:
    """Where a pod may run. Empty values are left out of the pod."""

    node_selector: dict[str, Any] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: Optional[dict[str, Any]] = None
    scheduling_gates: list[dict[str, str]] = field(default_factory=list)
    priority_class_name: Optional[str] = None


@dataclass(frozen=True)
class Container:
    """What one container runs; the rest of it (image, security context, mounts) is its pod's."""

    name: str
    command: list[str]
    env: list[dict[str, Any]]
    resources: dict[str, Any]
    ports: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class PodParts:
    """The pieces of one pod of a training that are the training's, not the pod's."""

    service_account_name: Optional[str]
    automount_token: bool
    image_pull_secrets: list[dict[str, str]]
    security_context: dict[str, Any]
    container_security_context: dict[str, Any]
    image: str
    image_pull_policy: Optional[str]
    placement: Placement
    volumes: list[dict[str, Any]]
    volume_mounts: list[dict[str, Any]]
    # The user's spec.env (and HF_HOME on a cache volume), last in every container's env.
    user_env: list[dict[str, Any]]
    # What a pod that reads the stage job's copies adds: no pod asks the hub (an offline cluster
    # cannot reach it, and it would otherwise be asked once per rank). Empty without a source.
    offline_env: list[dict[str, Any]]

    def without_shm(self) -> PodParts:
        return replace(self, volumes=[v for v in self.volumes if v["name"] != SHM_VOLUME],
                       volume_mounts=[m for m in self.volume_mounts if m["name"] != SHM_VOLUME])


def gang_pod(spec: TranslationTrainingSpec, names: Names) -> PodParts:
    """A gang pod's parts: every volume, and all of the spec's placement (the profile's node selector
    and GPU toleration, the user's affinity and priority, the pre-flight check's gate)."""
    pod_volumes, mounts = volumes(spec, names)
    node_selector, tolerations = scheduling(spec)
    own = {var.name for var in spec.env}
    return PodParts(
        service_account_name=spec.service_account_name,
        automount_token=spec.pod_security.automount_service_account_token,
        image_pull_secrets=[{"name": s} for s in spec.image_pull_secrets],
        security_context=pod_security_context(spec),
        container_security_context=container_security_context(),
        image=spec.image,
        image_pull_policy=spec.image_pull_policy,
        placement=Placement(node_selector=node_selector, tolerations=tolerations, affinity=spec.scheduling.affinity,
                            scheduling_gates=scheduling_gates(spec),
                            priority_class_name=spec.scheduling.priority_class_name),
        volumes=pod_volumes,
        volume_mounts=mounts,
        user_env=user_env(spec),
        offline_env=[{"name": k, "value": "1"} for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
                     if k not in own] if spec.staging_sources() else [],
    )


def stage_pod(spec: TranslationTrainingSpec, names: Names) -> PodParts:
    """The stage job's pod: wherever the gang may run, the stage pod may too, at the gang's
    priority; no affinity or pre-flight gate (those keep the gang off bad GPU nodes), no /dev/shm."""
    gang = gang_pod(spec, names)
    placement = Placement(node_selector=gang.placement.node_selector, tolerations=gang.placement.tolerations,
                          priority_class_name=gang.placement.priority_class_name)
    return replace(gang, placement=placement).without_shm()


def evaluation_pod(spec: TranslationTrainingSpec, names: Names) -> PodParts:
    """The evaluation Job's pod: no /dev/shm (no NCCL or dataloader workers). In mode evaluate it is
    the whole run, placed like a gang pod's node selector and tolerations; after a training it runs on
    the CPU, so none of the gang's placement (which is for GPU nodes)."""
    gang = gang_pod(spec, names)
    placement = (Placement(node_selector=gang.placement.node_selector, tolerations=gang.placement.tolerations)
                 if spec.mode == "evaluate" else Placement())
    return replace(gang, placement=placement).without_shm()
