"""spec → ConfigMap + JobSet: what each pod gets, and that the JobSet CRD accepts it."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from rosetta_contract.config import TrainerSpec
from rosetta_contract.documents import parse_document
from rosetta_contract.exits import (
    COLLECTIVE_TIMEOUT_EXIT,
    CONFIG_EXIT,
    DATA_INVALID_EXIT,
    NON_FINITE_EXIT,
    OOM_KILLED_EXIT,
)
from rosetta_contract.failures import CUDA_OUT_OF_MEMORY_EXIT
from rosetta_contract.profiles import EFA_RESOURCE, PROFILES
from rosetta_contract.spec import CLUSTER_FIELDS, ConfigError, parse_spec
from rosetta_operator.failure_policies import PREEMPTION_ACTION
from rosetta_operator.names import COMPLETION_INDEX, CONFIG_KEY, resource_names
from rosetta_operator.render import APPLIED_SUSPEND, render, suspend_patch
from support.openapi_check import assert_valid_jobset, jobset_schema, schema_errors

TRAINER = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
    "metrics": {"port": 9400},
}
PVC = {"persistentVolumeClaim": {"claimName": "efs"}}
# The checkpoints volume every pod of a training on more than one node shares.
SHARED = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", **PVC}]


def build(name: str = "mt", namespace: str = "team", owner: dict | None = None, allow_host_path: bool = False,
          **cluster):
    spec = parse_spec({**copy.deepcopy(TRAINER), **cluster}, allow_host_path=allow_host_path)
    return render(name, namespace, spec, owner)


def pod_spec(rendered) -> dict:
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]


def container(rendered) -> dict:
    (trainer,) = pod_spec(rendered)["containers"]
    return trainer


def env_of(rendered) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(rendered)["env"]}


def mounts_of(rendered) -> dict:
    return {m["mountPath"]: m for m in container(rendered)["volumeMounts"]}


def volumes_of(rendered) -> dict:
    return {v["name"]: v for v in pod_spec(rendered)["volumes"]}


# ------------------------------------------------------------------- ConfigMap


def test_configmap_holds_the_trainer_config():
    rendered = build(nodes=2, volumes=SHARED)
    cm = rendered.configmap
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    assert cm["metadata"]["name"] == "mt-config" and cm["metadata"]["namespace"] == "team"
    assert cm["metadata"]["labels"]["rosetta.dev/training"] == "mt"
    assert list(cm["data"]) == [CONFIG_KEY] == ["training.yaml"]
    assert volumes_of(rendered)["config"] == {"name": "config", "configMap": {"name": "mt-config"}}
    assert mounts_of(rendered)["/etc/rosetta"] == {"name": "config", "mountPath": "/etc/rosetta", "readOnly": True}
    assert env_of(rendered)["ROSETTA_CONFIG"] == "/etc/rosetta/training.yaml"


@pytest.mark.parametrize("trainer_patch", [
    {},
    {"training": {"maxSteps": 10, "clipGradNorm": None, "batch": {"sentences": 8}}},  # null overriding a default
    {"model": {"name": "google/flan-t5-small"}, "tokenizer": {},
     "data": {"sourceLang": "en", "targetLangs": ["de", "fr"], "taskPrefix": True,
              "train": [{"format": "pairs", "source": "/d/a.en", "target": "/d/a.fr", "targetLang": "fr"}]}},
])
def test_training_yaml_parses_back_into_the_same_trainer_spec(trainer_patch):
    raw = {**copy.deepcopy(TRAINER), **trainer_patch}
    cluster = {"nodes": 2, "gpusPerNode": 8, "network": {"profile": "eks-p5"}, "suspend": True,
               "env": [{"name": "A", "value": "1"}],
               "volumes": [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", **PVC}]}
    rendered = render("mt", "team", parse_spec({**raw, **cluster}))
    text = rendered.configmap["data"]["training.yaml"]
    document = parse_document(yaml.safe_load(text))  # the trainer's own loader
    assert document.metadata.name == "mt" and document.metadata.namespace == "team"
    assert document.spec == TrainerSpec.model_validate(raw)
    # cluster fields ride along (the trainer ignores exactly those) with their resolved values
    spec = yaml.safe_load(text)["spec"]
    assert CLUSTER_FIELDS <= set(spec) | {"procsPerNode", "imagePullPolicy", "ttlSecondsAfterFinished",
                                        "serviceAccountName", "terminationGracePeriodSeconds"}
    assert (spec["nodes"], spec["suspend"], spec["failurePolicy"]["maxRestarts"]) == (2, True, 3)
    assert spec["failurePolicy"]["actions"]["oomKilled"] == "Fail"


# ---------------------------------------------------------------------- JobSet


def test_one_replicated_job_of_indexed_pods():
    rendered = build(nodes=4, volumes=SHARED)
    js = rendered.jobset
    assert (js["apiVersion"], js["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert js["metadata"]["name"] == "mt" and js["metadata"]["namespace"] == "team"
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    (job,) = js["spec"]["replicatedJobs"]
    assert job["name"] == "node" and job["replicas"] == 1
    job_spec = job["template"]["spec"]
    assert job_spec["completionMode"] == "Indexed"
    assert job_spec["completions"] == job_spec["parallelism"] == 4
    assert job_spec["backoffLimit"] == 0
    pod = pod_spec(rendered)
    assert pod["restartPolicy"] == "Never" and pod["enableServiceLinks"] is False
    assert container(rendered)["name"] == "trainer"
    assert container(rendered)["image"] == "ghcr.io/rosetta-dev/rosetta-trainer:0.1.0"


def test_torchrun_environment():
    rendered = build(name="wmt", nodes=3, gpusPerNode=8, network={"masterPort": 29600}, volumes=SHARED)
    env = env_of(rendered)
    assert env["ROSETTA_NNODES"] == "3"
    assert env["ROSETTA_NPROC_PER_NODE"] == "8"
    assert env["ROSETTA_NODE_RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    assert COMPLETION_INDEX == "batch.kubernetes.io/job-completion-index"
    assert env["ROSETTA_RESTART_ATTEMPT"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}
    # <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain = jobset name>
    assert env["ROSETTA_MASTER_ADDR"] == "wmt-node-0-0.wmt"
    assert env["ROSETTA_MASTER_PORT"] == "29600"
    assert env["ROSETTA_TRAINING"] == "wmt"
    # The launcher runs torchrun: it keeps the node's log and exits with the trainer's failure class.
    launcher, torchrun = container(rendered)["command"][:4], container(rendered)["command"][4:]
    assert launcher == ["python", "-m", "rosetta_trainer.launch", "torchrun"]
    assert {"--nnodes=$(ROSETTA_NNODES)", "--nproc-per-node=$(ROSETTA_NPROC_PER_NODE)",
            "--node-rank=$(ROSETTA_NODE_RANK)", "--master-addr=$(ROSETTA_MASTER_ADDR)",
            "--master-port=$(ROSETTA_MASTER_PORT)"} <= set(torchrun)
    assert torchrun[torchrun.index("-m") + 1:] == ["rosetta_trainer", "train", "-f", "$(ROSETTA_CONFIG)",
                                                   "--output", "$(ROSETTA_OUTPUT)"]


@pytest.mark.parametrize("fields", [{}, {"gpusPerNode": 4, "launcher": "deepspeed"}])
def test_every_command_variable_is_defined_before_use(fields):
    rendered = build(**fields)
    names = [e["name"] for e in container(rendered)["env"]]
    used = {m for arg in container(rendered)["command"] for m in re.findall(r"\$\((\w+)\)", arg)}
    assert used <= set(names)
    assert len(names) == len(set(names))


def test_deepspeed_launcher_is_torchrun_on_every_node():
    """DeepSpeed's own runner needs a hostfile for more than one node and does not pass SIGTERM on
    as PID 1; DeepSpeed starts from torchrun's environment instead."""
    command = container(build(nodes=2, gpusPerNode=4, launcher="deepspeed", volumes=SHARED))["command"]
    assert command == container(build(nodes=2, gpusPerNode=4, volumes=SHARED))["command"]
    assert command[3] == "torchrun" and "--nnodes=$(ROSETTA_NNODES)" in command
    assert "--node-rank=$(ROSETTA_NODE_RANK)" in command


