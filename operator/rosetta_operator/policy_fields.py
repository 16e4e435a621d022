"""The fields of an admin policy file: what each rule limits and its default, cluster-wide (`Policy`)
or for the trainings of some namespaces (`Rules`, an entry of `namespaces`).

policy.py reads the file into these; policy_checks.py holds a spec to them.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Annotated, Optional

from pydantic import Field, PrivateAttr, StrictInt, StringConstraints

from rosetta_contract.labels import LabelKey, LabelValue
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import Model

# Said after every violation, so a user can tell a policy refusal from a spec error.
SUFFIX = "(operator policy)"
# A shared cluster's defaults: one training takes at most 16 pods, 16 full 8-GPU machines, before
# an admin says more (per namespace, if only one team should); the largest shipped examples (4
# nodes; 2 × 8 GPUs) fit 4 and 8 times over.
DEFAULT_MAX_NODES = 16
DEFAULT_MAX_GPUS_PER_TRAINING = 128

Name = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=r"^\S+$")]
HostPath = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")]
# A namespace name, or a glob of one (team-*, ml-?, [ab]-dev).
NamespacePattern = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9*?\[\]!-]+$")]
# Strict: `maxNodes: true` is a mistake, not 1.
Limit = Optional[StrictInt]


class Rules(Model):
    """What an admin allows, cluster-wide or in one namespace. Lists: empty means any; numbers and
    quantities: null means no limit."""

    allowed_registries: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Image reference prefixes the trainer image must start with, as Docker reads the "
                    "reference (`ubuntu` is docker.io/library/ubuntu), e.g. ghcr.io/rosetta-dev/ or "
                    "123456789012.dkr.ecr.us-east-1.amazonaws.com/. A prefix not ending in '/', ':' or '@' "
                    "matches up to one of them: ghcr.io/org matches ghcr.io/org/x, not ghcr.io/organic/x.",
    )
    allowed_service_accounts: list[Name] = Field(
        default_factory=list, max_length=256,
        description="ServiceAccounts the pods may run as. A training without serviceAccountName runs as "
                    "the namespace's 'default': list it to allow that.",
    )
    allow_service_account_token: bool = Field(
        True, description="Allow podSecurity.automountServiceAccountToken: true (the account's API token "
                          "in every pod).",
    )
    allowed_priority_classes: list[Name] = Field(
        default_factory=list, max_length=256,
        description="PriorityClasses scheduling.priorityClassName may name; unset is always allowed.",
    )
    allowed_toleration_keys: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Taint keys scheduling.tolerations may tolerate. With a list, a toleration with an "
                    "empty key (operator Exists: every taint) is refused too. The toleration the operator "
                    "adds for the GPU resource's taint is allowedGpuResources' to limit.",
    )
    allow_tolerate_all: bool = Field(
        False, description="Allow a toleration with an empty key and operator Exists, which tolerates every "
                           "taint: control-plane, system and other teams' nodes included.",
    )
    allow_control_plane: bool = Field(
        False, description="Allow a training to aim at control-plane nodes: a node selector, node affinity "
                           "term (In, Exists) or toleration on node-role.kubernetes.io/control-plane or "
                           "node-role.kubernetes.io/master. Keeping off them (NotIn, DoesNotExist) is always "
                           "allowed.",
    )
    allowed_node_selector_keys: list[LabelKey] = Field(
        default_factory=list, max_length=256,
        description="Node label keys the pods may select nodes by: scheduling.nodeSelector, the network "
                    "profile's selector and the node affinity's terms (required and preferred).",
    )
    allowed_node_selector_values: dict[LabelKey, list[LabelValue]] = Field(
        default_factory=dict, max_length=256,
        description="For these node label keys, the values a node selector may ask for; a node affinity "
                    "term on such a key must use operator In with values among them.",
    )
    allowed_gpu_resources: list[Name] = Field(
        default_factory=list, max_length=64,
        description="Extended resource names resources.gpuResource may name when gpusPerNode > 0, e.g. "
                    "nvidia.com/gpu.",
    )
    max_efa_per_node: Limit = Field(
        None, ge=0, description="At most this many EFA devices per pod (resources.efa, else the network "
                                "profile's: eks-p4d 4, eks-p5 32); 0 allows none.",
    )
    allow_host_path: bool = Field(
        False, description="Allow hostPath volumes, as `--allow-host-path` does (either one is enough).",
    )
    allowed_host_paths: list[HostPath] = Field(
        default_factory=list, max_length=256,
        description="Node paths hostPath volumes must be under. Listing any allows hostPath volumes, "
                    "under these paths only.",
    )
    max_nodes: Limit = Field(DEFAULT_MAX_NODES, ge=1, description="At most this many nodes (pods) per training.")
    max_gpus_per_node: Limit = Field(None, ge=0, description="At most this many GPUs per pod.")
    max_gpus_per_training: Limit = Field(
        DEFAULT_MAX_GPUS_PER_TRAINING, ge=0,
        description="At most this many GPUs per training (nodes × gpusPerNode).",
    )
    max_cpu_per_pod: Optional[Quantity] = Field(
        None, description="At most this CPU request per pod (resources.cpu; the after-training evaluation's "
                          "afterTraining.cpu), e.g. 96 or 7500m.",
    )
    max_memory_per_pod: Optional[Quantity] = Field(
        None, description="At most this memory per pod (resources.memory, which must then be set; the "
                          "after-training evaluation's afterTraining.memory), e.g. 512Gi.",
    )
    max_shm_size: Optional[Quantity] = Field(None, description="At most this resources.shmSize (/dev/shm), e.g. 64Gi.")
    max_cpu_per_training: Optional[Quantity] = Field(
        None, description="At most this CPU request per training (nodes × resources.cpu).",
    )
    max_memory_per_training: Optional[Quantity] = Field(
        None, description="At most this memory per training (nodes × resources.memory, which must then be set).",
    )
    require_queue: bool = Field(
        False, description="Refuse a training without scheduling.queueName: every training waits for Kueue "
                           "to admit it.",
    )
    allowed_queues: list[Name] = Field(
        default_factory=list, max_length=256,
        description="Kueue LocalQueues scheduling.queueName may name.",
    )
    allow_root_group: bool = Field(
        True, description="Allow podSecurity.runAsGroup: 0 or fsGroup: 0 (root's group; files root's "
                          "group may write become writable).",
    )

    # Where these rules came from: "" cluster-wide, else the `namespaces` key that matched, and the
    # fields that entry set.
    _entry: str = PrivateAttr("")
    _overrides: frozenset[str] = PrivateAttr(frozenset())

    @property
    def allows_host_path(self) -> bool:
        return self.allow_host_path or bool(self.allowed_host_paths)

    @property
    def overrides(self) -> frozenset[str]:
        """The fields the matching `namespaces` entry set (none for the cluster-wide rules)."""
        return self._overrides

    @property
    def suffix(self) -> str:
        if not self._entry:
            return SUFFIX
        what = "namespaces" if any(c in self._entry for c in "*?[") else "namespace"
        return f"(operator policy for {what} {self._entry!r})"


# The values that limit nothing, for the fields whose defaults limit something.
UNLIMITED = {"max_nodes": None, "max_gpus_per_training": None, "allow_tolerate_all": True,
             "allow_control_plane": True}


class Policy(Rules):
    """The cluster-wide rules, and per-namespace ones (`namespaces`)."""

    namespaces: dict[NamespacePattern, Rules] = Field(
        default_factory=dict, max_length=1024,
        description="Rules for the trainings of some namespaces: a namespace name or glob (team-*) → any of "
                    "the fields above. The fields an entry sets replace the cluster-wide ones there (a list "
                    "replaces the list; null lifts a limit); the rest are the cluster-wide ones. A namespace "
                    "takes its exact name's entry, else the first glob that matches, in the file's order.",
    )

    def for_namespace(self, namespace: str) -> Rules:
        """The rules for a training in `namespace`: the cluster-wide ones, with its entry's fields over them."""
        key = namespace if namespace in self.namespaces else next(
            (k for k in self.namespaces if fnmatchcase(namespace, k)), None)
        values = {name: getattr(self, name) for name in Rules.model_fields}
        if key is None:
            return Rules.model_construct(**values)
        entry = self.namespaces[key]
        rules = Rules.model_construct(**{**values, **{name: getattr(entry, name) for name in entry.model_fields_set}})
        rules._entry, rules._overrides = key, frozenset(entry.model_fields_set)
        return rules

    def limits(self) -> list[str]:
        """The fields that limit something (for the startup log), `namespaces` last when it has entries."""
        unlimited = Rules().model_copy(update=UNLIMITED)
        return [field.alias or name for name, field in Rules.model_fields.items()
                if getattr(self, name) != getattr(unlimited, name)] + (["namespaces"] if self.namespaces else [])
