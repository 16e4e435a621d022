"""The cluster's pod-level fields of a TranslationTraining: resources, network, env, volumes,
scheduling, failure policy and pod security, with the Kubernetes name and value patterns they are
checked against. TranslationTrainingSpec (spec.py) puts them beside the trainer's fields.

The CRD schema is generated from these models too (crd.py): descriptions here are what
`kubectl explain` shows.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal, Optional, Self, cast

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rosetta_contract import __version__, core_types
from rosetta_contract.checkpoint_fields import CheckpointSpec
from rosetta_contract.failures import DEFAULT_ACTIONS, FailureClass
from rosetta_contract.labels import QUALIFIED_NAME, LabelKey, LabelValue
from rosetta_contract.profiles import PROFILES, USER_OVERRIDABLE
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import JsonObject, Model, matches

DEFAULT_IMAGE = f"ghcr.io/rosetta-dev/rosetta-trainer:{__version__}"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MOUNT_PATH = r"^/.*[^/]$"
# An extended resource (a GPU) is always domain/name: nvidia.com/gpu, amd.com/gpu.
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

# Set by pod_template.py (or by torchrun/deepspeed from what it sets); a user
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
# The kernel's filesystems in every container (/dev/shm, ours, is reserved above).
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")
# The trainer image's user (Dockerfile); pods run as it unless podSecurity says otherwise.
TRAINER_UID = 10001
# An int32 field's largest value; also the largest UID/GID the apiserver admits.
MAX_INT32 = 2**31 - 1
# Env names that hold credentials: their value must come from a Secret (valueFrom.secretKeyRef),
# never be written into the spec, where the ConfigMap and the JobSet would copy it in clear.
# Words may be joined by '_', '-' or '.' (HF-TOKEN, db.password), as env names allow.
SECRET_ENV_NAME = (r"(?i)^(AWS_ACCESS_KEY_ID|(.*[-_.])?(TOKEN|PASSWORD|PASSWD|API[-_.]?KEY|PRIVATE[-_.]?KEY|"
                   r"CREDENTIALS?)|(.*[-_.])?SECRETS?([-_.].*)?)$")
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


DnsLabel = Annotated[
    str,
    Field(min_length=1, max_length=63, json_schema_extra={"pattern": DNS1123_LABEL}),
    matches(DNS1123_LABEL, "a DNS-1123 label (lowercase letters, digits and '-', alphanumeric at both ends)"),
]
# Secrets, ConfigMaps and PVCs may have dotted names (volumes and containers may not).
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN}),
    matches(DNS1123_SUBDOMAIN, "a valid object name (lowercase letters, digits, '-' and '.')"),
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
    port = re.match(r"^[^/\[]*(?:\[[^\]]*\])?:([0-9]+)/", value) if slash else None
    if port and not 0 < int(port[1]) <= 65535:
        raise ValueError(f"'{value}': the registry's port {port[1]} is not a TCP port (1-65535)")
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
    def _exactly_one(self) -> Self:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("set exactly one of 'secretKeyRef' or 'configMapKeyRef'")
        return self


def is_secret_env(name: str) -> bool:
    """WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...: a name whose value is a credential."""
    return re.match(SECRET_ENV_NAME, name) is not None


class EnvVar(Model):
    name: Annotated[str, matches(ENV_NAME, "a valid environment variable name (letters, digits, '_', '-', '.')")] = Field(
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
    def _no_literal_secret(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.data.get("name")
        if value is not None and name and is_secret_env(name):
            raise ValueError(f"{name} holds a credential: a literal value would be stored in clear in the "
                             "TranslationTraining, its ConfigMap and the JobSet; use valueFrom.secretKeyRef")
        return value

    @field_validator("value_from")
    @classmethod
    def _secret_from_a_secret(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.data.get("name")
        if value is not None and value.secret_key_ref is None and name and is_secret_env(name):
            raise ValueError(f"{name} holds a credential: take it from a Secret (valueFrom.secretKeyRef), "
                             "not a ConfigMap")
        return value

    @model_validator(mode="after")
    def _not_both(self) -> Self:
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
    def _mount_path_normal(cls, value: str) -> str:
        # /data/../etc/rosetta is /etc/rosetta: reserved paths are compared in their one spelling.
        normal = "/" + posixpath.normpath(value).lstrip("/")  # POSIX keeps a leading '//'
        if normal != value:
            raise ValueError(f"'{value}' is not a normalized path; write it as '{normal}'")
        if value not in RESERVED_MOUNTS and any(is_under(value, kernel) for kernel in KERNEL_MOUNTS):
            # The container runtime refuses to mount over procfs, sysfs or devices: the pod never starts.
            raise ValueError(f"'{value}' is under {', '.join(KERNEL_MOUNTS)}, which the container runtime "
                             "keeps for the kernel's own filesystems; mount the volume elsewhere (e.g. /data)")
        return value

    @field_validator("sub_path")
    @classmethod
    def _sub_path_inside(cls, value: Optional[str]) -> Optional[str]:
        # The kubelet refuses these too, but only when the pod starts: every restart fails alike.
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError(f"'{value}' must be a relative path that stays inside the volume "
                             "(no leading '/', no '..')")
        return value

    @field_validator("host_path")
    @classmethod
    def _host_path_allowed(cls, value: Any, info: ValidationInfo) -> Any:
        # Per item, not in the list validator, so it is reported even when another volume is invalid.
        if value is not None and not (info.context or {}).get("allow_host_path", False):
            raise ValueError("hostPath volumes are not allowed by this operator (it runs without "
                             "--allow-host-path); use a persistentVolumeClaim")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Self:
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


_USE_A_CLAIM = "use a persistentVolumeClaim (ReadWriteMany: EFS, Filestore, NFS)"


def shared_checkpoints_problems(nodes: int, volumes: list[VolumeSpec], checkpoint: Optional[CheckpointSpec]) -> list[str]:
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
            v.persistent_volume_claim is not None and is_under(directory, v.mount_path) for v in volumes):
        # Relative paths are under the output, on the checkpoints volume checked above.
        problems.append(f"checkpoint.dir: {needs}: {directory} is not on a persistentVolumeClaim volume; use a "
                        "relative path (under the checkpoints volume) or one under such a volume's mountPath")
    return problems


def is_under(path: str, mount: str) -> bool:
    path = path.rstrip("/") or "/"
    return path == mount or path.startswith(mount + "/")


FailureAction = Literal["Fail", "Restart"]


def _action(failure_class: str, what: str) -> Any:
    return Field(DEFAULT_ACTIONS[failure_class], description=f"{what} Default {DEFAULT_ACTIONS[failure_class]}.")


class FailureActionsSpec(Model):
    """What ends the training at once (Fail) and what restarts the gang from its last checkpoint
    (Restart, counted towards maxRestarts), by why an attempt ended. A preemption or a lost node
    always restarts without counting; any other crash restarts and counts."""

    data_invalid: FailureAction = _action(FailureClass.DATA_INVALID, "The trainer refused the training data.")
    config_error: FailureAction = _action(FailureClass.CONFIG_ERROR, "The document, a path or a checkpoint cannot be used.")
    non_finite: FailureAction = _action(FailureClass.NON_FINITE, "training.nanPolicy: stop ended the run.")
    cuda_out_of_memory: FailureAction = _action(FailureClass.CUDA_OUT_OF_MEMORY, "A rank ran out of GPU memory.")
    oom_killed: FailureAction = _action(FailureClass.OOM_KILLED, "The kernel killed a container at resources.memory.")
    image_pull_failed: FailureAction = _action(
        FailureClass.IMAGE_PULL_FAILED,
        "The kubelet cannot pull the image; Restart keeps the pods waiting while the kubelet retries.")
    collective_timeout: FailureAction = _action(
        FailureClass.COLLECTIVE_TIMEOUT, "A collective waited faultTolerance.collectiveTimeoutSeconds for a rank.")

    def action(self, failure_class: str) -> Optional[FailureAction]:
        """The action for a class, or None for one no spec chooses (Preempted, NodeLost, Error, Stalled)."""
        name = CONFIGURABLE_FIELDS.get(failure_class)
        return None if name is None else cast(FailureAction, getattr(self, name))


CONFIGURABLE_FIELDS = {
    FailureClass.DATA_INVALID: "data_invalid", FailureClass.CONFIG_ERROR: "config_error",
    FailureClass.NON_FINITE: "non_finite", FailureClass.CUDA_OUT_OF_MEMORY: "cuda_out_of_memory",
    FailureClass.OOM_KILLED: "oom_killed", FailureClass.IMAGE_PULL_FAILED: "image_pull_failed",
    FailureClass.COLLECTIVE_TIMEOUT: "collective_timeout",
}


class FailurePolicySpec(Model):
    max_restarts: int = Field(
        3, ge=0, le=1000,
        description="Restart the whole JobSet this many times after a pod fails. Restarts after a preemption, "
                    "eviction or drain (the pod's DisruptionTarget condition) do not count.",
    )
    actions: FailureActionsSpec = Field(
        default_factory=FailureActionsSpec,
        description="By why an attempt ended (status.attempts[].reason): fail the training at once, or restart "
                    "the gang. Deterministic errors fail by default; a collective timeout restarts.",
    )


class PodSecuritySpec(Model):
    """The trainer always runs as a non-root user; these choose which one."""

    run_as_user: Optional[int] = Field(
        None, ge=0, le=MAX_INT32, description=f"UID of the trainer process (default {TRAINER_UID}, the image's user); not 0."
    )
    run_as_group: Optional[int] = Field(
        None, ge=0, le=MAX_INT32, description=f"Primary GID of the trainer process (default {TRAINER_UID})."
    )
    fs_group: Optional[int] = Field(
        None, ge=0, le=MAX_INT32, description=f"Group that owns mounted volumes (default {TRAINER_UID}; EFS access points)."
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
    def _not_root(cls, value: Any) -> Any:
        if value == 0:
            raise ValueError("trainer pods do not run as root (UID 0); use the image's user "
                             f"({TRAINER_UID}) or another non-zero UID")
        return value

    @field_validator("run_as_non_root")
    @classmethod
    def _non_root_stays_on(cls, value: Any) -> Any:
        if value is False:
            raise ValueError("trainer pods always run as non-root; remove runAsNonRoot or set it to true")
        return value