def test_cpu_training_runs_procs_per_node_and_asks_for_no_gpu():
    rendered = build(nodes=2, procsPerNode=3, resources={"cpu": 4, "memory": "8Gi"}, volumes=SHARED)
    assert env_of(rendered)["ROSETTA_NPROC_PER_NODE"] == "3"
    assert container(rendered)["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"},
                                                "limits": {"memory": "8Gi"}}
    assert "tolerations" not in pod_spec(rendered)


def test_shared_memory_is_a_memory_emptydir():
    rendered = build(resources={"shmSize": "32Gi"})
    assert volumes_of(rendered)["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
    assert mounts_of(rendered)["/dev/shm"] == {"name": "dshm", "mountPath": "/dev/shm"}


def test_gpu_and_efa_resources():
    rendered = build(gpusPerNode=8, network={"profile": "eks-p5"})
    res = container(rendered)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 8
    assert EFA_RESOURCE == "vpc.amazonaws.com/efa"
    assert res["requests"][EFA_RESOURCE] == res["limits"][EFA_RESOURCE] == 32
    assert container(build(gpusPerNode=8, network={"profile": "eks-p4d"}))["resources"]["limits"][EFA_RESOURCE] == 4
    assert container(build(gpusPerNode=8, network={"profile": "eks-p5"}, resources={"efa": 16})
                     )["resources"]["limits"][EFA_RESOURCE] == 16
    assert EFA_RESOURCE not in container(build(gpusPerNode=8))["resources"]["limits"]
    amd = container(build(gpusPerNode=2, resources={"gpuResource": "amd.com/gpu"}))["resources"]
    assert amd["limits"] == {"amd.com/gpu": 2}
    # GPU pools are usually tainted with the resource name
    assert pod_spec(build(gpusPerNode=1))["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize("profile", ["eks-p4d", "eks-p5", "gke-a3"])
def test_network_profile_env_and_node_selector(profile):
    rendered = build(gpusPerNode=8, network={"profile": profile}, env=[{"name": "MY_VAR", "value": "1"}])
    env = env_of(rendered)
    for name, value in PROFILES[profile].env.items():
        assert env[name] == value
    assert env["MY_VAR"] == "1"
    assert pod_spec(rendered)["nodeSelector"] == dict(PROFILES[profile].node_selector)


@pytest.mark.parametrize("profile", ["eks-p5", "gke-a3"])
def test_nccl_debug_is_the_trainings_to_raise(profile):
    # Diagnosing a hang needs NCCL_DEBUG=INFO on the fabric whose profile sets WARN; one value reaches the pod.
    rendered = build(gpusPerNode=8, network={"profile": profile},
                     env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"}])
    container = pod_spec(rendered)["containers"][0]
    assert [v["value"] for v in container["env"] if v["name"] == "NCCL_DEBUG"] == ["INFO"]
    assert env_of(rendered)["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


def test_efa_profiles_set_libfabric_and_nccl():
    env = env_of(build(gpusPerNode=8, network={"profile": "eks-p5"}))
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"], env["FI_EFA_FORK_SAFE"]) == ("efa", "1", "1")
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    gke = env_of(build(gpusPerNode=8, network={"profile": "gke-a3"}))
    assert gke["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4" and "FI_PROVIDER" not in gke
    generic = env_of(build(gpusPerNode=8))
    assert not [n for n in generic if n.startswith(("FI_", "NCCL_"))]


def test_user_env_comes_after_the_launchers_and_keeps_secret_refs():
    rendered = build(env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                          {"name": "WEIRD", "value": 'a"b\nc: {d}'}])
    env = container(rendered)["env"]
    assert env[-2] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    # quoting in the templates: user strings cannot change the YAML's structure
    assert env[-1] == {"name": "WEIRD", "value": 'a"b\nc: {d}'}


def test_checkpoint_data_model_and_cache_mounts():
    rendered = build(name="wmt", volumes=[
        {"name": "corpus", "mountPath": "/data", "purpose": "data", "readOnly": True,
         "persistentVolumeClaim": {"claimName": "efs-data", "readOnly": True}},
        {"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", "subPath": "team-a", **PVC},
        {"name": "weights", "mountPath": "/models", "purpose": "model", **PVC},
        {"name": "hf", "mountPath": "/cache", "purpose": "cache", "emptyDir": {"sizeLimit": "50Gi"}},
    ])
    env, mounts, vols = env_of(rendered), mounts_of(rendered), volumes_of(rendered)
    assert env["ROSETTA_OUTPUT"] == "/runs/wmt"
    assert env["ROSETTA_DATA_DIR"] == "/data" and env["ROSETTA_MODEL_DIR"] == "/models"
    assert env["HF_HOME"] == "/cache/huggingface" and env["ROSETTA_OPS_CACHE"] == "/cache/deepspeed-ops"
    assert mounts["/data"] == {"name": "corpus", "mountPath": "/data", "readOnly": True}
    assert mounts["/runs"] == {"name": "runs", "mountPath": "/runs", "subPath": "team-a"}
    assert vols["corpus"] == {"name": "corpus", "persistentVolumeClaim": {"claimName": "efs-data", "readOnly": True}}
    assert vols["hf"] == {"name": "hf", "emptyDir": {"sizeLimit": "50Gi"}}
    assert "output" not in vols  # the checkpoints volume replaces the scratch output


def test_without_a_checkpoints_volume_the_run_writes_to_scratch():
    rendered = build(name="demo")
    assert env_of(rendered)["ROSETTA_OUTPUT"] == "/checkpoints/demo"
    assert volumes_of(rendered)["output"] == {"name": "output", "emptyDir": {}}
    assert mounts_of(rendered)["/checkpoints"]["name"] == "output"
    assert not {"ROSETTA_DATA_DIR", "HF_HOME", "ROSETTA_OPS_CACHE"} & set(env_of(rendered))


def test_host_path_is_rendered_only_when_allowed():
    volumes = [{"name": "nvme", "mountPath": "/scratch", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}}]
    with pytest.raises(ConfigError) as info:
        build(volumes=volumes)
    assert [path for path, _ in info.value.errors] == ["spec.volumes[0].hostPath"]
    vols = volumes_of(build(volumes=volumes, allow_host_path=True))
    assert vols["nvme"] == {"name": "nvme", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}}


def test_metrics_port():
    assert container(build())["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert "ports" not in container(build(metrics={"port": 0}))


def test_scheduling_fields():
    rendered = build(gpusPerNode=8, network={"profile": "eks-p5"}, scheduling={
        "nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a",
                         "node.kubernetes.io/instance-type": "p5e.48xlarge"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "training-high",
        "queueName": "team-a",
        "exclusiveTopology": "cloud.google.com/gke-nodepool",
    })
    pod = pod_spec(rendered)
    # the user's selector wins over the profile's
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5e.48xlarge",
                                   "topology.kubernetes.io/zone": "us-east-1a"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]
    assert pod["affinity"] == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pod["priorityClassName"] == "training-high"
    meta = rendered.jobset["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert meta["annotations"] == {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool",
                                   APPLIED_SUSPEND: "false"}


@pytest.mark.parametrize("mode, annotation", [
    ({}, "kueue.x-k8s.io/podset-required-topology"),
    ({"mode": "Required"}, "kueue.x-k8s.io/podset-required-topology"),
    ({"mode": "Preferred"}, "kueue.x-k8s.io/podset-preferred-topology"),
], ids=["default", "required", "preferred"])
def test_topology_is_kueues_annotation_on_the_gangs_pod_template(mode, annotation):
    level = "topology.k8s.aws/network-node-layer-3"
    rendered = build(nodes=4, volumes=SHARED, scheduling={"queueName": "team-a", "topology": {"level": level, **mode}})
    (gang,) = rendered.jobset["spec"]["replicatedJobs"]
    # Kueue reads it from each replicated job's pod template (one PodSet each), nowhere else.
    assert gang["template"]["spec"]["template"]["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": "trainer", annotation: level}
    assert "annotations" not in gang["template"]["metadata"]
    assert rendered.jobset["metadata"]["annotations"] == {APPLIED_SUSPEND: "false"}
    assert rendered.jobset["spec"]["suspend"] is True  # Kueue admits it, and only then places it


def test_the_stage_pod_asks_for_no_topology():
    rendered = build(nodes=2, volumes=SHARED, data={**TRAINER["data"], "prepare": "BeforeTraining"},
                     scheduling={"queueName": "q", "topology": {"level": "cloud.google.com/gce-topology-block"}})
    stage, gang = rendered.jobset["spec"]["replicatedJobs"]
    assert stage["name"] == "stage"
    assert not any(k.startswith("kueue.x-k8s.io/")
                   for k in stage["template"]["spec"]["template"]["metadata"]["annotations"])
    assert gang["template"]["spec"]["template"]["metadata"]["annotations"][
        "kueue.x-k8s.io/podset-required-topology"] == "cloud.google.com/gce-topology-block"


def test_lifecycle_and_identity_fields():
    rendered = build(suspend=True, failurePolicy={"maxRestarts": 7}, ttlSecondsAfterFinished=600,
                     serviceAccountName="trainer", imagePullSecrets=["regcred", "mirror"],
                     image="registry.example.com/rosetta:1", imagePullPolicy="Always",
                     podSecurity={"runAsUser": 1000, "fsGroup": 1000}, terminationGracePeriodSeconds=120)
    spec = rendered.jobset["spec"]
    assert spec["suspend"] is True
    assert spec["failurePolicy"]["maxRestarts"] == 7
    assert spec["ttlSecondsAfterFinished"] == 600
    pod = pod_spec(rendered)
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                      "fsGroupChangePolicy": "OnRootMismatch",
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["terminationGracePeriodSeconds"] == 120
    assert (container(rendered)["image"], container(rendered)["imagePullPolicy"]) == (
        "registry.example.com/rosetta:1", "Always")


def test_unset_optional_fields_are_left_out():
    rendered = build()
    spec, pod = rendered.jobset["spec"], pod_spec(rendered)
    assert spec["suspend"] is False and spec["failurePolicy"]["maxRestarts"] == 3
    assert "ttlSecondsAfterFinished" not in spec
    for key in ("serviceAccountName", "imagePullSecrets", "nodeSelector", "affinity", "priorityClassName",
                "terminationGracePeriodSeconds"):
        assert key not in pod, key
    assert rendered.jobset["metadata"]["annotations"] == {APPLIED_SUSPEND: "false"}
    assert "kueue.x-k8s.io/queue-name" not in rendered.jobset["metadata"]["labels"]


@pytest.mark.parametrize("fields", [{}, {"gpusPerNode": 8, "network": {"profile": "eks-p5"},
                                          "training": {**TRAINER["training"], "device": "cuda"}}],
                         ids=["cpu", "eks-p5"])
def test_pods_never_share_the_nodes_namespaces_or_gain_privileges(fields):
    pod = pod_spec(build(**fields))
    assert not {"hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"} & set(pod)
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert "privileged" not in sc and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}


# ---------------------------------------------------------------- suspend and Kueue


@pytest.mark.parametrize("suspend, queue, jobset_suspend", [
    (False, None, False),
    (True, None, True),
    (False, "team-a", True),   # Kueue admits only what is created suspended
    (True, "team-a", True),
])
def test_a_queued_jobset_is_created_suspended(suspend, queue, jobset_suspend):
    scheduling = {"queueName": queue} if queue else {}
    rendered = build(suspend=suspend, scheduling=scheduling)
    assert rendered.jobset["spec"]["suspend"] is jobset_suspend
    # what the user asked for, not what Kueue needs
    assert rendered.jobset["metadata"]["annotations"][APPLIED_SUSPEND] == ("true" if suspend else "false")


def _created(suspend: bool | None, jobset_suspend: bool) -> dict:
    annotations = {} if suspend is None else {APPLIED_SUSPEND: "true" if suspend else "false"}
    return {"metadata": {"name": "mt", "annotations": annotations}, "spec": {"suspend": jobset_suspend}}


@pytest.mark.parametrize("applied, jobset_suspend, requested, patch", [
    # a resume after Kueue admitted the gang: the user's value is unchanged, so Kueue's stays
    (False, False, False, None),
    (False, True, False, None),        # still queued: nothing to do either
    (True, True, True, None),
    # the user's edits
    (False, False, True, {"metadata": {"annotations": {APPLIED_SUSPEND: "true"}}, "spec": {"suspend": True}}),
    (True, True, False, {"metadata": {"annotations": {APPLIED_SUSPEND: "false"}}, "spec": {"suspend": False}}),
    # an older operator's JobSet: the value is recorded, suspend is never touched
    (None, False, True, {"metadata": {"annotations": {APPLIED_SUSPEND: "true"}}}),
    (None, True, False, {"metadata": {"annotations": {APPLIED_SUSPEND: "false"}}}),
])
def test_suspend_is_patched_only_when_the_user_changes_it(applied, jobset_suspend, requested, patch):
    assert suspend_patch(_created(applied, jobset_suspend), requested) == patch


def test_a_resume_never_resuspends_an_admitted_gang():
    """The old rule (JobSet.spec.suspend := spec.suspend on every reconcile) re-suspended it."""
    rendered = build(suspend=True, scheduling={"queueName": "team-a"})
    admitted = copy.deepcopy(rendered.jobset)
    admitted["spec"]["suspend"] = False   # Kueue admitted it
    assert suspend_patch(admitted, True) is None
    legacy = copy.deepcopy(admitted)
    del legacy["metadata"]["annotations"][APPLIED_SUSPEND]
    assert "spec" not in suspend_patch(legacy, True)


# ---------------------------------------------------------------------- preemption


def test_preemption_restarts_the_gang_without_counting():
    rendered = build(failurePolicy={"maxRestarts": 5})
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    job_spec = job["template"]["spec"]
    assert job_spec["backoffLimit"] == 0 and pod_spec(rendered)["restartPolicy"] == "Never"
    # a pod the cluster took away fails its Job with reason PodFailurePolicy ...
    assert job_spec["podFailurePolicy"]["rules"][0] == \
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # ... which the JobSet restarts for free; any other reason falls through to RestartJobSet
    rules = rendered.jobset["spec"]["failurePolicy"]["rules"]
    assert rendered.jobset["spec"]["failurePolicy"]["maxRestarts"] == 5
    assert rules[-1] == {"name": "preemption", "action": PREEMPTION_ACTION, "onJobFailureReasons": ["PodFailurePolicy"]}


def test_the_classes_a_spec_fails_at_once_fail_the_jobset_and_the_rest_restart():
    rendered = build(failurePolicy={"actions": {"cudaOutOfMemory": "Restart", "collectiveTimeout": "Fail"}})
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    codes = {DATA_INVALID_EXIT, CONFIG_EXIT, NON_FINITE_EXIT, COLLECTIVE_TIMEOUT_EXIT, OOM_KILLED_EXIT}
    assert job["template"]["spec"]["podFailurePolicy"]["rules"][1] == {
        "action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": sorted(codes)}}
    fail_fast, preemption = rendered.jobset["spec"]["failurePolicy"]["rules"]
    assert fail_fast["action"] == "FailJobSet" and fail_fast["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert preemption["name"] == "preemption"
    (pattern,) = fail_fast["onJobFailureMessagePatterns"]
    # The Job controller's words for an exit-code rule (pkg/controller/job/pod_failure_policy.go) ...
    said = "Container trainer for pod team/mt-node-0-1-x7k2p failed with exit code {} matching FailJob rule at index 1"
    assert all(re.search(pattern, said.format(code)) for code in codes)
    assert not re.search(pattern, said.format(CUDA_OUT_OF_MEMORY_EXIT))  # Restart, as the spec says
    assert not re.search(pattern, said.format(1)) and not re.search(pattern, said.format(165))
    # ... and never those of a preemption, nor of the stage job's own refusal.
    assert not re.search(pattern, "Pod team/mt-node-0-1 has condition DisruptionTarget matching FailJob rule at index 0")
    assert not re.search(pattern, said.replace("trainer", "stage").format(DATA_INVALID_EXIT))


def test_a_spec_that_restarts_on_everything_renders_no_fail_fast_rule():
    actions = {k: "Restart" for k in ("dataInvalid", "configError", "nonFinite", "cudaOutOfMemory", "oomKilled",
                                      "imagePullFailed", "collectiveTimeout")}
    rendered = build(failurePolicy={"actions": actions})
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    assert len(job["template"]["spec"]["podFailurePolicy"]["rules"]) == 1
    assert [r["name"] for r in rendered.jobset["spec"]["failurePolicy"]["rules"]] == ["preemption"]


def test_failure_rule_names_pass_the_jobset_webhook():
    # jobset v0.12.0 pkg/webhooks/jobset_webhook.go: ruleNameFmt, 1-128 characters
    for rule in build().jobset["spec"]["failurePolicy"]["rules"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]) and len(rule["name"]) <= 128


