"""TranslationTraining spec → ConfigMap + JobSet, as plain dicts. Pure: no I/O, no API calls.

Each small step below computes one part of the pod (names, env, volumes, resources,
command) from the spec; the jinja2 templates only place those values. This is the
only module that knows what our JobSet looks like.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional, cast

import jinja2
import yaml
from pydantic import BaseModel

from rosetta_contract.exits import DATA_INVALID_EXIT
from rosetta_contract.failures import CLASS_EXITS, FAIL, NODE_NAME_ENV
from rosetta_contract.pod_fields import DEFAULT_OUTPUT_MOUNT, TRAINER_HOME, TRAINER_UID, is_under
from rosetta_contract.profiles import EFA_RESOURCE, PROFILES
from rosetta_contract.resource import API_VERSION, KIND
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError, clip

REPLICATED_JOB = "node"
# model.source / data.source, and data.prepare: BeforeTraining: one pod that copies them onto the
# shared volume and tokenizes the training data there; the gang depends on it (JobSet dependsOn), so
# no GPU is held while weights download or a corpus is tokenized (Kubeflow Trainer's "initializers").
STAGE_JOB = "stage"
STAGE_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
CONFIG_DIR = "/etc/rosetta"
CONFIG_KEY = "training.yaml"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# Kueue's topology-aware scheduling reads these from each replicated job's pod template: that
# replicated job is one PodSet, and Kueue finds it one domain of the named level.
KUEUE_TOPOLOGY = {"Required": "kueue.x-k8s.io/podset-required-topology",
                  "Preferred": "kueue.x-k8s.io/podset-preferred-topology"}
TRAINING_LABEL = "rosetta.dev/training"
# The spec.suspend the user asked for that the operator last applied to the JobSet. Not the
# JobSet's own spec.suspend: Kueue flips that on admission and eviction, and a reconcile must
# not take Kueue's decision back (an operator restart re-suspended every admitted gang).
APPLIED_SUSPEND = "rosetta.dev/applied-suspend"
# The kubelet, the eviction API, the taint manager and preemption (the scheduler's or Kueue's)
# mark a pod they take away with this condition; the Job's pod failure policy then fails the Job
# with this reason, and the JobSet's rule of this name restarts the gang without counting it.
DISRUPTION_TARGET = "DisruptionTarget"
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
PREEMPTION_RULE = "preemption"
FAIL_FAST_RULE = "fail_fast"
NODE_HEALTH_GATE = "rosetta.dev/node-health"
TRAINER_CONTAINER = "trainer"
PREEMPTION_ACTION = "RestartJobSetAndIgnoreMaxRestarts"
BASE_LABELS = {"app.kubernetes.io/name": "rosetta", "app.kubernetes.io/managed-by": "rosetta-operator"}
# Stands for the random suffix the Job controller appends to each pod name: JobSet's admission
# webhook counts it when it checks that the longest pod name is a DNS-1035 label.
POD_NAME_SUFFIX = "-xxxxx"
# emptyDirs that stand in for the writable places a read-only root filesystem lacks; a local run
# (`rosetta run`) uses the machine's own instead.
SCRATCH_MOUNTS = ("/tmp", TRAINER_HOME)

# libyaml when present: the pure-Python parser made YAML most of a reconcile's CPU time.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Names:
    training: str
    jobset: str
    configmap: str
    replicated_job: str
    master_addr: str

    def pod_hostname(self, node_rank: int) -> str:
        return f"{self.jobset}-{self.replicated_job}-0-{node_rank}"


@dataclass(frozen=True)
class Rendered:
    names: Names
    configmap: dict[str, Any]
    jobset: dict[str, Any]

    def objects(self) -> list[dict[str, Any]]:
        """Creation order: the JobSet's pods mount the ConfigMap."""
        return [self.configmap, self.jobset]


# ------------------------------------------------------------------ small steps


