"""The after-training evaluation Job (spec.afterTraining) and the pod of mode evaluate: `rosetta
evaluate` of a checkpoint or of the pretrained model, on the test sets, once the gang has finished.
Pure, like render.py; its pod parts are the gang's (pod_template.py) and the stage job's.
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
from rosetta_operator.pod_template import (
    container_security_context,
    output_mount,
    pod_security_context,
    resources,
    scheduling,
    user_env,
    volumes,
)
from rosetta_operator.stage_job import offline_env, stage_container, stage_refused_rule, staging_sources
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


def cpu_threads(cpu: str) -> int:
    """Whole cores of a CPU quantity (8, 7500m, 0.5), at least 1."""
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return max(1, int(cores))


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
        job = _render_evaluation_job(name, namespace, spec, owner, *_evaluate_mode_pod(spec))
        if spec.scheduling.queue_name:
            # The whole run, on GPUs: it waits for Kueue to admit it, as a training's JobSet does, so
            # that a policy's requireQueue holds for it too. Kueue reads the Job's own label.
            job["metadata"]["labels"][KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
            job["spec"]["suspend"] = True
        return job
    after = spec.evaluation.after_training
    if after is None:
        return None
    resources_ = {"requests": {"cpu": after.cpu, "memory": after.memory},
                  "limits": {"cpu": after.cpu, "memory": after.memory}}
    return _render_evaluation_job(name, namespace, spec, owner, resources_, cpu_threads(after.cpu),
                                  {EVALUATION_CHECKPOINT: after.checkpoint}, ({}, []))


def _evaluate_mode_pod(spec: TranslationTrainingSpec) -> tuple[dict[str, Any], int | None, dict[str, Any], tuple[dict[str, Any], list[Any]]]:
    """(resources, CPU threads, annotations, (node selector, tolerations)) of mode evaluate's pod."""
    threads = cpu_threads(spec.resources.cpu) if spec.resources.cpu else None
    # No EFA: one pod, no collectives across nodes.
    # Quantities as strings: BatchV1Api validates a Job's resources as such (a JobSet is a custom object).
    pod = {kind: {k: str(v) for k, v in values.items() if k != EFA_RESOURCE} for kind, values in resources(spec).items()}
    return {kind: values for kind, values in pod.items() if values}, threads, {EVALUATION_CHECKPOINT: "pretrained"}, scheduling(spec)


def _render_evaluation_job(name: str, namespace: str, spec: TranslationTrainingSpec, owner: Mapping[str, Any] | None,
                           pod_resources: dict[str, Any], threads: int | None, annotations: dict[str, Any],
                           placement: tuple[dict[str, Any], list[Any]]) -> dict[str, Any]:
    names = resource_names(name, spec.nodes)
    pod_volumes, mounts = volumes(spec, names)
    keep = {v["name"] for v in pod_volumes if v["name"] != "dshm"}  # no NCCL or dataloader workers here
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
    env += user_env(spec)
    volume_mounts = [m for m in mounts if m["name"] in keep]
    init_containers = []
    if spec.mode == "evaluate" and staging_sources(spec):
        # One pod, so no stage job of its own: the copy runs first, in the same pod.
        init_containers = [stage_container(spec, names, volume_mounts)]
        env += offline_env(spec)
    labels = {**BASE_LABELS, EVALUATION_LABEL: label_value(name)}
    return render_template(
        "evaluation-job.yaml.j2", spec=spec, job_name=evaluation_job_name(name), namespace=namespace,
        labels=labels, annotations=annotations, owner_references=owner_references(owner),
        pod_failure_policy={"rules": [*([stage_refused_rule()] if init_containers else []),
                                      {"action": "Ignore",
                                       "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]},
        automount_token=spec.pod_security.automount_service_account_token,
        image_pull_secrets=[{"name": s} for s in spec.image_pull_secrets],
        security_context=pod_security_context(spec), container_security_context=container_security_context(),
        command=evaluation_command(spec, output, config), env=env, resources=pod_resources,
        node_selector=placement[0], tolerations=placement[1], init_containers=init_containers,
        volume_mounts=volume_mounts, volumes=[v for v in pod_volumes if v["name"] in keep],
    )


# What the apiserver accepts (and etcd stores): annotations of one object 256 KiB in all, ConfigMap
# data 1 MiB, any object about 1.5 MiB. The JobSet carries the spec as JSON in an annotation (the
# handlers' applied-spec record), so it is counted there; the rest of its annotations are small.
