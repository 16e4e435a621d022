"""The stage job: for model.source / data.source, and data.prepare: BeforeTraining, one pod that
copies them onto the shared volume and tokenizes the training data there; the gang depends on it
(JobSet dependsOn), so no GPU is held while weights download or a corpus is tokenized (Kubeflow
Trainer's "initializers"). Its container is also the evaluation pod's init container in mode
evaluate (evaluation_job.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rosetta_contract.exits import DATA_INVALID_EXIT
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError
from rosetta_operator.names import CONFIG_DIR, CONFIG_KEY, DISRUPTION_TARGET, STAGE_JOB, Names
from rosetta_operator.pod_builder import Container, PodParts, stage_pod
from rosetta_operator.pod_template import S3_SECRET_KEYS, output_mount

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


def stage_container(spec: TranslationTrainingSpec, names: Names, pod: PodParts) -> Container:
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
    return Container(name=STAGE_JOB, command=command, env=env + staging_credentials_env(spec) + pod.user_env,
                     resources=resources)


def prepare_resources(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """A gang pod's CPU and memory (tokenizing uses every core it gets), no accelerator; the stage
    default where the spec sets none."""
    requests = {"cpu": spec.resources.cpu or STAGE_RESOURCES["requests"]["cpu"],
                "memory": spec.resources.memory or STAGE_RESOURCES["requests"]["memory"]}
    return {"requests": requests, "limits": {"memory": spec.resources.memory or STAGE_RESOURCES["limits"]["memory"]}}


@dataclass(frozen=True)
class StageJob:
    """The stage replicated job's values; templates/jobset.yaml.j2 places it before the gang, which
    depends on it."""

    name: str
    pod: PodParts
    container: Container
    pod_failure_policy: dict[str, Any]


def stage_job(spec: TranslationTrainingSpec, names: Names) -> StageJob | None:
    """The replicated job that runs `rosetta stage` once before the gang; None without a source
    or data to prepare."""
    if not has_stage_job(spec):
        return None
    pod = stage_pod(spec, names)
    return StageJob(name=STAGE_JOB, pod=pod, container=stage_container(spec, names, pod),
                    pod_failure_policy={"rules": [
                        stage_refused_rule(),
                        {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]})
