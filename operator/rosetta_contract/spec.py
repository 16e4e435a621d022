"""The operator's TranslationTraining spec: the trainer's spec plus cluster fields.

The CRD schema is generated from these models (crd.py), so descriptions here are
what `kubectl explain translationtraining.spec` shows. The trainer ignores
exactly the keys added here (CLUSTER_FIELDS, derived from the two models).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from rosetta_contract import __version__, core_types
from rosetta_contract.config import Metadata, TrainerSpec, TrainingDocument
from rosetta_contract.documents import apply_overrides, format_errors, parse_document, read_yaml
from rosetta_contract.profiles import PROFILES, USER_OVERRIDABLE
from rosetta_contract.strict_model import ConfigError, IntOrString, JsonObject, Model
from rosetta_contract.strict_yaml import MAX_DEPTH

DEFAULT_IMAGE = f"ghcr.io/rosetta-dev/rosetta-trainer:{__version__}"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MOUNT_PATH = r"^/.*[^/]$"
# Label and taint keys: [DNS subdomain/]name; label values: at most 63, alphanumeric at both ends.
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An extended resource (a GPU) is always domain/name: nvidia.com/gpu, amd.com/gpu.
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# Kubernetes' quantity grammar without the sign: a negative request, limit or size is never meant.
QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"

# Set by render.py (or by torchrun/deepspeed from what render.py sets); a user
# value would silently desynchronise the ranks, so it is an error instead.
LAUNCHER_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
    "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
})
# ROSETTA_: ours; PET_: torchrun reads its arguments from these; TORCHELASTIC_: set per worker.
LAUNCHER_ENV_PREFIXES = ("ROSETTA_", "PET_", "TORCHELASTIC_")
# Volumes and paths the pod template itself mounts. The root filesystem is read-only, so
# /tmp and the image's home (caches: HF hub, triton, DeepSpeed's JIT ops) are emptyDirs.
TRAINER_HOME = "/home/rosetta"
RESERVED_VOLUMES = ("dshm", "config", "output", "tmp", "home")
RESERVED_MOUNTS = ("/dev/shm", "/etc/rosetta", "/tmp", TRAINER_HOME)
# The trainer image's user (Dockerfile); pods run as it unless podSecurity says otherwise.
TRAINER_UID = 10001
# Env names that hold credentials: their value must come from a Secret (valueFrom.secretKeyRef),
# never be written into the spec, where the ConfigMap and the JobSet would copy it in clear.
SECRET_ENV_NAME = r"(?i)^(AWS_ACCESS_KEY_ID|(.*_)?(TOKEN|PASSWORD|PASSWD|API_KEY|APIKEY)|(.*_)?SECRETS?(_.*)?)$"
# JobSet names each pod <name>-node-<job>-<index>-<5 random characters>, a DNS-1035 label of at
# most 63 characters; with one node and job 0 that leaves 63 - len("-node-0-0-abcde") = 48.
MAX_NAME_LENGTH = 48
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Where the run writes when no volume has purpose: checkpoints (an emptyDir then).
DEFAULT_OUTPUT_MOUNT = "/checkpoints"


def launcher_env_owner(name: str, profile: str = "generic") -> str | None:
    """Who sets `name` in the trainer container, or None when the user may set it."""
    if name in LAUNCHER_ENV or name.startswith(LAUNCHER_ENV_PREFIXES):
        return "the launcher"
    if profile in PROFILES and name in PROFILES[profile].env and name not in USER_OVERRIDABLE:
        return f"network profile '{profile}'"
    return None


def _number_to_str(value: Any) -> Any:
    # YAML reads `cpu: 8` as an int; Kubernetes quantities are int-or-string (not float: `cpu: 0.5`
    # is refused by the apiserver, so here too).
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 1e9: a whole number to the apiserver
    return value


def _matches(pattern: str, expected: str):
    # pydantic's own message would print the regex; say what a valid value looks like instead.
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.match(value):
            raise ValueError(f"'{value}' is not {expected}")
        return value
    return AfterValidator(check)


Quantity = Annotated[
    str,
    IntOrString(),
    BeforeValidator(_number_to_str),
    _matches(QUANTITY, "a non-negative Kubernetes quantity (e.g. 8, 7500m, 64Gi)"),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}],
                    "pattern": QUANTITY}),
]
DnsLabel = Annotated[
    str,
    Field(min_length=1, max_length=63, json_schema_extra={"pattern": DNS1123_LABEL}),
    _matches(DNS1123_LABEL, "a DNS-1123 label (lowercase letters, digits and '-', alphanumeric at both ends)"),
]
# Secrets, ConfigMaps and PVCs may have dotted names (volumes and containers may not).
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN}),
    _matches(DNS1123_SUBDOMAIN, "a valid object name (lowercase letters, digits, '-' and '.')"),
]


# The distribution reference grammar (github.com/distribution/reference, what registries and the
# kubelet parse): [host[:port]/]path[:tag][@digest], path components in lowercase.
_IMAGE_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (rf"^(?:{_IMAGE_HOST}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
                   r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def _image_reference(value: str) -> str:
    if not re.match(IMAGE_REFERENCE, value):
        raise ValueError(f"'{value}' is not an image reference a registry accepts "
                         "([registry/]repository[:tag][@sha256:digest], repository in lowercase)")
    name = value.split("@")[0]
    head, _, tail = name.rpartition(":")
    repository = head if head and "/" not in tail else name
    first, slash, _ = repository.partition("/")
    # As docker and containerd read it: the first part is a registry only when it looks like a host.
    if slash and not ("." in first or ":" in first or first == "localhost") and not re.fullmatch(_IMAGE_COMPONENT, first):
        raise ValueError(f"'{value}' is not an image reference a registry accepts (repository names are lowercase)")
    if len(repository) > 255:
        raise ValueError("the repository name is longer than 255 characters")
    return value


ImageReference = Annotated[
    str, Field(min_length=1, max_length=512, json_schema_extra={"pattern": IMAGE_REFERENCE}),
    AfterValidator(_image_reference),
]


# ---------------------------------------------------------------------- resources


class ResourcesSpec(Model):
    """Per-pod requests. GPUs come from gpusPerNode, EFA devices from the network profile."""

    cpu: Optional[Quantity] = Field(None, description="CPU request per pod, e.g. 16 or 7500m.")
    memory: Optional[Quantity] = Field(
        None, description="Memory request and limit per pod, e.g. 64Gi (shared memory counts against it)."
    )
    gpu_resource: str = Field(
        "nvidia.com/gpu", min_length=3, max_length=253, pattern=EXTENDED_RESOURCE,
        description="Extended resource name of a GPU, e.g. nvidia.com/gpu or amd.com/gpu.",
    )
    efa: Optional[int] = Field(
        None, ge=0, le=64, description="EFA devices per pod; default: the network profile's count."
    )
    shm_size: Quantity = Field(
        "16Gi", description="Size of the in-memory /dev/shm (dataloader workers and NCCL use it)."
    )


# ------------------------------------------------------------------------ network


class NetworkSpec(Model):
    profile: Literal["generic", "eks-p4d", "eks-p5", "gke-a3"] = Field(
        "generic",
        description=(
            "Fabric preset: generic (nothing added); eks-p4d / eks-p5 (EFA devices, FI_* and NCCL env, "
            "instance-type node selector); gke-a3 (GPUDirect-TCPX NCCL env, H100 node selector)."
        ),
    )
    master_port: int = Field(29500, ge=1024, le=65535, description="Rendezvous port on the rank-0 pod.")


# ---------------------------------------------------------------------------- env


class KeyRef(Model):
    name: ObjectName = Field(..., description="Name of the Secret or ConfigMap.")
    key: str = Field(..., min_length=1, max_length=253, description="Key inside it.")
    optional: Optional[bool] = Field(None, description="Start the pod even when the key is missing.")


class EnvSource(Model):
    secret_key_ref: Optional[KeyRef] = Field(None, description="Read the value from a Secret key.")
    config_map_key_ref: Optional[KeyRef] = Field(None, description="Read the value from a ConfigMap key.")

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("set exactly one of 'secretKeyRef' or 'configMapKeyRef'")
        return self


def is_secret_env(name: str) -> bool:
    """WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...: a name whose value is a credential."""
    return re.match(SECRET_ENV_NAME, name) is not None


class EnvVar(Model):
    name: Annotated[str, _matches(ENV_NAME, "a valid environment variable name (letters, digits, '_', '-', '.')")] = Field(
        ..., min_length=1, max_length=128, json_schema_extra={"pattern": ENV_NAME}, description="Variable name."
    )
    value: Optional[str] = Field(
        None, max_length=32768,
        description="Literal value; refused for credential names (*_TOKEN, *_SECRET*, *_PASSWORD, *_API_KEY, "
                    "AWS_ACCESS_KEY_ID): use valueFrom.secretKeyRef.",
    )
    value_from: Optional[EnvSource] = Field(None, description="Take the value from a Secret or ConfigMap.")

    @field_validator("value")
    @classmethod
    def _no_literal_secret(cls, value, info: ValidationInfo):
        name = info.data.get("name")
        if value is not None and name and is_secret_env(name):
            raise ValueError(f"{name} holds a credential: a literal value would be stored in clear in the "
                             "TranslationTraining, its ConfigMap and the JobSet; use valueFrom.secretKeyRef")
        return value

    @field_validator("value_from")
    @classmethod
    def _secret_from_a_secret(cls, value, info: ValidationInfo):
        name = info.data.get("name")
        if value is not None and value.secret_key_ref is None and name and is_secret_env(name):
            raise ValueError(f"{name} holds a credential: take it from a Secret (valueFrom.secretKeyRef), "
                             "not a ConfigMap")
        return value

    @model_validator(mode="after")
    def _not_both(self):
        if self.value is not None and self.value_from is not None:
            raise ValueError("set either 'value' or 'valueFrom', not both")
        return self


# ------------------------------------------------------------------------ volumes


class PvcSource(Model):
    claim_name: ObjectName = Field(..., description="PersistentVolumeClaim in the training's namespace (EFS, Filestore, ...).")
    read_only: bool = Field(False, description="Mount the claim read-only.")


class EmptyDirSource(Model):
    medium: Optional[Literal["Memory"]] = Field(None, description="Memory for tmpfs; default: node disk.")
    size_limit: Optional[Quantity] = Field(None, description="Evict the pod when it uses more than this.")


class HostPathSource(Model):
    path: str = Field(..., min_length=1, max_length=1024, pattern=r"^/", description="Absolute path on the node.")
    type: Optional[Literal["Directory", "DirectoryOrCreate", "File", "FileOrCreate"]] = Field(
        None, description="Check or create the path before mounting."
    )


VolumePurpose = Literal["data", "model", "checkpoints", "cache", "other"]


class VolumeSpec(Model):
    """One volume mounted into every pod. Exactly one of the sources must be set."""

    name: DnsLabel = Field(..., description="Volume name (DNS-1123 label), unique in the list.")
    # No trailing '/': paths compare as plain strings, here and in the CRD's CEL rules.
    mount_path: str = Field(
        ..., min_length=2, max_length=512, pattern=MOUNT_PATH,
        description="Absolute path in the container, without a trailing '/'.",
    )
    purpose: VolumePurpose = Field(
        "other",
        description=(
            "checkpoints: the run writes <mountPath>/<training name> (ROSETTA_OUTPUT), at most one; "
            "data / model: exported as ROSETTA_DATA_DIR / ROSETTA_MODEL_DIR; cache: HF_HOME lives here; other."
        ),
    )
    read_only: bool = Field(False, description="Mount read-only.")
    sub_path: Optional[str] = Field(
        None, min_length=1, max_length=512,
        description="Mount this sub-directory of the volume: a relative path without '..'.")
    persistent_volume_claim: Optional[PvcSource] = Field(None, description="A PVC, e.g. EFS or Filestore.")
    empty_dir: Optional[EmptyDirSource] = Field(None, description="Scratch space that lives as long as the pod.")
    host_path: Optional[HostPathSource] = Field(
        None, description="A node directory; refused unless the operator runs with --allow-host-path."
    )

    @field_validator("mount_path")
    @classmethod
    def _mount_path_normal(cls, value: str):
        # /data/../etc/rosetta is /etc/rosetta: reserved paths are compared in their one spelling.
        normal = "/" + posixpath.normpath(value).lstrip("/")  # POSIX keeps a leading '//'
        if normal != value:
            raise ValueError(f"'{value}' is not a normalized path; write it as '{normal}'")
        return value

    @field_validator("sub_path")
    @classmethod
    def _sub_path_inside(cls, value: Optional[str]):
        # The kubelet refuses these too, but only when the pod starts: every restart fails alike.
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError(f"'{value}' must be a relative path that stays inside the volume "
                             "(no leading '/', no '..')")
        return value

    @field_validator("host_path")
    @classmethod
    def _host_path_allowed(cls, value, info: ValidationInfo):
        # Per item, not in the list validator, so it is reported even when another volume is invalid.
        if value is not None and not (info.context or {}).get("allow_host_path", False):
            raise ValueError("hostPath volumes are not allowed by this operator (it runs without "
                             "--allow-host-path); use a persistentVolumeClaim")
        return value

    @model_validator(mode="after")
    def _one_source(self):
        sources = [s for s in (self.persistent_volume_claim, self.empty_dir, self.host_path) if s is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of 'persistentVolumeClaim', 'emptyDir' or 'hostPath'")
        if self.purpose == "checkpoints" and (self.read_only or (self.persistent_volume_claim and
                                                                 self.persistent_volume_claim.read_only)):
            raise ValueError("the checkpoints volume must be writable")
        return self


# --------------------------------------------------------------------- scheduling


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
    def _exists_has_no_value(self):
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("operator 'Exists' takes no 'value'")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is for effect 'NoExecute' only")
        return self


class SchedulingSpec(Model):
    node_selector: dict[Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=QUALIFIED_NAME)],
                        Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]] = Field(
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
    exclusive_topology: Optional[str] = Field(
        None, max_length=317,
        description=(
            "Node label key (e.g. cloud.google.com/gke-nodepool) of a topology domain that the whole gang gets "
            "to itself: JobSet places each Job in one domain, and ours is one Job of all the nodes."
        ),
    )

    @field_validator("affinity")
    @classmethod
    def _affinity_is_a_pod_affinity(cls, value: Optional[dict]):
        found = core_types.problems(value, "V1Affinity") if value is not None else []
        if found:
            raise ValueError("; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else ""))
        return value


_USE_A_CLAIM = "use a persistentVolumeClaim (ReadWriteMany: EFS, Filestore, NFS)"


def _shared_checkpoints_problems(nodes: int, volumes: list[VolumeSpec], checkpoint) -> list[str]:
    """Why the checkpoints of a training on `nodes` pods would not be on storage every pod shares.

    Every rank writes into the checkpoint rank 0 finalises (its RNG state; its ZeRO shards under
    DeepSpeed), and every rank resumes from it, so with more than one node the checkpoints must be
    on one volume that all pods mount: a persistentVolumeClaim. An emptyDir is each pod's own, a
    hostPath each node's own. Mirroring to S3 does not help: rank 0 uploads only what it sees.
    The trainer checks it again at start (checkpoint.check_shared), for runs launched by hand.
    """
    if nodes <= 1:
        return []
    needs = f"a training on {nodes} nodes needs its checkpoints on storage every pod shares"
    volume = next((v for v in volumes if v.purpose == "checkpoints"), None)
    problems = []
    if volume is None:
        problems.append(
            f"{needs}, and no volume has purpose: checkpoints, so the run would write to an emptyDir at "
            f"{DEFAULT_OUTPUT_MOUNT} that each pod gets its own of; add a volume with purpose: checkpoints on a "
            f"persistentVolumeClaim (ReadWriteMany: EFS, Filestore, NFS), e.g. {{name: checkpoints, mountPath: "
            f"{DEFAULT_OUTPUT_MOUNT}, purpose: checkpoints, persistentVolumeClaim: {{claimName: NAME}}}}")
    elif volume.empty_dir is not None:
        problems.append(f"{needs}: volume '{volume.name}' (purpose: checkpoints) is an emptyDir, which each pod "
                        f"gets its own of; {_USE_A_CLAIM}")
    elif volume.host_path is not None:
        problems.append(f"{needs}: volume '{volume.name}' (purpose: checkpoints) is a hostPath, a directory of "
                        f"whichever node each pod runs on; {_USE_A_CLAIM}")
    directory = getattr(checkpoint, "dir", None)
    if directory and directory.startswith("/") and not any(
            v.persistent_volume_claim is not None and _under(directory, v.mount_path) for v in volumes):
        # Relative paths are under the output, on the checkpoints volume checked above.
        problems.append(f"checkpoint.dir: {needs}: {directory} is not on a persistentVolumeClaim volume; use a "
                        "relative path (under the checkpoints volume) or one under such a volume's mountPath")
    return problems


def _under(path: str, mount: str) -> bool:
    path = path.rstrip("/") or "/"
    return path == mount or path.startswith(mount + "/")


class FailurePolicySpec(Model):
    max_restarts: int = Field(
        3, ge=0, le=1000,
        description="Restart the whole JobSet this many times after a pod fails. Restarts after a preemption, "
                    "eviction or drain (the pod's DisruptionTarget condition) do not count.",
    )


class PodSecuritySpec(Model):
    """The trainer always runs as a non-root user; these choose which one."""

    run_as_user: Optional[int] = Field(
        None, ge=0, description=f"UID of the trainer process (default {TRAINER_UID}, the image's user); not 0."
    )
    run_as_group: Optional[int] = Field(
        None, ge=0, description=f"Primary GID of the trainer process (default {TRAINER_UID})."
    )
    fs_group: Optional[int] = Field(
        None, ge=0, description=f"Group that owns mounted volumes (default {TRAINER_UID}; EFS access points)."
    )
    run_as_non_root: Optional[bool] = Field(
        None, description="Always true for trainer pods: the kubelet refuses to start a container as root."
    )
    automount_service_account_token: bool = Field(
        False,
        description="Mount the ServiceAccount's API token into the pods. The trainer never calls the "
                    "Kubernetes API; IRSA, EKS Pod Identity and GKE Workload Identity work without it.",
    )

    @field_validator("run_as_user")
    @classmethod
    def _not_root(cls, value):
        if value == 0:
            raise ValueError("trainer pods do not run as root (UID 0); use the image's user "
                             f"({TRAINER_UID}) or another non-zero UID")
        return value

    @field_validator("run_as_non_root")
    @classmethod
    def _non_root_stays_on(cls, value):
        if value is False:
            raise ValueError("trainer pods always run as non-root; remove runAsNonRoot or set it to true")
        return value


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
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Interconnect preset and rendezvous port.")
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
        None, ge=0, description="Delete the JobSet (not the TranslationTraining) this long after it finishes."
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
    def _procs_only_on_cpu(cls, value, info: ValidationInfo):
        if value is not None and info.data.get("gpus_per_node", 0) > 0:
            raise ValueError("procsPerNode is for CPU training; with GPUs there is one process per GPU")
        return value

    @field_validator("launcher")
    @classmethod
    def _deepspeed_needs_gpus(cls, value, info: ValidationInfo):
        if value == "deepspeed" and info.data.get("gpus_per_node", 1) == 0:
            raise ValueError("the deepspeed launcher needs gpusPerNode >= 1")
        return value

    @field_validator("network")
    @classmethod
    def _profile_fits(cls, value: NetworkSpec, info: ValidationInfo):
        profile = PROFILES[value.profile]
        gpus = info.data.get("gpus_per_node")
        if profile.needs_gpus and gpus is not None and not 1 <= gpus <= profile.max_gpus_per_node:
            raise ValueError(
                f"profile '{profile.name}' is for 1..{profile.max_gpus_per_node} GPUs per node, "
                f"gpusPerNode is {gpus}"
            )
        return value

    @field_validator("scheduling")
    @classmethod
    def _exclusive_topology_fits(cls, value: SchedulingSpec, info: ValidationInfo):
        nodes = info.data.get("nodes", 1)
        if value.exclusive_topology == HOSTNAME_LABEL and nodes > 1:
            raise ValueError(
                f"exclusiveTopology {HOSTNAME_LABEL} would need all {nodes} pods on one node (JobSet gives the "
                "one Job of the gang a single topology domain); use a node-pool, rack or block label"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_not_launcher_owned(cls, value: list[EnvVar], info: ValidationInfo):
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
    def _volumes(cls, value: list[VolumeSpec], info: ValidationInfo):
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
        problems += _shared_checkpoints_problems(info.data.get("nodes", 1), value, info.data.get("checkpoint"))
        if problems:
            raise ValueError("\n".join(problems))
        return value

    @model_validator(mode="after")
    def _after_training_reads_shared_checkpoints(self):
        after = self.evaluation.after_training
        if after is None:
            return self
        # The evaluation is its own pod, started after the gang's pods are gone: it finds the
        # checkpoints only on a volume that outlives them.
        needs = "evaluation.afterTraining: the evaluation pod reads the checkpoints after the training's pods are gone"
        volume = self.volume_for("checkpoints")
        if volume is None or volume.persistent_volume_claim is None:
            what = "no volume has purpose: checkpoints" if volume is None else \
                f"volume '{volume.name}' (purpose: checkpoints) is not a persistentVolumeClaim"
            raise ValueError(f"{needs}, so they must be on a persistentVolumeClaim, and {what}; add "
                             f"{{name: checkpoints, mountPath: {DEFAULT_OUTPUT_MOUNT}, purpose: checkpoints, "
                             "persistentVolumeClaim: {claimName: NAME}}")
        directory = self.checkpoint.dir
        if directory and directory.startswith("/") and not any(
                v.persistent_volume_claim is not None and _under(directory, v.mount_path) for v in self.volumes):
            raise ValueError(f"{needs}: checkpoint.dir {directory} is not on a persistentVolumeClaim volume")
        if not self.data.test:
            raise ValueError("evaluation.afterTraining evaluates the test sets, and data.test is empty")
        if after.checkpoint == "averaged" and self.checkpoint.average is None:
            raise ValueError("evaluation.afterTraining.checkpoint is averaged but checkpoint.average is not set")
        return self

    @model_validator(mode="after")
    def _staged_onto_a_shared_volume(self):
        # The stage job is its own pod, gone before the gang starts: what it copies must be on a
        # volume that outlives it and that it may write.
        for what, source in self.staging_sources():
            self._check_staging(f"{what}.source", source)
        return self

    def _check_staging(self, where: str, source) -> None:
        volume = next((v for v in self.volumes if v.persistent_volume_claim is not None
                       and _under(source.path, v.mount_path)), None)
        if volume is None:
            raise ValueError(f"{where}: {source.path} is not on a persistentVolumeClaim volume; the stage job copies "
                             "it there before the training's pods start, so it must be under the mountPath of a "
                             "volume every pod shares (e.g. purpose: model or data, on EFS or Filestore)")
        if volume.read_only or (volume.persistent_volume_claim and volume.persistent_volume_claim.read_only):
            raise ValueError(f"{where}: {source.path} is on volume '{volume.name}', which is mounted read-only; "
                             "the stage job writes there")

    @model_validator(mode="after")
    def _device_matches_gpus(self):
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


# The top-level keys this spec adds to the trainer's: what config.parse_document leaves to the cluster.
CLUSTER_FIELDS = frozenset(
    TranslationTrainingSpec.model_fields[f].alias for f in
    set(TranslationTrainingSpec.model_fields) - set(TrainerSpec.model_fields)
)


class TrainingMetadata(Metadata):
    """The trainer's metadata, with the name short enough for every child object's name."""

    @field_validator("name")
    @classmethod
    def _fits_pod_names(cls, value: str):
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
# spec field -> the other fields its validator may report on (the volumes rule reads checkpoint.dir).
_SIBLINGS = {"volumes": ("checkpoint.dir",)}


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


def parse_for_trainer(raw: Any, source: str | None = None) -> TrainingDocument:
    """The trainer's view of a document, judged by the cluster's rules first, cluster fields included:
    a file that runs under `rosetta train`, `prepare`, `stage` or `evaluate` is one the operator
    accepts. hostPath is the operator's admin decision, not the file's."""
    parse_training(raw, source, allow_host_path=True)
    return parse_document(raw, source)


def load_for_trainer(path: str | Path, overrides: list[str] | None = None) -> TrainingDocument:
    """Read a TranslationTraining YAML file, apply `a.b=value` overrides, parse_for_trainer."""
    return parse_for_trainer(apply_overrides(read_yaml(path), overrides or [], str(path)), str(path))


__all__ = [
    "DEFAULT_IMAGE", "LAUNCHER_ENV", "LAUNCHER_ENV_PREFIXES", "CLUSTER_FIELDS", "TranslationTraining",
    "TranslationTrainingSpec", "VolumeSpec", "EnvVar", "is_secret_env", "launcher_env_owner", "load_training",
    "load_for_trainer", "parse_for_trainer", "parse_spec", "parse_training", "plain", "ConfigError",
]
