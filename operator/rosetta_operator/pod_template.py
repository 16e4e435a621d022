"""The parts of a training's pods, each a small pure step over the spec: the gang pod's env
(launcher, profile, fault tolerance, credentials, tracking, the user's), command, resources and
placement, volumes and mounts, security contexts. pod_builder.py puts the shared ones together for
every pod of the training.
"""

from __future__ import annotations

from typing import Any

from rosetta_contract.failures import NODE_NAME_ENV
from rosetta_contract.profiles import EFA_RESOURCE, PROFILES
from rosetta_contract.quantities import quantity_value
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.strict_model import ConfigError
from rosetta_contract.trainer_pod import DEFAULT_OUTPUT_MOUNT, TRAINER_HOME, TRAINER_UID
from rosetta_operator.names import COMPLETION_INDEX, CONFIG_DIR, CONFIG_KEY, RESTART_ATTEMPT, Names

NODE_HEALTH_GATE = "rosetta.dev/node-health"
# Kueue's topology-aware scheduling reads these from each replicated job's pod template: that
# replicated job is one PodSet, and Kueue finds it one domain of the named level.
KUEUE_TOPOLOGY = {"Required": "kueue.x-k8s.io/podset-required-topology",
                  "Preferred": "kueue.x-k8s.io/podset-preferred-topology"}
# emptyDirs that stand in for the writable places a read-only root filesystem lacks; a local run
# (`rosetta run`) uses the machine's own instead.
SCRATCH_MOUNTS = ("/tmp", TRAINER_HOME)
# The kubelet's grace between SIGTERM and SIGKILL when the pod does not set one.
DEFAULT_GRACE_PERIOD_SECONDS = 30
# Keys the credentials Secret of spec.checkpoint.s3 must (or, the token, may) hold; the AWS SDKs read these names.
S3_SECRET_KEYS = (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False), ("AWS_SESSION_TOKEN", True))


def output_mount(spec: TranslationTrainingSpec) -> str:
    vol = spec.volume_for("checkpoints")
    return vol.mount_path if vol else DEFAULT_OUTPUT_MOUNT


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
    cache = spec.volume_for("cache")
    if cache:
        # DeepSpeed's CPU Adam is built there once per machine type, not at every start (ops_cache.py).
        values["ROSETTA_OPS_CACHE"] = f"{cache.mount_path}/deepspeed-ops"
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


def cpu_threads(cpu: str) -> int:
    """Whole cores of a CPU quantity (8, 7500m, 0.5, 4e0: any the spec admits), at least 1."""
    return max(1, int(quantity_value(cpu)))


def thread_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    """OMP_NUM_THREADS = the pod's requested whole cores per process, when it requests CPU.

    Without it torch starts a thread per core of the node (os.cpu_count() ignores the request), and
    torchrun sets 1 only for several processes per pod: a one-process pod on a node it shares spins
    more threads than it has cores, and OpenMP's barriers then wait on descheduled threads. Two
    quickstart pods on one 2-core node stepped 6.9 times slower than with a thread each, measured.
    With several processes and DeepSpeed's CPU Adam (ZeRO-Offload), each rank gets its share of the
    pod's cores instead of torchrun's one thread. A value in spec.env wins."""
    if not spec.resources.cpu or any(var.name == "OMP_NUM_THREADS" for var in spec.env):
        return []
    return [{"name": "OMP_NUM_THREADS", "value": str(max(1, cpu_threads(spec.resources.cpu) // spec.procs))}]


def user_env(spec: TranslationTrainingSpec) -> list[dict[str, Any]]:
    env = [var.model_dump(by_alias=True, exclude_none=True) for var in spec.env]
    cache = spec.volume_for("cache")
    if cache and not any(var.name == "HF_HOME" for var in spec.env):
        env.append({"name": "HF_HOME", "value": f"{cache.mount_path}/huggingface"})
    return env



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


def scheduling_gates(spec: TranslationTrainingSpec) -> list[dict[str, str]]:
    """With the pre-flight check on, every gang pod waits for the operator, which adds node
    anti-affinity for the nodes that failed it (node_health.py) and then lifts the gate: a JobSet's
    pod template cannot change affinity between restarts, a gated pod's can."""
    return [{"name": NODE_HEALTH_GATE}] if spec.fault_tolerance.preflight.enabled else []



def topology_annotations(spec: TranslationTrainingSpec) -> dict[str, str]:
    """The gang's Kueue topology request; the stage pod runs alone, before the gang, and asks none."""
    topology = spec.scheduling.topology
    return {KUEUE_TOPOLOGY[topology.mode]: topology.level} if topology is not None else {}
