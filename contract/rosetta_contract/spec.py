"""The operator's TranslationTraining spec: the trainer's spec plus cluster fields.

The CRD schema is generated from these models (crd.py), so descriptions here are
what `kubectl explain translationtraining.spec` shows. The trainer ignores
exactly the keys added here (CLUSTER_FIELDS, derived from the two models).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Optional, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rosetta_contract.config import Metadata, TrainerSpec
from rosetta_contract.document_io import apply_overrides, format_errors, read_yaml
from rosetta_contract.kube_names import HOSTNAME_LABEL, MAX_INT32, ImageReference, ObjectName
from rosetta_contract.pod_fields import EnvVar, FailurePolicySpec, NetworkSpec, PodSecuritySpec, ResourcesSpec
from rosetta_contract.profiles import PROFILES
from rosetta_contract.scheduling_fields import SchedulingSpec
from rosetta_contract.strict_model import ConfigError
from rosetta_contract.strict_yaml import MAX_DEPTH
from rosetta_contract.trainer_pod import (
    DEFAULT_IMAGE,
    DEFAULT_OUTPUT_MOUNT,
    LAUNCHER_ENV,
    LAUNCHER_ENV_PREFIXES,
    MAX_NAME_LENGTH,
    RESERVED_MOUNTS,
    RESERVED_VOLUMES,
    is_secret_env,
    is_under,
    launcher_env_owner,
)
from rosetta_contract.volume_fields import VolumeSpec, shared_checkpoints_problems

# ---------------------------------------------------------------------------- spec


class TranslationTrainingSpec(TrainerSpec):
    """A TranslationTraining: what to train (the trainer's fields) and where (the cluster fields).

    Field order matters: validators of later fields read earlier ones (info.data).
    """

    image: ImageReference = Field(DEFAULT_IMAGE, description="Trainer container image.")
    image_pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = Field(
        None, description="Kubernetes' default applies when unset."
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list, max_length=16, description="Names of Secrets for pulling the image."
    )
    nodes: int = Field(1, ge=1, le=4096, description="Pods, one per node; torchrun's --nnodes.")
    gpus_per_node: int = Field(
        0, ge=0, le=16, description="GPUs per pod; one process each. 0 trains on CPU (see procsPerNode)."
    )
    procs_per_node: Optional[int] = Field(
        None, ge=1, le=256, description="CPU training only (gpusPerNode 0): processes per pod; default 1."
    )
    launcher: Literal["torchrun", "deepspeed"] = Field(
        "torchrun", description="Process launcher in each pod. Both start the workers with torchrun "
        "(DeepSpeed initializes from its environment, on any number of nodes); deepspeed needs GPUs "
        "and is kept so that existing specs stay valid. distributed.backend chooses DDP or ZeRO."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per-pod resources.")
    network: NetworkSpec = Field(
        default_factory=NetworkSpec, validate_default=True,  # the default port must not be metrics.port either
        description="Interconnect preset and rendezvous port.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128,
        description="Extra environment for the trainer; names the launcher or profile sets are refused.",
    )
    volumes: list[VolumeSpec] = Field(
        default_factory=list, max_length=32, validate_default=True,  # nodes > 1 needs one: check the default too
        description="Volumes for data, model, cache and checkpoints. Without a checkpoints volume the run "
                    "writes to an emptyDir and a restart starts over. With nodes > 1 the checkpoints volume "
                    "must be a persistentVolumeClaim every pod mounts (ReadWriteMany).",
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Where the pods may run.")
    suspend: bool = Field(
        False, description="Hold the training: create its JobSet suspended, or pause a running one. Not needed "
                           "with scheduling.queueName, which creates it suspended for Kueue to admit.",
    )
    failure_policy: FailurePolicySpec = Field(
        default_factory=FailurePolicySpec, description="Whole-gang restarts after a failure."
    )
    ttl_seconds_after_finished: Optional[int] = Field(
        None, ge=0, le=MAX_INT32, description="Delete the JobSet (not the TranslationTraining) this long after it finishes."
    )
    service_account_name: Optional[str] = Field(
        None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="ServiceAccount of the pods (e.g. an IRSA or Workload Identity account for S3/GCS).",
    )
    pod_security: PodSecuritySpec = Field(
        default_factory=PodSecuritySpec, description="Pod securityContext (user, groups)."
    )
    termination_grace_period_seconds: Optional[int] = Field(
        None, ge=0, le=3600,
        description="Seconds between SIGTERM and SIGKILL; leave room to finish a checkpoint on preemption.",
    )

    @field_validator("procs_per_node")
    @classmethod
    def _procs_only_on_cpu(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("gpus_per_node", 0) > 0:
            raise ValueError("procsPerNode is for CPU training; with GPUs there is one process per GPU")
        return value

    @field_validator("launcher")
    @classmethod
    def _deepspeed_needs_gpus(cls, value: Any, info: ValidationInfo) -> Any:
        if value == "deepspeed" and info.data.get("gpus_per_node", 1) == 0:
            raise ValueError("the deepspeed launcher needs gpusPerNode >= 1")
        return value

    @field_validator("network")
    @classmethod
    def _profile_fits(cls, value: NetworkSpec, info: ValidationInfo) -> NetworkSpec:
        profile = PROFILES[value.profile]
        gpus = info.data.get("gpus_per_node")
        if profile.needs_gpus and gpus is not None and not 1 <= gpus <= profile.max_gpus_per_node:
            raise ValueError(
                f"profile '{profile.name}' is for 1..{profile.max_gpus_per_node} GPUs per node, "
                f"gpusPerNode is {gpus}"
            )
        return value

    @field_validator("network")
    @classmethod
    def _ports_differ(cls, value: NetworkSpec, info: ValidationInfo) -> NetworkSpec:
        metrics = info.data.get("metrics")
        if metrics is not None and metrics.port == value.master_port:
            # Both listen on rank 0's pod: whichever binds second fails at start, on every restart.
            raise ValueError(f"metrics.port: {metrics.port} is network.masterPort, the rendezvous port on rank 0's "
                             "pod; choose another port for one of them (metrics default 9400, rendezvous 29500)")
        return value

    @field_validator("scheduling")
    @classmethod
    def _exclusive_topology_fits(cls, value: SchedulingSpec, info: ValidationInfo) -> SchedulingSpec:
        nodes = info.data.get("nodes", 1)
        if value.exclusive_topology == HOSTNAME_LABEL and nodes > 1:
            raise ValueError(
                f"exclusiveTopology {HOSTNAME_LABEL} would need all {nodes} pods on one node (JobSet gives the "
                "one Job of the gang a single topology domain); use a node-pool, rack or block label"
            )
        return value

    @field_validator("scheduling")
    @classmethod
    def _required_topology_fits(cls, value: SchedulingSpec, info: ValidationInfo) -> SchedulingSpec:
        nodes, topology = info.data.get("nodes", 1), value.topology
        if topology is not None and topology.mode == "Required" and topology.level == HOSTNAME_LABEL and nodes > 1:
            raise ValueError(
                f"topology.level {HOSTNAME_LABEL} with mode Required would need all {nodes} pods on one node; "
                "use a block or rack label, or mode Preferred"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_not_launcher_owned(cls, value: list[EnvVar], info: ValidationInfo) -> list[EnvVar]:
        network = info.data.get("network")
        profile = network.profile if network is not None else "generic"
        problems, seen = [], set()
        for i, var in enumerate(value):
            owner = launcher_env_owner(var.name, profile)
            if owner:
                problems.append(f"env[{i}].name: {var.name} is set by {owner}; remove it")
            if var.name in seen:
                problems.append(f"env[{i}].name: {var.name} is set twice")
            seen.add(var.name)
        if problems:
            raise ValueError("\n".join(problems))
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[VolumeSpec], info: ValidationInfo) -> list[VolumeSpec]:
        problems, names, paths = [], set(), set()
        purposes: dict[str, int] = {}
        has_checkpoints = any(vol.purpose == "checkpoints" for vol in value)
        for i, vol in enumerate(value):
            if vol.name in RESERVED_VOLUMES:
                problems.append(f"volumes[{i}].name: '{vol.name}' is reserved for the operator's own volumes")
            elif vol.name in names:
                problems.append(f"volumes[{i}].name: '{vol.name}' is already used")
            mount = vol.mount_path
            if mount in RESERVED_MOUNTS:
                problems.append(f"volumes[{i}].mountPath: {mount} is mounted by the operator")
            elif mount in paths:
                problems.append(f"volumes[{i}].mountPath: {mount} is already used")
            elif mount == DEFAULT_OUTPUT_MOUNT and not has_checkpoints:
                # Without a checkpoints volume the operator mounts its own scratch output there.
                problems.append(f"volumes[{i}].mountPath: {mount} is where the run writes when no volume has "
                                "purpose 'checkpoints'; give this volume that purpose or another path")
            if vol.purpose != "other" and vol.purpose in purposes:
                problems.append(f"volumes[{i}].purpose: only one volume may be for "
                                f"'{vol.purpose}' (volumes[{purposes[vol.purpose]}] is)")
            names.add(vol.name)
            paths.add(mount)
            purposes.setdefault(vol.purpose, i)
        problems += shared_checkpoints_problems(info.data.get("nodes", 1), value, info.data.get("checkpoint"))
        if problems:
            raise ValueError("\n".join(problems))
        return value

    @model_validator(mode="after")
    def _after_training_reads_shared_checkpoints(self) -> Self:
        after = self.evaluation.after_training
        if after is None:
            return self
        # The evaluation is its own pod, started after the gang's pods are gone: it finds the
        # checkpoints only on a volume that outlives them.
        needs = "evaluation.afterTraining: the evaluation pod reads the checkpoints after the training's pods are gone"
        volume = self.volume_for("checkpoints")
        if volume is None or volume.persistent_volume_claim is None:
            raise ValueError(f"{needs}, so they must be on a persistentVolumeClaim, and {_not_a_claim(volume)}")
        directory = self.checkpoint.dir
        if directory and directory.startswith("/") and not any(
                v.persistent_volume_claim is not None and is_under(directory, v.mount_path) for v in self.volumes):
            raise ValueError(f"{needs}: checkpoint.dir {directory} is not on a persistentVolumeClaim volume")
        if not self.data.test:
            raise ValueError("evaluation.afterTraining evaluates the test sets, and data.test is empty")
        if after.checkpoint == "averaged" and self.checkpoint.average is None:
            raise ValueError("evaluation.afterTraining.checkpoint is averaged but checkpoint.average is not set")
        return self

    @model_validator(mode="after")
    def _prepared_onto_a_shared_volume(self) -> Self:
        if self.data.prepare != "BeforeTraining":
            return self
        # The stage job writes <output>/prepared/ and the tokenizer for the gang, which starts
        # after it is gone: the output must be on a volume that outlives it.
        needs = "data.prepare: BeforeTraining: the stage job writes the prepared data into the training's output"
        if self.mode != "train":
            raise ValueError(f"{needs}, and mode {self.mode} trains nothing: drop data.prepare")
        volume = self.volume_for("checkpoints")
        if volume is None or volume.persistent_volume_claim is None:
            raise ValueError(f"{needs} directory, the checkpoints volume, which must be a persistentVolumeClaim, "
                             f"and {_not_a_claim(volume)}")
        if volume.read_only or volume.persistent_volume_claim.read_only:
            raise ValueError(f"{needs} directory, on volume '{volume.name}', which is mounted read-only")
        return self

    @model_validator(mode="after")
    def _staged_onto_a_shared_volume(self) -> Self:
        # The stage job is its own pod, gone before the gang starts: what it copies must be on a
        # volume that outlives it and that it may write.
        for what, source in self.staging_sources():
            self._check_staging(f"{what}.source", source)
        return self

    def _check_staging(self, where: str, source: Any) -> None:
        volume = next((v for v in self.volumes if v.persistent_volume_claim is not None
                       and is_under(source.path, v.mount_path)), None)
        if volume is None:
            raise ValueError(f"{where}: {source.path} is not on a persistentVolumeClaim volume; the stage job copies "
                             "it there before the training's pods start, so it must be under the mountPath of a "
                             "volume every pod shares (e.g. purpose: model or data, on EFS or Filestore)")
        if volume.read_only or (volume.persistent_volume_claim and volume.persistent_volume_claim.read_only):
            raise ValueError(f"{where}: {source.path} is on volume '{volume.name}', which is mounted read-only; "
                             "the stage job writes there")

    @model_validator(mode="after")
    def _device_matches_gpus(self) -> Self:
        if self.training.device == "cuda" and self.gpus_per_node == 0:
            raise ValueError("training.device is cuda but gpusPerNode is 0")
        if self.training.device == "cpu" and self.gpus_per_node > 0:
            raise ValueError("training.device is cpu but gpusPerNode asks for GPUs")
        return self

    # ---- derived values render.py and the handlers share

    @property
    def procs(self) -> int:
        """Processes per pod (torchrun's --nproc-per-node)."""
        return self.gpus_per_node or self.procs_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs

    def volume_for(self, purpose: str) -> VolumeSpec | None:
        return next((v for v in self.volumes if v.purpose == purpose), None)


def _not_a_claim(volume: VolumeSpec | None) -> str:
    """What is wrong with the checkpoints volume, and the volume to add instead."""
    what = "no volume has purpose: checkpoints" if volume is None else \
        f"volume '{volume.name}' (purpose: checkpoints) is not a persistentVolumeClaim"
    return (f"{what}; add {{name: checkpoints, mountPath: {DEFAULT_OUTPUT_MOUNT}, purpose: checkpoints, "
            "persistentVolumeClaim: {claimName: NAME}}")


# The top-level keys this spec adds to the trainer's: what documents.parse_document leaves to the cluster.
CLUSTER_FIELDS = frozenset(
    TranslationTrainingSpec.model_fields[f].alias for f in
    set(TranslationTrainingSpec.model_fields) - set(TrainerSpec.model_fields)
)


class TrainingMetadata(Metadata):
    """The trainer's metadata, with the name short enough for every child object's name."""

    @field_validator("name")
    @classmethod
    def _fits_pod_names(cls, value: str) -> str:
        if len(value) > MAX_NAME_LENGTH:
            raise ValueError(f"'{value}' has {len(value)} characters; at most {MAX_NAME_LENGTH}, so that its "
                             "pods' names (<name>-node-0-<index>-<5 random>) fit in 63")
        return value


class TranslationTraining(BaseModel):
    """The whole document; `status` and other server-side fields are ignored. apiVersion, kind and
    metadata.name are required, as the apiserver requires them."""

    # Unknown top-level keys are refused, as kubectl refuses them; status is the server's to write.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["rosetta.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["TranslationTraining"]
    metadata: TrainingMetadata
    spec: TranslationTrainingSpec
    status: Optional[dict[str, Any]] = Field(None, exclude=True)


def plain(value: Any, _path: str = "", _depth: int = 0) -> Any:
    """kopf hands over Body/Spec mappings, not dicts; pydantic wants plain data. A document nested
    deeper than MAX_DEPTH (the YAML reader's bound; JSON from the apiserver may go deeper) is a
    ConfigError naming where, not a RecursionError."""
    if isinstance(value, (Mapping, list, tuple)) and _depth >= MAX_DEPTH:
        raise ConfigError([(_path or "(document)", f"nested more than {MAX_DEPTH} levels deep")])
    if isinstance(value, Mapping):
        return {str(k): plain(v, f"{_path}.{k}" if _path else str(k), _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{_path}[{i}]", _depth + 1) for i, v in enumerate(value)]
    return value


def _errors(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """format_errors, with list validators' "items[i].field: message" lines moved into the path, and
    the lines a field's validator reports about another field (_SIBLINGS) moved to that field."""
    out = []
    for path, message in format_errors(exc, prefix):
        parent, _, name = path.rpartition(".")
        for line in message.split("\n"):
            m = _ITEM_MESSAGE.match(line)
            sibling = next((s for s in _SIBLINGS.get(name, ()) if line.startswith(s + ": ")), None)
            if m and path.endswith("." + m["field"]):
                out.append((path + m["item"], m["message"]))
            elif sibling and parent:
                out.append((f"{parent}.{sibling}", line[len(sibling) + 2:]))
            else:
                out.append((path, line))
    return out


_ITEM_MESSAGE = re.compile(r"^(?P<field>\w+)(?P<item>\[\d+\](\.\w+)*): (?P<message>.*)$")
# spec field -> the other fields its validator may report on (the volumes rule reads checkpoint.dir,
# the network rule metrics.port).
_SIBLINGS = {"volumes": ("checkpoint.dir",), "network": ("metrics.port",)}


def parse_training(raw: Any, source: str | None = None, allow_host_path: bool = False) -> TranslationTraining:
    """Validate a whole TranslationTraining document; ConfigError lists every problem by field path."""
    raw = plain(raw)
    if not isinstance(raw, dict):
        raise ConfigError([("(document)", "expected a mapping with apiVersion, kind and spec")], source)
    try:
        return TranslationTraining.model_validate(raw, context={"allow_host_path": allow_host_path}, by_name=False)
    except ValidationError as exc:
        raise ConfigError(_errors(exc), source) from None


def parse_spec(raw: Any, allow_host_path: bool = False) -> TranslationTrainingSpec:
    """Validate only a spec (what a kopf handler gets); error paths start with 'spec.'."""
    try:
        return TranslationTrainingSpec.model_validate(plain(raw, "spec"), context={"allow_host_path": allow_host_path},
                                                      by_name=False)
    except ValidationError as exc:
        raise ConfigError(_errors(exc, prefix="spec")) from None


def load_training(path: str | Path, overrides: list[str] | None = None,
                  allow_host_path: bool = False) -> TranslationTraining:
    """Read a TranslationTraining YAML file, apply `a.b=value` overrides, validate."""
    raw = apply_overrides(read_yaml(path), overrides or [], str(path))
    return parse_training(raw, str(path), allow_host_path=allow_host_path)


def parse_for_trainer(raw: Any, source: str | None = None) -> TranslationTraining:
    """The trainer's document, judged by the cluster's rules, cluster fields included: a file that
    runs under `rosetta train`, `prepare`, `stage` or `evaluate` is one the operator accepts. hostPath
    is the operator's admin decision, not the file's. The one model a process parses: its spec is a
    TrainerSpec, so the trainer reads it as one, and dump_training writes it back."""
    return parse_training(raw, source, allow_host_path=True)


def load_for_trainer(path: str | Path, overrides: list[str] | None = None) -> TranslationTraining:
    """Read a TranslationTraining YAML file, apply `a.b=value` overrides, parse_for_trainer."""
    return parse_for_trainer(apply_overrides(read_yaml(path), overrides or [], str(path)), str(path))


__all__ = [
    "DEFAULT_IMAGE", "LAUNCHER_ENV", "LAUNCHER_ENV_PREFIXES", "CLUSTER_FIELDS", "TranslationTraining",
    "TranslationTrainingSpec", "VolumeSpec", "EnvVar", "is_secret_env", "launcher_env_owner",
    "load_training", "load_for_trainer", "parse_for_trainer", "parse_spec", "parse_training", "plain", "ConfigError",
]