def label_value(value: str) -> str:
    """A valid label value (≤63 chars, alphanumeric ends) derived from any string."""
    value = _LABEL_BAD.sub("-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def resource_names(name: str, nodes: int) -> Names:
    """Child names; ConfigError when a Kubernetes limit would reject them later."""
    jobset = name
    names = Names(
        training=name,
        jobset=jobset,
        configmap=f"{name}-config",
        replicated_job=REPLICATED_JOB,
        master_addr=f"{jobset}-{REPLICATED_JOB}-0-0.{jobset}",
    )
    errors = []
    if not _DNS1035.match(jobset):
        # The JobSet's headless Service is named after it: a DNS-1035 label.
        errors.append(("metadata.name", f"'{name}' must start with a letter and contain only a-z, 0-9 and '-'"))
    longest = names.pod_hostname(nodes - 1) + POD_NAME_SUFFIX
    if len(longest) > 63:
        allowed = len(name) - (len(longest) - 63)
        errors.append(("metadata.name", f"too long for {nodes} nodes: the pod name '{longest}' (xxxxx: the Job's "
                                        f"random suffix) would exceed 63 characters; use at most {allowed} characters"))
    if errors:
        raise ConfigError(errors)
    return names


def labels_for(name: str) -> dict[str, str]:
    return {**BASE_LABELS, TRAINING_LABEL: label_value(name)}


def owner_references(owner: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Accepts an ownerReference or the owning object itself (e.g. kopf's body)."""
    if not owner:
        return []
    meta = owner.get("metadata")
    if meta is not None:
        owner = {"apiVersion": owner.get("apiVersion", API_VERSION), "kind": owner.get("kind", KIND),
                 "name": meta["name"], "uid": meta["uid"]}
    return [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"],
             "uid": owner["uid"], "controller": True, "blockOwnerDeletion": True}]


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


def fail_fast_exit_codes(spec: TranslationTrainingSpec) -> list[int]:
    """The trainer's exit codes (failures.CLASS_EXITS, through rosetta_trainer.launch) whose class the
    spec fails at once (failurePolicy.actions)."""
    actions = spec.failure_policy.actions
    return sorted(code for cls, code in CLASS_EXITS.items() if actions.action(cls) == FAIL)


def scheduling_gates(spec: TranslationTrainingSpec) -> list[dict[str, str]]:
    """With the pre-flight check on, every gang pod waits for the operator, which adds node
    anti-affinity for the nodes that failed it (node_health.py) and then lifts the gate: a JobSet's
    pod template cannot change affinity between restarts, a gated pod's can."""
    return [{"name": NODE_HEALTH_GATE}] if spec.fault_tolerance.preflight.enabled else []


def pod_failure_policy(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """A pod the cluster took away fails its Job at once, with a reason the JobSet can tell apart;
    so does a trainer that exits with a class the spec fails at once, whose message (the Job
    controller's "Container trainer for pod ... failed with exit code N matching FailJob rule")
    the JobSet's fail-fast rule tells apart from a preemption."""
    rules: list[dict[str, Any]] = [{"action": "FailJob",
                                    "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]
    codes = fail_fast_exit_codes(spec)
    if codes:
        rules.append({"action": "FailJob",
                      "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In", "values": codes}})
    return {"rules": rules}


def fail_fast_rule(spec: TranslationTrainingSpec) -> Optional[dict[str, Any]]:
    """The JobSet rule that fails the training, instead of restarting it, when the gang's Job failed
    on one of fail_fast_exit_codes."""
    codes = fail_fast_exit_codes(spec)
    if not codes:
        return None
    pattern = (f"^Container {TRAINER_CONTAINER} for pod \\S+ failed with exit code "
               f"({'|'.join(map(str, codes))}) matching FailJob rule")
    return {"name": FAIL_FAST_RULE, "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
            "onJobFailureMessagePatterns": [pattern], "targetReplicatedJobs": [REPLICATED_JOB]}


# JobSet's webhook: a letter, then letters, digits, "_", "," or ":" (no "-").
STAGE_REFUSED_RULE = "stage_refused"


def failure_policy(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """Preemption restarts the gang without using up maxRestarts; any other failure falls through
    to the JobSet's default, RestartJobSet, which counts. With a stage job, its pod failure policy
    fails it for a source that is not there: that fails the JobSet at once (no rule sees it as a
    preemption, and a restart would only ask again)."""
    rules: list[dict[str, Any]] = [{"name": PREEMPTION_RULE, "action": PREEMPTION_ACTION,
                          "onJobFailureReasons": [POD_FAILURE_POLICY_REASON]}]
    if has_stage_job(spec):
        rules = [{"name": STAGE_REFUSED_RULE, "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
                  "targetReplicatedJobs": [STAGE_JOB]},
                 {**rules[0], "targetReplicatedJobs": [REPLICATED_JOB]}]
    fail_fast = fail_fast_rule(spec)
    if fail_fast is not None:
        rules.insert(0, fail_fast)  # first: the preemption rule matches the same reason
    return {"maxRestarts": spec.failure_policy.max_restarts, "rules": rules}


def output_mount(spec: TranslationTrainingSpec) -> str:
    vol = spec.volume_for("checkpoints")
    return vol.mount_path if vol else DEFAULT_OUTPUT_MOUNT


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


# The kubelet's grace between SIGTERM and SIGKILL when the pod does not set one.
DEFAULT_GRACE_PERIOD_SECONDS = 30


def grace_period_seconds(spec: TranslationTrainingSpec) -> int:
    grace = spec.termination_grace_period_seconds
    return DEFAULT_GRACE_PERIOD_SECONDS if grace is None else grace


def launcher_env(spec: TranslationTrainingSpec, names: Names) -> list[dict[str, Any]]:
    """Env the launcher command reads through $(VAR); every name is launcher-owned (spec.LAUNCHER_ENV*)."""
    values = {
        "ROSETTA_TRAINING": names.training,
        "ROSETTA_NNODES": str(spec.nodes),
        "ROSETTA_NPROC_PER_NODE": str(spec.procs),
        "ROSETTA_MASTER_ADDR": names.master_addr,
        "ROSETTA_MASTER_PORT": str(spec.network.master_port),
        "ROSETTA_CONFIG": f"{CONFIG_DIR}/{CONFIG_KEY}",
        "ROSETTA_OUTPUT": f"{output_mount(spec)}/{names.training}",
    }
    for purpose, var in (("data", "ROSETTA_DATA_DIR"), ("model", "ROSETTA_MODEL_DIR")):
        vol = spec.volume_for(purpose)
        if vol:
            values[var] = vol.mount_path
    # The trainer reports how much of the grace its stop checkpoint used; torchrun would
    # otherwise SIGKILL its workers 30 s after SIGTERM, whatever the pod's grace.
    values["ROSETTA_GRACE_PERIOD_S"] = values["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(grace_period_seconds(spec))
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    # Index of this pod in the Indexed Job = node rank.
    env.insert(3, {"name": "ROSETTA_NODE_RANK", "valueFrom": {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
    # The node a pod runs on: the pre-flight check names it when it fails (NodeUnhealthy).
    env.append({"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    # How often the JobSet restarted the gang; the trainer reports it (summary, rosetta_restarts).
    env.append({"name": "ROSETTA_RESTART_ATTEMPT", "valueFrom": {
        "fieldRef": {"fieldPath": f"metadata.annotations['{RESTART_ATTEMPT}']"}}})
    return env


def profile_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """The profile's env, less what the user sets of the names they may (profiles.USER_OVERRIDABLE)."""
    own = {var.name for var in spec.env}
    return [{"name": k, "value": v} for k, v in PROFILES[spec.network.profile].env.items() if k not in own]


def fault_tolerance_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """NCCL's side of spec.faultTolerance, with GPUs (NCCL) only; a name the user sets in spec.env is
    theirs. The trainer itself gives every process group collectiveTimeoutSeconds.

    On a timeout NCCL's watchdog aborts the communicators and the trainer's next call raises, which it
    exits with CollectiveTimeout (75) for (2: abort, do not tear the process down from the watchdog
    thread, where no exit status can be chosen). Should the abort itself hang, the heartbeat monitor
    takes the process down after the same timeout; should even that fail, the operator's stall
    timeout ends the attempt.
    """
    if not spec.gpus_per_node:
        return []
    values = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(spec.fault_tolerance.collective_timeout_seconds),
    }
    own = {var.name for var in spec.env}
    return [{"name": k, "value": v} for k, v in values.items() if k not in own]


def user_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    env = [var.model_dump(by_alias=True, exclude_none=True) for var in spec.env]
    cache = spec.volume_for("cache")
    if cache and not any(var.name == "HF_HOME" for var in spec.env):
        env.append({"name": "HF_HOME", "value": f"{cache.mount_path}/huggingface"})
    return env


# Keys the credentials Secret of spec.checkpoint.s3 must (or, the token, may) hold; the AWS SDKs read these names.
S3_SECRET_KEYS = (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False), ("AWS_SESSION_TOKEN", True))


def s3_credentials_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """The checkpoint mirror's credentials, only ever by reference to a Secret. Without
    credentialsSecret nothing is added: the pod uses the standard AWS chain (IRSA,
    EKS Pod Identity, instance profile)."""
    s3 = spec.checkpoint.s3
    if s3 is None or s3.credentials_secret is None:
        return []
    clashes = [(f"spec.env[{i}].name", f"{var.name} is set from checkpoint.s3.credentialsSecret "
                                      f"'{s3.credentials_secret}'; remove one of them")
               for i, var in enumerate(spec.env) if var.name in {key for key, _ in S3_SECRET_KEYS}]
    if clashes:
        raise ConfigError(clashes)
    env = []
    for key, optional in S3_SECRET_KEYS:
        ref: dict[str, Any] = {"name": s3.credentials_secret, "key": key}
        if optional:
            ref["optional"] = True
        env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def tracking_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """The experiment trackers' credentials, by reference to the Secrets spec.tracking names:
    the key itself never reaches the TranslationTraining, its ConfigMap or the JobSet."""
    refs = []
    if spec.tracking.wandb is not None and spec.tracking.wandb.api_key_secret is not None:
        refs.append(("WANDB_API_KEY", "wandb.apiKeySecret", spec.tracking.wandb.api_key_secret))
    if spec.tracking.mlflow is not None and spec.tracking.mlflow.token_secret is not None:
        refs.append(("MLFLOW_TRACKING_TOKEN", "mlflow.tokenSecret", spec.tracking.mlflow.token_secret))
    names = {name: field for name, field, _ in refs}
    clashes = [(f"spec.env[{i}].name", f"{var.name} is set from tracking.{names[var.name]}; remove one of them")
               for i, var in enumerate(spec.env) if var.name in names]
    if clashes:
        raise ConfigError(clashes)
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            for name, _, ref in refs]


def command(spec: TranslationTrainingSpec) -> list[str]:
    """Every value comes through $(VAR), expanded by the kubelet, so a local runner can reuse it.

    torchrun for both launchers. DeepSpeed initializes from torchrun's environment (RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR), so `launcher: deepspeed` needs no launcher of its own:
    DeepSpeed's runner wants a hostfile (or ssh) for more than one node, and as a container's PID 1
    it does not pass SIGTERM on to its workers, so a deleted pod would write no stop checkpoint.
    torchrun forwards SIGTERM to every worker and rendezvouses through the JobSet's rank-0 name.

    rosetta_trainer.launch runs torchrun: it keeps the node's log of this attempt on the output
    volume and exits with the failure class's code the trainer named (torchrun's own is 1 for every
    failure), which the pod failure policy matches (failures.py).
    """
    trainer = ["train", "-f", "$(ROSETTA_CONFIG)", "--output", "$(ROSETTA_OUTPUT)"]
    return ["python", "-m", "rosetta_trainer.launch", "torchrun", "--nnodes=$(ROSETTA_NNODES)", "--nproc-per-node=$(ROSETTA_NPROC_PER_NODE)",
            "--node-rank=$(ROSETTA_NODE_RANK)", "--master-addr=$(ROSETTA_MASTER_ADDR)",
            "--master-port=$(ROSETTA_MASTER_PORT)", "-m", "rosetta_trainer", *trainer]


def pod_security_context(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """Non-root always (spec.py refuses UID 0); the image's user unless podSecurity picks another."""
    sec = spec.pod_security
    uid = sec.run_as_user if sec.run_as_user is not None else TRAINER_UID
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": sec.run_as_group if sec.run_as_group is not None else uid,
        # A fresh block volume (EBS, PD) is root-owned; fsGroup makes it writable for the
        # checkpoints. OnRootMismatch: chown a big data volume once, not at every start.
        "fsGroup": sec.fs_group if sec.fs_group is not None else uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    # No profile adds a capability: IPC_LOCK (memlock for EFA's registered memory) would never
    # reach a non-root process's effective set, as Kubernetes sets no ambient capabilities; the
    # node's runtime must give an unlimited memlock limit instead (docs/operator.md, Security).
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def resources(spec: TranslationTrainingSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.resources.cpu:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        # Limit = request: a training pod that outgrows its memory should fail
        # loudly rather than be the first evicted under pressure.
        requests["memory"] = limits["memory"] = spec.resources.memory
    if spec.gpus_per_node:
        requests[spec.resources.gpu_resource] = limits[spec.resources.gpu_resource] = spec.gpus_per_node
    efa = spec.resources.efa if spec.resources.efa is not None else PROFILES[spec.network.profile].efa_devices
    if efa:
        requests[EFA_RESOURCE] = limits[EFA_RESOURCE] = efa
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def volumes(spec: TranslationTrainingSpec, names: Names) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): config, /dev/shm, the output fallback, then the user's."""
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.configmap}},
        # Docker's 64 MiB /dev/shm is too small for NCCL and dataloader workers.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    for name, path in zip(("tmp", "home"), SCRATCH_MOUNTS):
        vols.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    if spec.volume_for("checkpoints") is None:
        vols.append({"name": "output", "emptyDir": {}})
        mounts.append({"name": "output", "mountPath": DEFAULT_OUTPUT_MOUNT})
    for vol in spec.volumes:
        source = vol.model_dump(by_alias=True, exclude_none=True,
                                include={"persistent_volume_claim", "empty_dir", "host_path"})
        vols.append({"name": vol.name, **source})
        mount: dict[str, Any] = {"name": vol.name, "mountPath": vol.mount_path}
        if vol.read_only:
            mount["readOnly"] = True
        if vol.sub_path:
            mount["subPath"] = vol.sub_path
        mounts.append(mount)
    return vols, mounts


def scheduling(spec: TranslationTrainingSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(nodeSelector, tolerations): the profile's, then the user's (which win)."""
    selector = {**PROFILES[spec.network.profile].node_selector, **spec.scheduling.node_selector}
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.scheduling.tolerations]
    if spec.gpus_per_node and not any(t.get("key") == spec.resources.gpu_resource for t in tolerations):
        # GPU node pools are commonly tainted with the GPU resource name.
        tolerations.insert(0, {"key": spec.resources.gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    return selector, tolerations


def topology_annotations(spec: TranslationTrainingSpec) -> dict[str, str]:
    """The gang's Kueue topology request; the stage pod runs alone, before the gang, and asks none."""
    topology = spec.scheduling.topology
    return {KUEUE_TOPOLOGY[topology.mode]: topology.level} if topology is not None else {}


def _drop_unset_nones(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """Drop `key: null` where null is the field's default; a null that overrides a
    default (clipGradNorm: null disables clipping) must stay."""
    out: dict[str, Any] = {}
    for field_name, field in type(model).model_fields.items():
        key = field.alias or field_name
        value = getattr(model, field_name)
        if value is None and field.default is None:
            continue
        if isinstance(value, BaseModel):
            out[key] = _drop_unset_nones(value, dumped[key])
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            out[key] = [_drop_unset_nones(v, d) for v, d in zip(value, dumped[key])]
        else:
            out[key] = dumped[key]
    return out


def training_yaml(name: str, namespace: str, spec: TranslationTrainingSpec) -> str:
    """The whole resolved document, defaults included, so what runs does not depend
    on a later release's defaults; the trainer ignores the cluster keys."""
    resolved = _drop_unset_nones(spec, spec.model_dump(mode="json", by_alias=True))
    if spec.mode == "evaluate" and "training" not in spec.model_fields_set:
        del resolved["training"]  # placeholders, not a training the trainer would accept
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
           "spec": resolved}
    return str(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True))


# ------------------------------------------------------------------------ render


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
    )
    # tojson's default escapes characters beyond the BMP (an emoji) as a surrogate pair, which YAML
    # cannot read back; written as themselves they are plain UTF-8.
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
    return env


def _render_template(template: str, **context: Any) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.load(_env().get_template(template).render(**context), Loader=_Loader))


def render(name: str, namespace: str, spec: TranslationTrainingSpec, owner: Mapping[str, Any] | None = None) -> Rendered:
    """What the operator creates for TranslationTraining `namespace/name`."""
    names = resource_names(name, spec.nodes)
    outside = own_directory_problems(name, spec)
    if outside:
        raise ConfigError(outside)
    labels = labels_for(name)
    owners = owner_references(owner)
    configmap = _render_template(
        "configmap.yaml.j2", names=names, namespace=namespace, labels=labels, owner_references=owners,
        config_key=CONFIG_KEY, training_yaml=training_yaml(name, namespace, spec),
    )
    jobset_labels = dict(labels)
    if spec.scheduling.queue_name:
        jobset_labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
    annotations = {APPLIED_SUSPEND: suspend_value(spec.suspend)}
    if spec.scheduling.exclusive_topology:
        annotations[EXCLUSIVE_TOPOLOGY] = spec.scheduling.exclusive_topology
    pod_volumes, mounts = volumes(spec, names)
    node_selector, tolerations = scheduling(spec)
    metrics_port = spec.metrics.port
    jobset = _render_template(
        "jobset.yaml.j2", spec=spec, names=names, namespace=namespace, labels=labels,
        jobset_labels=jobset_labels, jobset_annotations=annotations, owner_references=owners,
        suspend=jobset_suspend(spec), failure_policy=failure_policy(spec), pod_failure_policy=pod_failure_policy(spec),
        pod_annotations={"kubectl.kubernetes.io/default-container": "trainer", **topology_annotations(spec)},
        image_pull_secrets=[{"name": s} for s in spec.image_pull_secrets],
        node_selector=node_selector, tolerations=tolerations, scheduling_gates=scheduling_gates(spec),
        security_context=pod_security_context(spec), container_security_context=container_security_context(),
        automount_token=spec.pod_security.automount_service_account_token,
        command=command(spec),
        env=launcher_env(spec, names) + profile_env(spec) + fault_tolerance_env(spec) + s3_credentials_env(spec)
        + tracking_env(spec)
        + user_env(spec),
        ports=[{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}] if metrics_port else [],
        resources=resources(spec), volume_mounts=mounts, volumes=pod_volumes,
    )
    stage = stage_job(spec, names, labels, pod_volumes, mounts)
    if stage is not None:
        gang = jobset["spec"]["replicatedJobs"][0]
        gang["dependsOn"] = [{"name": STAGE_JOB, "status": "Complete"}]
        if staging_sources(spec):
            gang["template"]["spec"]["template"]["spec"]["containers"][0]["env"] += offline_env(spec)
        jobset["spec"]["replicatedJobs"].insert(0, stage)  # dependsOn names an earlier entry
    check_sizes(spec, configmap, jobset)
    return Rendered(names=names, configmap=configmap, jobset=jobset)


# ----------------------------------------------------------------------- staging


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
