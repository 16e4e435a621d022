"""The cluster's pod-level fields of a TranslationTraining: resources, network, env, failure policy
and pod security. TranslationTrainingSpec (spec.py) puts them beside the trainer's fields, with the
volumes (volume_fields.py) and the scheduling (scheduling_fields.py).

The CRD schema is generated from these models too (crd.py): descriptions here are what
`kubectl explain` shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Self, cast

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rosetta_contract.failures import DEFAULT_ACTIONS, FailureClass
from rosetta_contract.kube_names import ENV_NAME, EXTENDED_RESOURCE, MAX_INT32, ObjectName
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import Model, matches
from rosetta_contract.trainer_pod import TRAINER_UID, is_secret_env


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
