"""The volumes of a TranslationTraining (spec.volumes): PVCs, emptyDirs, hostPaths, what each is
for, and whether a multi-node training's checkpoints are on storage every pod shares.

The CRD schema is generated from these models too (crd.py): descriptions here are what
`kubectl explain` shows.
"""

from __future__ import annotations

import posixpath
from typing import Any, Literal, Optional, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rosetta_contract.checkpoint_fields import CheckpointSpec
from rosetta_contract.kube_names import MOUNT_PATH, DnsLabel, ObjectName
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import Model
from rosetta_contract.trainer_pod import DEFAULT_OUTPUT_MOUNT, KERNEL_MOUNTS, RESERVED_MOUNTS, is_under


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
            "data / model: exported as ROSETTA_DATA_DIR / ROSETTA_MODEL_DIR; cache: HF_HOME and DeepSpeed's "
            "compiled CPU Adam live here (built once per machine type, not at every start); other."
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


