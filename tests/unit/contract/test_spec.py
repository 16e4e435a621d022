"""The operator's spec: cluster fields, their defaults, and errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from types import MappingProxyType

import pytest

from rosetta_contract.config import TrainerSpec
from rosetta_contract.profiles import PROFILES, USER_OVERRIDABLE
from rosetta_contract.spec import (
    CLUSTER_FIELDS,
    ConfigError,
    TranslationTrainingSpec,
    load_training,
    parse_spec,
    parse_training,
)
from rosetta_contract.trainer_pod import DEFAULT_IMAGE, launcher_env_owner

ROOT = Path(__file__).resolve().parents[3]

TRAINER = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}


def raw_spec(**cluster) -> dict:
    return {**copy.deepcopy(TRAINER), **cluster}


def document(**cluster) -> dict:
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": "mt"}, "spec": raw_spec(**cluster)}


def errors_of(allow_host_path: bool = False, **cluster) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_training(document(**cluster), allow_host_path=allow_host_path)
    return dict(info.value.errors)


GPU = {"gpusPerNode": 8}
# The checkpoints volume every pod of a training on more than one node shares.
SHARED = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", "persistentVolumeClaim": {"claimName": "efs"}}]


def test_cluster_fields_are_the_keys_the_trainer_ignores_and_only_additions():
    assert {"nodes", "gpusPerNode", "image", "volumes", "failurePolicy"} <= CLUSTER_FIELDS
    assert not CLUSTER_FIELDS & {f.alias for f in TrainerSpec.model_fields.values()}
    # no trainer field was redefined
    assert not set(TrainerSpec.model_fields) & {f for f in TranslationTrainingSpec.model_fields
                                                if f not in TrainerSpec.model_fields}


def test_defaults():
    spec = parse_training(document()).spec
    assert spec.image == DEFAULT_IMAGE
    assert (spec.nodes, spec.gpus_per_node, spec.procs_per_node, spec.procs, spec.world_size) == (1, 0, None, 1, 1)
    assert spec.launcher == "torchrun"
    assert (spec.network.profile, spec.network.master_port) == ("generic", 29500)
    assert spec.resources.shm_size == "16Gi" and spec.resources.gpu_resource == "nvidia.com/gpu"
    assert spec.resources.efa is None and spec.resources.cpu is None
    assert spec.suspend is False
    assert spec.failure_policy.max_restarts == 3
    assert spec.ttl_seconds_after_finished is None and spec.service_account_name is None
    assert spec.env == [] and spec.volumes == [] and spec.image_pull_secrets == []
    assert spec.scheduling.node_selector == {} and spec.scheduling.queue_name is None


@pytest.mark.parametrize("fields, procs, world", [
    ({"nodes": 2, "procsPerNode": 1}, 1, 2),
    ({"nodes": 3, "procsPerNode": 4}, 4, 12),
    ({"nodes": 2, "gpusPerNode": 8}, 8, 16),
    ({"nodes": 1, "gpusPerNode": 1}, 1, 1),
])
def test_processes_per_node_and_world_size(fields, procs, world):
    spec = parse_training(document(**fields, volumes=SHARED)).spec
    assert (spec.procs, spec.world_size) == (procs, world)


def test_quantities_accept_numbers_from_yaml():
    spec = parse_training(document(resources={"cpu": 8, "memory": "64Gi", "shmSize": "512Mi"})).spec
    assert (spec.resources.cpu, spec.resources.memory, spec.resources.shm_size) == ("8", "64Gi", "512Mi")


@pytest.mark.parametrize("fields, path, fragment", [
    ({"nodes": 0}, "spec.nodes", "greater than or equal to 1"),
    ({"nodes": "two"}, "spec.nodes", "expected an integer, not a string"),
    ({"gpusPerNode": 17}, "spec.gpusPerNode", "less than or equal to 16"),
    ({"gpusPerNode": 2, "procsPerNode": 2}, "spec.procsPerNode", "one process per GPU"),
    ({"launcher": "mpirun"}, "spec.launcher", "'torchrun' or 'deepspeed'"),
    ({"launcher": "deepspeed"}, "spec.launcher", "needs gpusPerNode >= 1"),
    ({"network": {"profile": "eks-p5"}}, "spec.network", "profile 'eks-p5' is for 1..8 GPUs per node, gpusPerNode is 0"),
    ({"gpusPerNode": 16, "network": {"profile": "gke-a3"}}, "spec.network", "1..8 GPUs per node, gpusPerNode is 16"),
    ({"network": {"profile": "azure"}}, "spec.network.profile", "'generic', 'eks-p4d', 'eks-p5' or 'gke-a3'"),
    ({"network": {"masterPort": 80}}, "spec.network.masterPort", "greater than or equal to 1024"),
    ({"resources": {"cpu": "lots"}}, "spec.resources.cpu", "'lots' is not a non-negative Kubernetes quantity"),
    ({"resources": {"shmSize": "1 GB"}}, "spec.resources.shmSize", "Kubernetes quantity"),
    ({"resources": {"efa": -1}}, "spec.resources.efa", "greater than or equal to 0"),
    ({"imagePullSecrets": ["Registry_Creds"]}, "spec.imagePullSecrets[0]", "valid object name"),
    ({"serviceAccountName": "Trainer"}, "spec.serviceAccountName", "should match pattern"),
    ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished", "greater than or equal to 0"),
    ({"failurePolicy": {"maxRestarts": -1}}, "spec.failurePolicy.maxRestarts", "greater than or equal to 0"),
    ({"suspend": "maybe"}, "spec.suspend", "expected true or false, not a string"),
    ({"nodez": 2}, "spec.nodez", "Extra inputs are not permitted"),
    ({"scheduling": {"queueName": "Team A"}}, "spec.scheduling.queueName", "should match pattern"),
    ({"scheduling": {"tolerations": [{"key": "spot", "operator": "Exists", "value": "true"}]}},
     "spec.scheduling.tolerations[0]", "'Exists' takes no 'value'"),
    ({"scheduling": {"tolerations": [{"key": "spot", "effect": "Sometimes"}]}},
     "spec.scheduling.tolerations[0].effect", "NoSchedule"),
    ({"nodes": 2, "scheduling": {"exclusiveTopology": "kubernetes.io/hostname"}}, "spec.scheduling",
     "would need all 2 pods on one node"),
    ({"scheduling": {"topology": {"level": "cloud.google.com/gce-topology-block"}}}, "spec.scheduling.topology",
     "set queueName to a LocalQueue whose ClusterQueue has a ResourceFlavor with a topologyName"),
    ({"scheduling": {"queueName": "q", "exclusiveTopology": "cloud.google.com/gke-nodepool",
                     "topology": {"level": "cloud.google.com/gce-topology-block"}}}, "spec.scheduling.topology",
     "set topology or exclusiveTopology, not both"),
    ({"scheduling": {"queueName": "q", "topology": {"level": "block rack"}}}, "spec.scheduling.topology.level",
     "a label key"),
    ({"scheduling": {"queueName": "q", "topology": {"level": "rack", "mode": "required"}}},
     "spec.scheduling.topology.mode", "'Required' or 'Preferred'"),
    ({"scheduling": {"queueName": "q", "topology": {"mode": "Preferred"}}}, "spec.scheduling.topology.level",
     "required"),
    ({"nodes": 2, "scheduling": {"queueName": "q", "topology": {"level": "kubernetes.io/hostname"}}},
     "spec.scheduling", "with mode Required would need all 2 pods on one node"),
    ({"training": {"maxSteps": 10, "device": "cuda"}}, "spec", "training.device is cuda but gpusPerNode is 0"),
    ({"gpusPerNode": 1, "training": {"maxSteps": 10, "device": "cpu"}}, "spec", "gpusPerNode asks for GPUs"),
    ({"env": [{"name": "1X=", "value": "v"}]}, "spec.env[0].name", "valid environment variable name"),
    ({"env": [{"name": "A", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
     "spec.env[0]", "either 'value' or 'valueFrom'"),
    ({"env": [{"name": "A", "valueFrom": {}}]}, "spec.env[0].valueFrom", "exactly one of 'secretKeyRef'"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env[1].name", "set twice"),
])
def test_errors_name_the_field(fields, path, fragment):
    errors = errors_of(**fields)
    assert path in errors, errors
    assert fragment in errors[path]


@pytest.mark.parametrize("name", ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK",
                                  "CUDA_VISIBLE_DEVICES", "ROSETTA_OUTPUT", "ROSETTA_ANYTHING", "PET_NNODES",
                                  "TORCHELASTIC_RUN_ID"])
def test_env_owned_by_the_launcher_is_refused(name):
    errors = errors_of(env=[{"name": "OK", "value": "1"}, {"name": name, "value": "x"}])
    assert errors == {"spec.env[1].name": f"{name} is set by the launcher; remove it"}


@pytest.mark.parametrize("profile, name", [("eks-p5", "FI_PROVIDER"), ("eks-p4d", "NCCL_SOCKET_IFNAME"),
                                           ("gke-a3", "NCCL_GPUDIRECTTCPX_CTRL_DEV"), ("gke-a3", "NCCL_ALGO")])
def test_env_owned_by_the_network_profile_is_refused(profile, name):
    errors = errors_of(env=[{"name": name, "value": "x"}], network={"profile": profile}, **GPU)
    assert errors == {"spec.env[0].name": f"{name} is set by network profile '{profile}'; remove it"}
    # the same variable is the user's to set on a fabric whose profile leaves it alone
    parse_training(document(env=[{"name": name, "value": "x"}], **GPU))


def test_every_profile_variable_but_the_diagnostics_is_owned():
    for profile in PROFILES.values():
        for name in set(profile.env) - USER_OVERRIDABLE:
            assert launcher_env_owner(name, profile.name) == f"network profile '{profile.name}'"
        for name in USER_OVERRIDABLE:
            assert launcher_env_owner(name, profile.name) is None
    assert launcher_env_owner("NCCL_DEBUG", "generic") is None
    assert launcher_env_owner("HF_TOKEN", "eks-p5") is None


def test_object_names_may_be_dotted_but_volume_names_may_not():
    spec = parse_training(document(imagePullSecrets=["registry.example.com"], volumes=[
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "efs.team-a"}}])).spec
    assert spec.image_pull_secrets == ["registry.example.com"]
    errors = errors_of(volumes=[{"name": "da.ta", "mountPath": "/data", "emptyDir": {}}])
    assert "DNS-1123 label" in errors["spec.volumes[0].name"]


def test_env_from_secrets_and_configmaps():
    spec = parse_training(document(env=[
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "WANDB_PROJECT", "valueFrom": {"configMapKeyRef": {"name": "wandb", "key": "project", "optional": True}}},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ])).spec
    assert spec.env[0].value_from.secret_key_ref.key == "token"
    assert spec.env[1].value_from.config_map_key_ref.optional is True


PVC = {"persistentVolumeClaim": {"claimName": "efs"}}


@pytest.mark.parametrize("volumes, path, fragment", [
    ([{"name": "a", "mountPath": "/a"}], "spec.volumes[0]", "exactly one of 'persistentVolumeClaim'"),
    ([{"name": "a", "mountPath": "/a", **PVC, "emptyDir": {}}], "spec.volumes[0]", "exactly one of"),
    ([{"name": "a", "mountPath": "/a", "hostPath": {"path": "/mnt/data"}}], "spec.volumes[0].hostPath",
     "hostPath volumes are not allowed"),
    ([{"name": "a", "mountPath": "relative", **PVC}], "spec.volumes[0].mountPath", "should match pattern"),
    ([{"name": "a", "mountPath": "/data/", **PVC}], "spec.volumes[0].mountPath", "should match pattern"),
    ([{"name": "Data", "mountPath": "/a", **PVC}], "spec.volumes[0].name", "DNS-1123 label"),
    ([{"name": "dshm", "mountPath": "/a", **PVC}], "spec.volumes[0].name", "reserved"),
    ([{"name": "a", "mountPath": "/dev/shm", **PVC}], "spec.volumes[0].mountPath", "mounted by the operator"),
    ([{"name": "a", "mountPath": "/etc/rosetta", **PVC}], "spec.volumes[0].mountPath", "mounted by the operator"),
    ([{"name": "a", "mountPath": "/checkpoints", **PVC}], "spec.volumes[0].mountPath", "purpose 'checkpoints'"),
    ([{"name": "a", "mountPath": "/x", **PVC}, {"name": "b", "mountPath": "/x", **PVC}],
     "spec.volumes[1].mountPath", "/x is already used"),
    ([{"name": "a", "mountPath": "/x", **PVC}, {"name": "a", "mountPath": "/y", **PVC}],
     "spec.volumes[1].name", "'a' is already used"),
    ([{"name": "a", "mountPath": "/x", "purpose": "data", **PVC}, {"name": "b", "mountPath": "/y", "purpose": "data", **PVC}],
     "spec.volumes[1].purpose", "only one volume may be for 'data' (volumes[0] is)"),
    ([{"name": "a", "mountPath": "/x", "purpose": "checkpoints", "readOnly": True, **PVC}],
     "spec.volumes[0]", "checkpoints volume must be writable"),
    ([{"name": "a", "mountPath": "/x", "purpose": "checkpoints",
       "persistentVolumeClaim": {"claimName": "efs", "readOnly": True}}], "spec.volumes[0]", "must be writable"),
    ([{"name": "a", "mountPath": "/x", "purpose": "logs", **PVC}], "spec.volumes[0].purpose", "'checkpoints'"),
])
def test_volume_errors_name_the_field(volumes, path, fragment):
    errors = errors_of(volumes=volumes)
    assert path in errors, errors
    assert fragment in errors[path]


def test_host_path_is_accepted_only_when_the_operator_allows_it():
    volumes = [{"name": "scratch", "mountPath": "/scratch", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}}]
    errors = errors_of(volumes=volumes)
    assert errors == {"spec.volumes[0].hostPath": "hostPath volumes are not allowed by this operator (it runs "
                                                  "without --allow-host-path); use a persistentVolumeClaim"}
    spec = parse_training(document(volumes=volumes), allow_host_path=True).spec
    assert spec.volumes[0].host_path.path == "/mnt/nvme"
    assert "spec.volumes[0].hostPath" in dict(_spec_errors(raw_spec(volumes=volumes)))
    parse_spec(raw_spec(volumes=volumes), allow_host_path=True)


def test_checkpoints_volume_may_sit_at_the_default_output_path():
    spec = parse_training(document(volumes=[{"name": "runs", "mountPath": "/checkpoints", "purpose": "checkpoints",
                                             **PVC}])).spec
    assert spec.volume_for("checkpoints").name == "runs"
    assert spec.volume_for("data") is None


def test_every_problem_is_listed_at_once():
    errors = errors_of(nodes=0, launcher="mpirun", env=[{"name": "RANK", "value": "0"}],
                       volumes=[{"name": "a", "mountPath": "/a", "hostPath": {"path": "/x"}},
                                {"name": "b", "mountPath": "/b"}],
                       resources={"memory": "a lot"})
    assert set(errors) == {"spec.nodes", "spec.launcher", "spec.env[0].name", "spec.volumes[0].hostPath",
                           "spec.volumes[1]", "spec.resources.memory"}


def _spec_errors(raw) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_spec(raw)
    return info.value.errors


def test_parse_spec_prefixes_paths_with_spec_and_takes_read_only_mappings():
    assert dict(_spec_errors(raw_spec(nodes=0))).keys() == {"spec.nodes"}
    # kopf hands handlers read-only Mapping views, not dicts
    frozen = MappingProxyType({**raw_spec(nodes=2, volumes=SHARED), "data": MappingProxyType(TRAINER["data"])})
    assert parse_spec(frozen).nodes == 2


def test_document_level_errors():
    with pytest.raises(ConfigError) as info:
        parse_training(["not", "a", "mapping"])
    assert info.value.errors[0][0] == "(document)"
    raw = document()
    raw["kind"] = "Job"
    raw["metadata"]["name"] = "Bad_Name"
    with pytest.raises(ConfigError) as info:
        parse_training(raw)
    assert {"kind", "metadata.name"} <= dict(info.value.errors).keys()


def test_status_and_server_fields_are_ignored():
    raw = document(nodes=2, volumes=SHARED)
    raw["status"] = {"phase": "Running"}
    raw["metadata"].update(uid="1234", resourceVersion="7", generation=3)
    assert parse_training(raw).spec.nodes == 2


def test_trainer_example_validates_as_a_translation_training():
    training = load_training(ROOT / "examples" / "quickstart.yaml")
    assert training.metadata.name == "quickstart"
    assert training.spec.nodes == 2 and training.spec.procs == 1 and training.spec.gpus_per_node == 0
    with_overrides = load_training(ROOT / "examples" / "quickstart.yaml", ["spec.nodes=4", "spec.procsPerNode=2"])
    assert with_overrides.spec.world_size == 8


# ------------------------------------------------------- checkpoints of a multi-node training

CLAIM = {"persistentVolumeClaim": {"claimName": "efs-runs"}}
NEEDS = "a training on 3 nodes needs its checkpoints on storage every pod shares"


@pytest.mark.parametrize("source, what", [
    ({"emptyDir": {}}, "is an emptyDir, which each pod gets its own of"),
    ({"hostPath": {"path": "/mnt/nvme"}}, "is a hostPath, a directory of whichever node each pod runs on"),
])
def test_a_multi_node_training_refuses_checkpoints_each_pod_or_node_keeps_for_itself(source, what):
    volumes = [{"name": "data", "mountPath": "/data", "purpose": "data", **CLAIM},
               {"name": "scratch", "mountPath": "/scratch", "purpose": "checkpoints", **source}]
    errors = errors_of(allow_host_path=True, nodes=3, volumes=volumes)
    assert errors == {"spec.volumes": f"{NEEDS}: volume 'scratch' (purpose: checkpoints) {what}; "
                                      "use a persistentVolumeClaim (ReadWriteMany: EFS, Filestore, NFS)"}
    # S3 mirroring does not make up for it: rank 0 uploads only what its own node sees
    s3 = {"checkpoint": {"s3": {"uri": "s3://bucket/runs"}}}
    assert errors_of(allow_host_path=True, nodes=3, volumes=volumes, **s3).keys() == {"spec.volumes"}
    # one node, or the checkpoints on the claim, are fine
    assert parse_training(document(nodes=1, volumes=volumes), allow_host_path=True)
    volumes[1].pop(next(iter(source)))
    volumes[1].update(CLAIM)
    assert parse_training(document(nodes=3, volumes=volumes)).spec.volume_for("checkpoints").name == "scratch"


def test_a_multi_node_training_without_a_checkpoints_volume_says_how_to_add_one():
    errors = errors_of(nodes=3, volumes=[{"name": "cache", "mountPath": "/cache", "purpose": "cache", **CLAIM}])
    assert list(errors) == ["spec.volumes"]
    assert errors["spec.volumes"].startswith(f"{NEEDS}, and no volume has purpose: checkpoints, so the run would "
                                             "write to an emptyDir at /checkpoints that each pod gets its own of; ")
    assert "persistentVolumeClaim: {claimName: NAME}" in errors["spec.volumes"]
    # the rule is checked with no volumes written at all, and reported with the other errors
    assert errors_of(nodes=3, image="").keys() == {"spec.image", "spec.volumes"}
    assert dict(_spec_errors(raw_spec(nodes=3))).keys() == {"spec.volumes"}


@pytest.mark.parametrize("directory, valid", [
    ("ckpt", True), ("/runs/mt/ckpt", True), ("/runs", True), ("/runs/", True),
    ("/scratch/ckpt", False), ("/runsx/ckpt", False), ("/elsewhere", False),
])
def test_a_multi_node_training_keeps_an_absolute_checkpoint_dir_on_a_claim(directory, valid):
    volumes = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", **CLAIM},
               {"name": "scratch", "mountPath": "/scratch", "emptyDir": {}}]
    raw = document(nodes=2, volumes=volumes, checkpoint={"dir": directory})
    if valid:
        assert parse_training(raw).spec.checkpoint.dir == directory
        return
    errors = errors_of(nodes=2, volumes=volumes, checkpoint={"dir": directory})
    assert errors == {"spec.checkpoint.dir": (
        f"a training on 2 nodes needs its checkpoints on storage every pod shares: {directory} is not on a "
        "persistentVolumeClaim volume; use a relative path (under the checkpoints volume) or one under such a "
        "volume's mountPath")}
    assert parse_training(document(nodes=1, volumes=volumes, checkpoint={"dir": directory}))