def test_owner_reference_from_the_training_object():
    owner = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
             "metadata": {"name": "mt", "namespace": "team", "uid": "u-1"}}
    rendered = build(owner=owner)
    expected = [{"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "name": "mt", "uid": "u-1",
                 "controller": True, "blockOwnerDeletion": True}]
    assert rendered.configmap["metadata"]["ownerReferences"] == expected
    assert rendered.jobset["metadata"]["ownerReferences"] == expected
    assert "ownerReferences" not in build().jobset["metadata"]


def test_rendering_is_pure():
    spec = parse_spec({**copy.deepcopy(TRAINER), "nodes": 2, "env": [{"name": "A", "value": "1"}],
                       "volumes": SHARED})
    before = spec.model_dump()
    first, second = render("mt", "team", spec), render("mt", "team", spec)
    assert first == second and first.objects() == [first.configmap, first.jobset]
    assert spec.model_dump() == before


def test_names_must_fit_kubernetes_limits():
    with pytest.raises(ConfigError) as info:
        resource_names("9lives", 1)
    assert info.value.errors[0][0] == "metadata.name"
    with pytest.raises(ConfigError) as info:
        resource_names("a" * 49, 100)  # aaaa…-node-0-99-xxxxx (the pod name) is 65 characters
    assert "use at most 47 characters" in info.value.errors[0][1]
    assert len(resource_names("a" * 47, 100).pod_hostname(99) + "-xxxxx") == 63


