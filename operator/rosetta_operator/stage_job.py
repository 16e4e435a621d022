"""The stage job: for model.source / data.source, and data.prepare: BeforeTraining, one pod that
copies them onto the shared volume and tokenizes the training data there; the gang depends on it
(JobSet dependsOn), so no GPU is held while weights download or a corpus is tokenized (Kubeflow
Trainer's "initializers"). Its container is also the evaluation pod's init container in mode
evaluate (evaluation_job.py).
"""

from __future__ import annotations

from typing import Any

from rosetta_contract.exits import DATA_INVALID_EXIT
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError
from rosetta_operator.names import CONFIG_DIR, CONFIG_KEY, DISRUPTION_TARGET, STAGE_JOB, Names
from rosetta_operator.pod_template import (
    S3_SECRET_KEYS,
    container_security_context,
    output_mount,
    pod_security_context,
    scheduling,
    user_env,
)

STAGE_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}


def staging_sources(spec: TranslationTrainingSpec) -> list[Any]:
    return [source for _, source in spec.staging_sources()]


def prepares_before_training(spec: TranslationTrainingSpec) -> bool:
    return spec.mode == "train" and spec.data.prepare == "BeforeTraining"


def has_stage_job(spec: TranslationTrainingSpec) -> bool:
    return bool(staging_sources(spec)) or prepares_before_training(spec)


def stage_refused_rule() -> dict[str, Any]:
    """The pod failure policy rule that fails a Job at once when `rosetta stage` exits with the
    data-error code (a source that is not there): retrying would only ask again."""
    return {"action": "FailJob", "onExitCodes": {"containerName": STAGE_JOB, "operator": "In",
                                                 "values": [DATA_INVALID_EXIT]}}


def offline_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """The gang reads what the stage job copied: no pod asks the hub (which an offline cluster
    cannot reach, and which would otherwise be asked once per rank)."""
    own = {var.name for var in spec.env}
    return [{"name": k, "value": "1"} for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if k not in own]


def staging_credentials_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """The S3 credentials of model.source and data.source, by reference to their Secret (one: both
    reach the pod under the same AWS_* names)."""
    secrets = {s.credentials_secret for s in staging_sources(spec) if s.credentials_secret}
    if len(secrets) > 1:
        raise ConfigError([("spec.data.source.credentialsSecret",
                            f"differs from model.source's; the stage job reads both with one set of AWS "
                            f"credentials: use one Secret ({', '.join(sorted(secrets))})")])
    if not secrets:
        return []
    (secret,) = secrets
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, **({"optional": True} if optional else {})}}}
            for key, optional in S3_SECRET_KEYS]


def stage_container(spec: TranslationTrainingSpec, names: Names, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """`rosetta stage` in the trainer image: the stage job's container, and in mode evaluate the
    evaluation pod's init container. With data.prepare: BeforeTraining it then tokenizes the
    training data into the training's output, with the CPU and memory a gang pod would have."""
    env = [{"name": "ROSETTA_TRAINING", "value": names.training},
           {"name": "ROSETTA_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_KEY}"},
           {"name": "CUDA_VISIBLE_DEVICES", "value": ""}]
    command = ["python", "-m", "rosetta_trainer", "stage", "-f", "$(ROSETTA_CONFIG)"]
    resources = STAGE_RESOURCES
    if prepares_before_training(spec):
        env.append({"name": "ROSETTA_OUTPUT", "value": f"{output_mount(spec)}/{names.training}"})
        command += ["--prepare", "$(ROSETTA_OUTPUT)"]
        resources = prepare_resources(spec)
    container = {
        "name": STAGE_JOB, "image": spec.image,
        "command": command,
        "env": env + staging_credentials_env(spec) + user_env(spec), "resources": resources,
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


def prepare_resources(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """A gang pod's CPU and memory (tokenizing uses every core it gets), no accelerator; the stage
    default where the spec sets none."""
    requests = {"cpu": spec.resources.cpu or STAGE_RESOURCES["requests"]["cpu"],
                "memory": spec.resources.memory or STAGE_RESOURCES["requests"]["memory"]}
    return {"requests": requests, "limits": {"memory": spec.resources.memory or STAGE_RESOURCES["limits"]["memory"]}}


def stage_job(spec: TranslationTrainingSpec, names: Names, labels: dict[str, Any], pod_volumes: list[dict[str, Any]],
              mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The replicated job that runs `rosetta stage` once before the gang; None without a source
    or data to prepare."""
    if not has_stage_job(spec):
        return None
    keep = {v["name"] for v in pod_volumes if v["name"] != "dshm"}
    node_selector, tolerations = scheduling(spec)  # wherever the gang may run, the stage pod may too
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": spec.pod_security.automount_service_account_token,
        "securityContext": pod_security_context(spec),
        "containers": [stage_container(spec, names, [m for m in mounts if m["name"] in keep])],
        "volumes": [v for v in pod_volumes if v["name"] in keep],
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    if spec.scheduling.priority_class_name:
        pod["priorityClassName"] = spec.scheduling.priority_class_name
    return {"name": STAGE_JOB, "replicas": 1, "template": {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "completions": 1, "parallelism": 1,
            # A download that broke off is tried again in a new pod; a source that is not there
            # (rosetta stage's data-error exit) fails at once, and the operator reports it.
            "backoffLimit": 2,
            "podFailurePolicy": {"rules": [
                stage_refused_rule(),
                {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]},
            "template": {"metadata": {"labels": dict(labels),
                                      "annotations": {"kubectl.kubernetes.io/default-container": STAGE_JOB}},
                         "spec": pod},
        }}}
