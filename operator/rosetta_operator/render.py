"""TranslationTraining spec → ConfigMap + JobSet, as plain dicts. Pure: no I/O, no API calls.

render() puts together what the modules beside it compute from the spec: names.py (names, labels),
pod_builder.py (what every pod of the training shares: service account, security, placement,
volumes, the user's env), pod_template.py (the gang's env, resources, command), stage_job.py (the job
that stages sources before the gang), failure_policies.py (what a failure does). The jinja2 templates
(templating.py) only place those values, and what they render is returned as it is: nothing here
edits it afterwards. Only render() and templates/jobset.yaml.j2 know what our JobSet looks like.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any, Mapping

from rosetta_contract.saved_training import dump_training
from rosetta_contract.spec import TrainingMetadata, TranslationTraining, TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError, clip
from rosetta_contract.trainer_pod import is_under
from rosetta_operator.failure_policies import failure_policy, pod_failure_policy
from rosetta_operator.names import (
    CONFIG_KEY,
    KUEUE_QUEUE_LABEL,
    TRAINER_CONTAINER,
    Names,
    labels_for,
    owner_references,
    resource_names,
)
from rosetta_operator.pod_builder import Container, gang_pod
from rosetta_operator.pod_template import (
    command,
    fault_tolerance_env,
    launcher_env,
    output_mount,
    profile_env,
    resources,
    s3_credentials_env,
    thread_env,
    topology_annotations,
    tracking_env,
)
from rosetta_operator.stage_job import stage_job
from rosetta_operator.templating import render_template

EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# The spec.suspend the user asked for that the operator last applied to the JobSet. Not the
# JobSet's own spec.suspend: Kueue flips that on admission and eviction, and a reconcile must
# not take Kueue's decision back (an operator restart re-suspended every admitted gang).
APPLIED_SUSPEND = "rosetta.dev/applied-suspend"



@dataclass(frozen=True)
class Rendered:
    names: Names
    configmap: dict[str, Any]
    jobset: dict[str, Any]

    def objects(self) -> list[dict[str, Any]]:
        """Creation order: the JobSet's pods mount the ConfigMap."""
        return [self.configmap, self.jobset]


def jobset_suspend(spec: TranslationTrainingSpec) -> bool:
    """Kueue admits only what is created suspended, and unsuspends it when quota allows; under a
    queue, spec.suspend is the user's hold on top of that."""
    return spec.suspend or bool(spec.scheduling.queue_name)


def suspend_value(suspend: bool) -> str:
    return "true" if suspend else "false"


def suspend_patch(jobset: dict[str, Any], suspend: bool) -> dict[str, Any] | None:
    """The JobSet patch that applies the training's spec.suspend, or None.

    Only a change of the user's value since it was last applied (APPLIED_SUSPEND) touches the
    JobSet's spec.suspend. A JobSet without the annotation (an older operator's) gets the
    training's value recorded and keeps its suspend: without a record, a user's edit and Kueue's
    admission look alike, and a resume must never re-suspend a gang that Kueue admitted.
    """
    recorded = (jobset["metadata"].get("annotations") or {}).get(APPLIED_SUSPEND)
    if recorded == suspend_value(suspend):
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {APPLIED_SUSPEND: suspend_value(suspend)}}}
    if recorded is not None:
        patch["spec"] = {"suspend": suspend}
    return patch


def own_directory_problems(name: str, spec: TranslationTrainingSpec) -> list[tuple[str, str]]:
    """Where this training's checkpoints would leave its own directory, <output mount>/<name>.

    Trainings share a claim, each in the directory named after it; the newest checkpoint under
    checkpoint.dir is resumed from and the older ones are pruned. An absolute checkpoint.dir outside
    the training's directory, or a volume mounted inside it (another directory of a claim, maybe
    another training's, in place of what it holds), would resume from and prune another training's
    checkpoints. An emptyDir is the pod's own, so a dir on one is no other training's. A relative
    dir stays inside ('..' is refused with the spec). Only here, where the name is known:
    `rosetta train` on one machine writes wherever it is told.
    """
    root = f"{output_mount(spec)}/{name}"
    problems = []
    directory = spec.checkpoint.dir
    if directory is not None and directory.startswith("/"):
        path = posixpath.normpath(directory)
        # The innermost mount holds the path: an emptyDir at /scratch does not make /scratch/claim private.
        holder = max((v for v in spec.volumes if is_under(path, v.mount_path)),
                     key=lambda v: len(v.mount_path), default=None)
        if not is_under(path, root) and (holder is None or holder.empty_dir is None):
            problems.append(("spec.checkpoint.dir", f"an absolute checkpoint dir must be under this training's own "
                                                    f"directory {root}/ (the checkpoints volume's mountPath, then the "
                                                    f"training's name), which no other training writes, or on an "
                                                    f"emptyDir volume; {clip(directory, 200)} is neither. A relative "
                                                    "dir is resolved under the training's directory"))
    for i, volume in enumerate(spec.volumes):
        if is_under(volume.mount_path, root):
            problems.append((f"spec.volumes[{i}].mountPath", f"{volume.mount_path} is inside this training's own "
                                                             f"directory {root}, where its checkpoints are: a volume "
                                                             "mounted there would put another directory in their "
                                                             "place; mount it elsewhere"))
    return problems