# ------------------------------------------------------------- JobSet v0.12.0 CRD


VARIANTS = {
    "cpu": {"nodes": 2, "procsPerNode": 2, "resources": {"cpu": 2, "memory": "4Gi"}, "volumes": SHARED},
    "everything": {
        "nodes": 2, "gpusPerNode": 8, "network": {"profile": "eks-p5"}, "suspend": True,
        "failurePolicy": {"maxRestarts": 2}, "ttlSecondsAfterFinished": 60, "serviceAccountName": "sa",
        "imagePullSecrets": ["regcred"], "imagePullPolicy": "IfNotPresent", "terminationGracePeriodSeconds": 30,
        "podSecurity": {"runAsUser": 1, "runAsGroup": 2, "fsGroup": 3, "runAsNonRoot": True},
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t", "optional": True}}},
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
        "volumes": [{"name": "d", "mountPath": "/data", "purpose": "data", "readOnly": True, "subPath": "x",
                     "persistentVolumeClaim": {"claimName": "efs", "readOnly": True}},
                    {"name": "c", "mountPath": "/runs", "purpose": "checkpoints", **PVC},
                    {"name": "h", "mountPath": "/h", "hostPath": {"path": "/mnt", "type": "DirectoryOrCreate"}},
                    {"name": "m", "mountPath": "/m", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "scheduling": {"nodeSelector": {"a": "b"}, "priorityClassName": "high", "queueName": "q",
                       "exclusiveTopology": "cloud.google.com/gke-nodepool",
                       "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
                       "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                           "nodeSelectorTerms": [{"matchExpressions": [
                               {"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}},
    },
    "deepspeed": {"nodes": 3, "gpusPerNode": 4, "launcher": "deepspeed", "metrics": {"port": 0}, "volumes": SHARED},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_jobset_matches_the_jobset_crd(variant):
    owner = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "name": "mt", "uid": "u"}
    assert_valid_jobset(build(owner=owner, allow_host_path=True, **VARIANTS[variant]).jobset)


def test_the_jobset_check_catches_mistakes():
    jobset = build().jobset
    broken = copy.deepcopy(jobset)
    broken["spec"]["replicatedJobs"][0]["replicas"] = "one"
    broken["spec"]["network"]["enableDnsHostnames"] = True  # misspelt: would be pruned silently
    errors = schema_errors(jobset_schema(), broken, skip=("metadata",))
    assert any("replicas" in e for e in errors) and any("enableDnsHostnames" in e for e in errors)
