"""What the operator's objects are called, and the labels and annotations they carry: the names
render.py writes and the status, log and local-run modules read back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from rosetta_contract.resource import API_VERSION, KIND
from rosetta_contract.strict_model import ConfigError

REPLICATED_JOB = "node"
# The replicated job (and its container) that runs before the gang: stage_job.py.
STAGE_JOB = "stage"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
CONFIG_DIR = "/etc/rosetta"
CONFIG_KEY = "training.yaml"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TRAINING_LABEL = "rosetta.dev/training"
# The kubelet, the eviction API, the taint manager and preemption (the scheduler's or Kueue's)
# mark a pod they take away with this condition (failure_policies.py).
DISRUPTION_TARGET = "DisruptionTarget"
TRAINER_CONTAINER = "trainer"
BASE_LABELS = {"app.kubernetes.io/name": "rosetta", "app.kubernetes.io/managed-by": "rosetta-operator"}
# Stands for the random suffix the Job controller appends to each pod name: JobSet's admission
# webhook counts it when it checks that the longest pod name is a DNS-1035 label.
POD_NAME_SUFFIX = "-xxxxx"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Names:
    training: str
    jobset: str
    configmap: str
    replicated_job: str
    master_addr: str

    def pod_hostname(self, node_rank: int) -> str:
        return f"{self.jobset}-{self.replicated_job}-0-{node_rank}"


def label_value(value: str) -> str:
    """A valid label value (≤63 chars, alphanumeric ends) derived from any string."""
    value = _LABEL_BAD.sub("-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def resource_names(name: str, nodes: int) -> Names:
    """Child names; ConfigError when a Kubernetes limit would reject them later."""
    jobset = name
    names = Names(
        training=name,
        jobset=jobset,
        configmap=f"{name}-config",
        replicated_job=REPLICATED_JOB,
        master_addr=f"{jobset}-{REPLICATED_JOB}-0-0.{jobset}",
    )
    errors = []
    if not _DNS1035.match(jobset):
        # The JobSet's headless Service is named after it: a DNS-1035 label.
        errors.append(("metadata.name", f"'{name}' must start with a letter and contain only a-z, 0-9 and '-'"))
    longest = names.pod_hostname(nodes - 1) + POD_NAME_SUFFIX
    if len(longest) > 63:
        allowed = len(name) - (len(longest) - 63)
        errors.append(("metadata.name", f"too long for {nodes} nodes: the pod name '{longest}' (xxxxx: the Job's "
                                        f"random suffix) would exceed 63 characters; use at most {allowed} characters"))
    if errors:
        raise ConfigError(errors)
    return names


def labels_for(name: str) -> dict[str, str]:
    return {**BASE_LABELS, TRAINING_LABEL: label_value(name)}


def owner_references(owner: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Accepts an ownerReference or the owning object itself (e.g. kopf's body)."""
    if not owner:
        return []
    meta = owner.get("metadata")
    if meta is not None:
        owner = {"apiVersion": owner.get("apiVersion", API_VERSION), "kind": owner.get("kind", KIND),
                 "name": meta["name"], "uid": meta["uid"]}
    return [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"],
             "uid": owner["uid"], "controller": True, "blockOwnerDeletion": True}]
