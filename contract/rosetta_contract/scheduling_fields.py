"""Where a TranslationTraining's pods run (spec.scheduling): node selector, tolerations, affinity,
priority, the Kueue queue, and the topology domain the gang shares.

The CRD schema is generated from these models too (crd.py): descriptions here are what
`kubectl explain` shows.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rosetta_contract import core_types
from rosetta_contract.kube_names import DNS1123_LABEL, DNS1123_SUBDOMAIN
from rosetta_contract.labels import QUALIFIED_NAME, LabelKey, LabelValue
from rosetta_contract.strict_model import JsonObject, Model


class Toleration(Model):
    key: Optional[str] = Field(None, max_length=317, pattern=QUALIFIED_NAME,
                               description="Taint key; empty with Exists tolerates everything.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists ignores the value.")
    value: Optional[str] = Field(None, max_length=63, description="Taint value for Equal.")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        None, description="Taint effect to tolerate; empty: all."
    )
    toleration_seconds: Optional[int] = Field(None, ge=0, description="NoExecute only: how long to stay bound.")

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Self:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("operator 'Exists' takes no 'value'")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is for effect 'NoExecute' only")
        return self


class TopologySpec(Model):
    """One topology domain (a block, a rack) for the whole gang, found by Kueue at admission."""

    level: LabelKey = Field(
        ...,
        description="Node label key of the topology level the gang should share, e.g. "
                    "cloud.google.com/gce-topology-block or topology.k8s.aws/network-node-layer-3; a level of "
                    "the Kueue Topology behind the queue's ResourceFlavor.",
    )
    mode: Literal["Required", "Preferred"] = Field(
        "Required",
        description="Required: admit the gang only when one domain of this level holds all its pods; until "
                    "then it stays Queued and the status says why. Preferred: try this level, then each level "
                    "above it, then admit it spread over several domains.",
    )


class SchedulingSpec(Model):
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="Node labels the pods require (added to the profile's)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Taints the pods tolerate."
    )
    affinity: Optional[JsonObject] = Field(
        None, description="A core/v1 Affinity, copied into the pod spec as written."
    )
    priority_class_name: Optional[str] = Field(
        None, max_length=253, pattern=DNS1123_SUBDOMAIN, description="PriorityClass of the pods.")
    queue_name: Optional[str] = Field(
        None, max_length=63, pattern=DNS1123_LABEL,
        description="Kueue LocalQueue; sets the kueue.x-k8s.io/queue-name label and creates the JobSet "
                    "suspended, for Kueue to start when it admits the whole gang.",
    )
    exclusive_topology: Optional[LabelKey] = Field(
        None,
        description=(
            "Node label key (e.g. cloud.google.com/gke-nodepool) of a topology domain that the whole gang gets "
            "to itself: JobSet places each Job in one domain, and ours is one Job of all the nodes."
        ),
    )
    topology: Optional[TopologySpec] = Field(
        None,
        description="Place the gang within one topology domain through Kueue's topology-aware scheduling "
                    "(needs queueName): Kueue admits it only where the whole gang fits.",
    )

    @field_validator("affinity")
    @classmethod
    def _affinity_is_a_pod_affinity(cls, value: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        found = core_types.problems(value, "V1Affinity") if value is not None else []
        if found:
            raise ValueError("; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else ""))
        return value

    @field_validator("topology")
    @classmethod
    def _topology_through_kueue(cls, value: Optional[TopologySpec], info: ValidationInfo) -> Optional[TopologySpec]:
        if value is None:
            return value
        if "queue_name" in info.data and info.data["queue_name"] is None:  # absent: its own error says why
            # The annotations mean nothing to the scheduler: only Kueue reads them, on a queued JobSet.
            raise ValueError("needs queueName: only Kueue's topology-aware scheduling places a gang by topology, "
                             "and Kueue sees only queued trainings; set queueName to a LocalQueue whose "
                             "ClusterQueue has a ResourceFlavor with a topologyName")
        if info.data.get("exclusive_topology"):
            # Kueue picks the domain from free capacity alone and does not see JobSet's exclusive-placement
            # pod affinities: it could admit the gang into a domain another gang holds, and its pods would
            # stay Pending there.
            raise ValueError("set topology or exclusiveTopology, not both: Kueue chooses the domain without "
                             "seeing the affinities exclusiveTopology adds")
        return value