def training_yaml(name: str, namespace: str, spec: TranslationTrainingSpec) -> str:
    """The ConfigMap's document, written as the pod's checkpoints write theirs (dump_training); the
    trainer ignores the cluster keys."""
    # Built, not validated: spec already was, and the name and namespace are the apiserver's.
    metadata = TrainingMetadata.model_construct(name=name, namespace=namespace)
    return dump_training(TranslationTraining.model_construct(api_version="rosetta.dev/v1alpha1",
                                                             kind="TranslationTraining", metadata=metadata, spec=spec))


def render(name: str, namespace: str, spec: TranslationTrainingSpec, owner: Mapping[str, Any] | None = None) -> Rendered:
    """What the operator creates for TranslationTraining `namespace/name`."""
    names = resource_names(name, spec.nodes)
    outside = own_directory_problems(name, spec)
    if outside:
        raise ConfigError(outside)
    labels = labels_for(name)
    owners = owner_references(owner)
    configmap = render_template(
        "configmap.yaml.j2", names=names, namespace=namespace, labels=labels, owner_references=owners,
        config_key=CONFIG_KEY, training_yaml=training_yaml(name, namespace, spec),
    )
    jobset_labels = dict(labels)
    if spec.scheduling.queue_name:
        jobset_labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
    annotations = {APPLIED_SUSPEND: suspend_value(spec.suspend)}
    if spec.scheduling.exclusive_topology:
        annotations[EXCLUSIVE_TOPOLOGY] = spec.scheduling.exclusive_topology
    gang = gang_pod(spec, names)
    metrics_port = spec.metrics.port
    trainer = Container(
        name=TRAINER_CONTAINER, command=command(spec),
        env=launcher_env(spec, names) + profile_env(spec) + fault_tolerance_env(spec) + s3_credentials_env(spec)
        + thread_env(spec) + tracking_env(spec) + gang.user_env + gang.offline_env,
        resources=resources(spec),
        ports=[{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}] if metrics_port else [],
    )
    jobset = render_template(
        "jobset.yaml.j2", spec=spec, names=names, namespace=namespace, labels=labels,
        jobset_labels=jobset_labels, jobset_annotations=annotations, owner_references=owners,
        suspend=jobset_suspend(spec), failure_policy=failure_policy(spec), pod_failure_policy=pod_failure_policy(spec),
        pod_annotations={"kubectl.kubernetes.io/default-container": TRAINER_CONTAINER, **topology_annotations(spec)},
        gang=gang, trainer=trainer, stage=stage_job(spec, names),
    )
    check_sizes(spec, configmap, jobset)
    return Rendered(names=names, configmap=configmap, jobset=jobset)


# What the apiserver accepts (and etcd stores): annotations of one object 256 KiB in all, ConfigMap
# data 1 MiB, any object about 1.5 MiB. The JobSet carries the spec as JSON in an annotation (the
# handlers' applied-spec record), so it is counted there; the rest of its annotations are small.
ANNOTATIONS_LIMIT = 256 * 1024 - 4096
CONFIGMAP_LIMIT = 1024 * 1024
OBJECT_LIMIT = 1536 * 1024 - 16 * 1024


def check_sizes(spec: TranslationTrainingSpec, configmap: dict[str, Any], jobset: dict[str, Any]) -> None:
    """Refuse, before any API call, a spec whose objects Kubernetes would refuse on every retry,
    naming the spec field that takes the most room."""
    dumped = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    spec_bytes = _json_size(dumped)
    problems = []
    if spec_bytes > ANNOTATIONS_LIMIT:
        problems.append(f"takes {_kib(spec_bytes)} as JSON; the JobSet keeps a copy in an annotation and Kubernetes "
                        f"allows {_kib(ANNOTATIONS_LIMIT)} of annotations per object")
    config_bytes = sum(len(v.encode()) for v in (configmap.get("data") or {}).values())
    if config_bytes > CONFIGMAP_LIMIT:
        problems.append(f"makes a trainer config of {_kib(config_bytes)}; a ConfigMap holds at most "
                        f"{_kib(CONFIGMAP_LIMIT)}")
    jobset_bytes = _json_size(jobset) + spec_bytes
    if jobset_bytes > OBJECT_LIMIT:
        problems.append(f"makes a JobSet of {_kib(jobset_bytes)}; the apiserver stores at most {_kib(OBJECT_LIMIT)} "
                        "per object")
    if problems:
        field, size = max(((k, _json_size(v)) for k, v in dumped.items()), key=lambda kv: kv[1])
        raise ConfigError([(f"spec.{field}", f"too large: {_kib(size)} of a spec that {p}") for p in problems])


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB"
