"""The after-training evaluation Job (spec.afterTraining) and the pod of mode evaluate: `rosetta
evaluate` of a checkpoint or of the pretrained model, on the test sets, once the gang has finished.
Pure, like render.py; its pod's shared parts come from pod_builder.py, its init container is the stage job's.
"""

from __future__ import annotations

from typing import Any, Mapping

from rosetta_contract.profiles import EFA_RESOURCE
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.names import (
    BASE_LABELS,
    CONFIG_DIR,
    CONFIG_KEY,
    DISRUPTION_TARGET,
    KUEUE_QUEUE_LABEL,
    label_value,
    owner_references,
    resource_names,
)
from rosetta_operator.pod_builder import Container, evaluation_pod
from rosetta_operator.pod_template import cpu_threads, output_mount, resources
from rosetta_operator.stage_job import stage_container, stage_refused_rule, staging_sources
from rosetta_operator.templating import render_template

EVALUATION_LABEL = "rosetta.dev/evaluation"  # on the evaluation Job and its pod: the training's name
EVALUATION_CHECKPOINT = "rosetta.dev/checkpoint"  # the Job's annotation: afterTraining.checkpoint
EVALUATION_RESULTS = "evaluation"  # under the run's output: the scores and hypotheses


def evaluation_job_name(name: str) -> str:
    return f"{name}-eval"  # names are at most 48 characters (spec.MAX_NAME_LENGTH)


def checkpoint_root(spec: TranslationTrainingSpec, output: str) -> str:
    """Where the trainer writes its checkpoints, as the pods see it (`output`: the run's directory)."""
    directory = spec.checkpoint.dir or "checkpoints"
    return directory if directory.startswith("/") else f"{output}/{directory}"


def evaluation_command(spec: TranslationTrainingSpec, output: str, config: str) -> list[str]:
    """`rosetta evaluate` of the checkpoint afterTraining picks, on the test sets, on the CPU; in
    mode evaluate, of the pretrained model.name, on the pod's GPU when gpusPerNode asks for one."""
    if spec.mode == "evaluate":
        return ["python", "-m", "rosetta_trainer", "evaluate", "-f", config,
                "--device", "cuda" if spec.gpus_per_node else "cpu",
                "--split", "test", "--output", f"{output}/{EVALUATION_RESULTS}"]
    after = spec.evaluation.after_training
    if after is None:
        raise ValueError("evaluation_command: a training without evaluation.afterTraining has no evaluation Job")
    return ["python", "-m", "rosetta_trainer", "evaluate", "-f", config,
            "--checkpoint", checkpoint_root(spec, output), "--pick", after.checkpoint, "--device", "cpu",
            "--split", "test", "--output", f"{output}/{EVALUATION_RESULTS}"]


def required_evaluation_job(name: str, namespace: str, spec: TranslationTrainingSpec,
                            owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """render_evaluation_job for a caller that knows there is one (mode evaluate, or afterTraining set)."""
    job = render_evaluation_job(name, namespace, spec, owner)
    if job is None:
        raise ValueError(f"{name}: no evaluation Job without spec.evaluation.afterTraining")
    return job


def render_evaluation_job(name: str, namespace: str, spec: TranslationTrainingSpec,
                          owner: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The batch/v1 Job that evaluates a checkpoint once the training succeeded; None without
    spec.evaluation.afterTraining. The training pod's volumes, image and security context, no GPU,
    none of the gang's scheduling (its node selector and tolerations are for GPU nodes).
    In mode evaluate it is the whole run: the pretrained model on gpusPerNode GPUs (or the CPU),
    with the pod's resources and scheduling, queued like a JobSet when scheduling.queueName is set.
    The handlers build it only from a spec that the admin's policy allows (policy.py)."""
    if spec.mode == "evaluate":
        return _render_evaluation_job(name, namespace, spec, owner, *_evaluate_mode_pod(spec))
    after = spec.evaluation.after_training
    if after is None:
        return None
    resources_ = {"requests": {"cpu": after.cpu, "memory": after.memory},
                  "limits": {"cpu": after.cpu, "memory": after.memory}}
    return _render_evaluation_job(name, namespace, spec, owner, resources_, cpu_threads(after.cpu),
                                  {EVALUATION_CHECKPOINT: after.checkpoint})


def _evaluate_mode_pod(spec: TranslationTrainingSpec) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    """(resources, CPU threads, annotations) of mode evaluate's pod."""
    threads = cpu_threads(spec.resources.cpu) if spec.resources.cpu else None
    # No EFA: one pod, no collectives across nodes.
    # Quantities as strings: BatchV1Api validates a Job's resources as such (a JobSet is a custom object).
    pod = {kind: {k: str(v) for k, v in values.items() if k != EFA_RESOURCE} for kind, values in resources(spec).items()}
    return {kind: values for kind, values in pod.items() if values}, threads, {EVALUATION_CHECKPOINT: "pretrained"}


def _render_evaluation_job(name: str, namespace: str, spec: TranslationTrainingSpec, owner: Mapping[str, Any] | None,
                           pod_resources: dict[str, Any], threads: int | None,
                           annotations: dict[str, Any]) -> dict[str, Any]:
    names = resource_names(name, spec.nodes)
    pod = evaluation_pod(spec, names)
    output = f"{output_mount(spec)}/{names.training}"
    config = f"{CONFIG_DIR}/{CONFIG_KEY}"
    env = [{"name": "ROSETTA_TRAINING", "value": names.training}, {"name": "ROSETTA_CONFIG", "value": config},
           {"name": "ROSETTA_OUTPUT", "value": output}]
    if not spec.gpus_per_node or spec.mode != "evaluate":
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    if threads:  # torch would start a thread per core of the node, whatever the pod's CPU limit
        env.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    for purpose, var in (("data", "ROSETTA_DATA_DIR"), ("model", "ROSETTA_MODEL_DIR")):
        vol = spec.volume_for(purpose)
        if vol:
            env.append({"name": var, "value": vol.mount_path})
    env += pod.user_env
    init_containers = []
    if spec.mode == "evaluate" and staging_sources(spec):
        # One pod, so no stage job of its own: the copy runs first, in the same pod.
        init_containers = [stage_container(spec, names, pod)]
        env += pod.offline_env
    labels = {**BASE_LABELS, EVALUATION_LABEL: label_value(name)}
    # Mode evaluate is the whole run, on GPUs: it waits for Kueue to admit it, as a training's JobSet
    # does, so that a policy's requireQueue holds for it too. Kueue reads the Job's own label.
    queue = spec.scheduling.queue_name if spec.mode == "evaluate" else None
    return render_template(
        "evaluation-job.yaml.j2", job_name=evaluation_job_name(name), namespace=namespace,
        job_labels={**labels, KUEUE_QUEUE_LABEL: queue} if queue else labels, labels=labels,
        annotations=annotations, owner_references=owner_references(owner), suspend=bool(queue),
        pod_failure_policy={"rules": [*([stage_refused_rule()] if init_containers else []),
                                      {"action": "Ignore",
                                       "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]},
        pod=pod, init_containers=init_containers,
        evaluate=Container(name="evaluate", command=evaluation_command(spec, output, config), env=env,
                           resources=pod_resources),
    )
