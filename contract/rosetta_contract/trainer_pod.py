"""What the operator's pod template fixes in every trainer pod, and so what a spec may not set or
mount there: the image, the launcher's environment, the reserved volumes and paths, the user, the
credential names whose values must come from a Secret, the longest training name.

pod_template.py builds the pods with these; spec.py and the CRD's CEL rules (crd.py) refuse what
would clash with them.
"""

from __future__ import annotations

import re

from rosetta_contract import __version__
from rosetta_contract.profiles import PROFILES, USER_OVERRIDABLE

DEFAULT_IMAGE = f"ghcr.io/rosetta-dev/rosetta-trainer:{__version__}"

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
# Env names that hold credentials: their value must come from a Secret (valueFrom.secretKeyRef),
# never be written into the spec, where the ConfigMap and the JobSet would copy it in clear.
# Words may be joined by '_', '-' or '.' (HF-TOKEN, db.password), as env names allow.
SECRET_ENV_NAME = (r"(?i)^(AWS_ACCESS_KEY_ID|(.*[-_.])?(TOKEN|PASSWORD|PASSWD|API[-_.]?KEY|PRIVATE[-_.]?KEY|"
                   r"CREDENTIALS?)|(.*[-_.])?SECRETS?([-_.].*)?)$")
# JobSet names each pod <name>-node-<job>-<index>-<5 random characters>, a DNS-1035 label of at
# most 63 characters; with one node and job 0 that leaves 63 - len("-node-0-0-abcde") = 48.
MAX_NAME_LENGTH = 48
# Where the run writes when no volume has purpose: checkpoints (an emptyDir then).
DEFAULT_OUTPUT_MOUNT = "/checkpoints"


def launcher_env_owner(name: str, profile: str = "generic") -> str | None:
    """Who sets `name` in the trainer container, or None when the user may set it."""
    if name in LAUNCHER_ENV or name.startswith(LAUNCHER_ENV_PREFIXES):
        return "the launcher"
    if profile in PROFILES and name in PROFILES[profile].env and name not in USER_OVERRIDABLE:
        return f"network profile '{profile}'"
    return None


def is_secret_env(name: str) -> bool:
    """WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...: a name whose value is a credential."""
    return re.match(SECRET_ENV_NAME, name) is not None


def is_under(path: str, mount: str) -> bool:
    path = path.rstrip("/") or "/"
    return path == mount or path.startswith(mount + "/")

