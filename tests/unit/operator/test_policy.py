"""The admin's policy (policy.py): each rule, the defaults, per-namespace rules, the policy file,
`rosetta validate/render --policy`, and the operator refusing what the policy forbids (against the
handlers' in-memory API), the after-training evaluation Job included."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import kopf
import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from rosetta_cli.main import main
from rosetta_contract.documents import read_yaml
from rosetta_contract.resource import Phase
from rosetta_contract.spec import parse_spec, parse_training
from rosetta_operator import handlers
from rosetta_operator.applied_spec import APPLIED_SPEC
from rosetta_operator.conditions import ConditionType, condition
from rosetta_operator.evaluation_job import render_evaluation_job
from rosetta_operator.names import KUEUE_QUEUE_LABEL
from rosetta_operator.policy import (
    Policy,
    PolicyError,
    PolicyViolation,
    load_policy,
    normalized_image,
    rules_for,
    violations,
)
from support.cel_cases import BASE, SHARED_CHECKPOINTS
from support.handler_api import (
    NAME,
    NS,
    SPEC,
    jobset_event,
    jobset_status,
    memo,
    reconcile,
    training,
)

ROOT = Path(__file__).resolve().parents[3]
GPU = {"gpusPerNode": 8, "training": {"maxSteps": 10, "device": "cuda"}}
HOST = {"name": "data", "mountPath": "/data", "purpose": "data", "hostPath": {"path": "/mnt/datasets/wmt"}}
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# What the defaults limit, lifted: a policy that allows whatever a spec may ask for.
UNLIMITED = {"maxNodes": None, "maxGpusPerTraining": None, "allowTolerateAll": True, "allowControlPlane": True}


def spec(**fields):
    return parse_spec({**copy.deepcopy(BASE), **fields}, allow_host_path=True)


def check(policy: dict, namespace: str = "default", **fields) -> list[tuple[str, str]]:
    return violations(spec(**fields), Policy.model_validate(policy, by_name=False), namespace)


def paths(problems: list[tuple[str, str]]) -> list[str]:
    return [path for path, _ in problems]


def node_affinity(*expressions: dict, preferred: bool = False) -> dict:
    term = {"matchExpressions": list(expressions)}
    if preferred:
        return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": term}]}}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


REQUIRED = "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
PREFERRED = "spec.scheduling.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference"


# ------------------------------------------------------------------------------- each rule


def test_an_unlimited_policy_allows_everything_a_spec_may_ask_for():
    assert check(UNLIMITED, image="evil.example/miner:1", serviceAccountName="admin",
                 podSecurity={"automountServiceAccountToken": True, "runAsGroup": 0, "fsGroup": 0},
                 scheduling={"priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}],
                             "nodeSelector": {CONTROL_PLANE: ""}},
                 resources={"gpuResource": "example.com/accelerator", "efa": 64, "shmSize": "1Ti"},
                 nodes=4096, volumes=[HOST] + SHARED_CHECKPOINTS, **GPU) == []


@pytest.mark.parametrize("image, allowed", [
    ("ghcr.io/rosetta-dev/rosetta-trainer:0.1.0", True),
    ("ghcr.io/rosetta-dev/rosetta-trainer@sha256:" + "a" * 64, True),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1", True),
    ("ghcr.io/rosetta-devil/trainer:1", False),        # a prefix ends at a component
    ("ghcr.io.evil.example/rosetta-dev/x:1", False),
    ("ubuntu:22.04", False),                          # docker.io/library/ubuntu
    ("evil.example/ghcr.io/rosetta-dev/x", False),
])
def test_images_come_from_allowed_registries(image, allowed):
    policy = {"allowedRegistries": ["ghcr.io/rosetta-dev/", "123456789012.dkr.ecr.us-east-1.amazonaws.com"]}
    problems = check(policy, image=image)
    assert paths(problems) == ([] if allowed else ["spec.image"])
    if problems:
        assert problems[0][1].endswith("is not from an allowed registry; allowed: ghcr.io/rosetta-dev/, "
                                       "123456789012.dkr.ecr.us-east-1.amazonaws.com (operator policy)")


def test_the_default_image_is_checked_too_and_said_to_be_the_default():
    (problem,) = check({"allowedRegistries": ["registry.internal/"]})
    assert problem == ("spec.image", "'ghcr.io/rosetta-dev/rosetta-trainer:0.1.0' (the default image) is not from an "
                                     "allowed registry; allowed: registry.internal/ (operator policy)")


@pytest.mark.parametrize("image, normalized", [
    ("ubuntu", "docker.io/library/ubuntu"),
    ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
    ("pytorch/pytorch:2.4", "docker.io/pytorch/pytorch:2.4"),
    ("docker.io/ubuntu", "docker.io/library/ubuntu"),
    ("index.docker.io/pytorch/pytorch", "docker.io/pytorch/pytorch"),
    ("localhost/trainer", "localhost/trainer"),
    ("registry:5000/trainer", "registry:5000/trainer"),
    ("ghcr.io/org/trainer:1", "ghcr.io/org/trainer:1"),
])
def test_images_are_read_as_docker_reads_them(image, normalized):
    assert normalized_image(image) == normalized
    allowed = check({"allowedRegistries": ["docker.io/library/"]}, image=image) == []
    assert allowed == normalized.startswith("docker.io/library/")


def test_service_accounts():
    policy = {"allowedServiceAccounts": ["default", "s3-reader"]}
    assert check(policy) == check(policy, serviceAccountName="s3-reader") == []
    assert check(policy, serviceAccountName="cluster-admin-sa") == [
        ("spec.serviceAccountName", "'cluster-admin-sa' is not allowed here; allowed: default, s3-reader "
                                    "(operator policy)")]


def test_without_a_service_account_the_pods_run_as_default_which_must_be_listed():
    assert check({"allowedServiceAccounts": ["s3-reader"]}) == [
        ("spec.serviceAccountName", "unset, so the pods would run as the namespace's 'default' ServiceAccount, "
                                    "which is not allowed here; allowed: s3-reader (operator policy)")]


def test_the_service_account_token():
    token = {"podSecurity": {"automountServiceAccountToken": True}}
    assert check({}, **token) == check({"allowServiceAccountToken": False}) == []
    assert paths(check({"allowServiceAccountToken": False}, **token)) == [
        "spec.podSecurity.automountServiceAccountToken"]


def test_priority_classes():
    policy = {"allowedPriorityClasses": ["batch-high", "batch-low"]}
    assert check(policy) == check(policy, scheduling={"priorityClassName": "batch-low"}) == []
    assert check(policy, scheduling={"priorityClassName": "system-node-critical"}) == [
        ("spec.scheduling.priorityClassName", "'system-node-critical' is not allowed here; allowed: batch-high, "
                                              "batch-low (operator policy)")]


def test_toleration_keys():
    policy = {"allowedTolerationKeys": ["nvidia.com/gpu", "spot"]}
    ok = [{"key": "spot", "operator": "Exists"}, {"key": "nvidia.com/gpu", "value": "present"}]
    assert check(policy, scheduling={"tolerations": ok}) == []
    problems = check(policy, scheduling={"tolerations": ok + [{"key": "dedicated", "operator": "Exists"}]})
    assert problems == [("spec.scheduling.tolerations[2].key", "'dedicated' is not allowed here; allowed: "
                                                               "nvidia.com/gpu, spot (operator policy)")]
    # The toleration the operator adds for the GPU taint is allowedGpuResources' to limit.
    assert check(policy, **GPU) == []


@pytest.mark.parametrize("policy", [{}, {"allowTolerateAll": False},
                                    {"allowTolerateAll": True, "allowedTolerationKeys": ["spot"]}])
def test_tolerating_every_taint(policy):
    (problem,) = check(policy, scheduling={"tolerations": [{"operator": "Exists"}]})
    assert problem[0] == "spec.scheduling.tolerations[0]"
    assert problem[1].startswith("an empty key with operator Exists tolerates every taint")
    assert check({"allowTolerateAll": True}, scheduling={"tolerations": [{"operator": "Exists"}]}) == []


def test_host_paths_under_allowed_prefixes():
    policy = {"allowedHostPaths": ["/mnt/datasets", "/scratch/"]}
    volume = lambda path, **more: [{**HOST, "hostPath": {"path": path}, **more}]  # noqa: E731
    for path in ("/mnt/datasets", "/mnt/datasets/wmt", "/scratch/x", "/mnt//datasets/wmt/"):
        assert check(policy, volumes=volume(path)) == [], path
    for path in ("/mnt/datasets-secret", "/mnt/datasets/../../etc", "/etc", "/"):
        (problem,) = check(policy, volumes=volume(path))
        assert problem[0] == "spec.volumes[0].hostPath.path", path
        assert problem[1].endswith("is not under an allowed node path; allowed: /mnt/datasets, /scratch/ "
                                   "(operator policy)")
    assert "(read as '/etc')" in check(policy, volumes=volume("/mnt/datasets/../../etc"))[0][1]


def test_listing_host_paths_allows_host_path_volumes():
    assert Policy().allows_host_path is False
    assert Policy(allowed_host_paths=["/mnt"]).allows_host_path is True
    assert Policy(allow_host_path=True).allows_host_path is True


def test_nodes_and_gpus():
    assert check({"maxNodes": 2}, nodes=2, volumes=SHARED_CHECKPOINTS) == []
    assert check({"maxNodes": 2}, nodes=3, volumes=SHARED_CHECKPOINTS) == [
        ("spec.nodes", "3 nodes; at most 2 per training here (operator policy)")]
    assert check({"maxGpusPerNode": 8}, **GPU) == []
    assert check({"maxGpusPerNode": 4}, **GPU) == [
        ("spec.gpusPerNode", "8 GPUs per node; at most 4 here (operator policy)")]
    assert check({"maxGpusPerTraining": 16}, nodes=2, volumes=SHARED_CHECKPOINTS, **GPU) == []
    assert check({"maxGpusPerTraining": 16}, nodes=3, volumes=SHARED_CHECKPOINTS, **GPU) == [
        ("spec.gpusPerNode", "3 nodes × 8 GPUs = 24 GPUs; at most 16 per training here (operator policy)")]
    assert check({"maxGpusPerNode": 0, "maxGpusPerTraining": 0}) == []  # a CPU-only cluster


def test_root_group():
    policy = {"allowRootGroup": False}
    assert check(policy, podSecurity={"runAsUser": 2000}) == []  # the group defaults to the UID
    assert paths(check(policy, podSecurity={"runAsGroup": 0, "fsGroup": 0})) == [
        "spec.podSecurity.runAsGroup", "spec.podSecurity.fsGroup"]
    assert check({}, podSecurity={"runAsGroup": 0}) == []


def test_every_rule_broken_is_reported_at_once():
    policy = {"allowedRegistries": ["ghcr.io/"], "allowedPriorityClasses": ["low"], "maxNodes": 1}
    assert paths(check(policy, image="evil.example/x", scheduling={"priorityClassName": "high"}, nodes=2,
                       volumes=SHARED_CHECKPOINTS)) == ["spec.image", "spec.scheduling.priorityClassName",
                                                        "spec.nodes"]


def test_control_plane_nodes_are_refused_by_default():
    cases = {
        "spec.scheduling.nodeSelector.node-role.kubernetes.io/control-plane": {"nodeSelector": {CONTROL_PLANE: ""}},
        "spec.scheduling.tolerations[0].key": {"tolerations": [{"key": CONTROL_PLANE, "operator": "Exists",
                                                                "effect": "NoSchedule"}]},
        f"{REQUIRED}.matchExpressions[0]": {"affinity": node_affinity({"key": CONTROL_PLANE, "operator": "Exists"})},
        f"{PREFERRED}.matchExpressions[0]": {"affinity": node_affinity(
            {"key": "node-role.kubernetes.io/master", "operator": "In", "values": ["true"]}, preferred=True)},
    }
    for path, scheduling in cases.items():
        (problem,) = check({}, scheduling=scheduling)
        assert problem[0] == path
        assert problem[1].endswith("control-plane nodes, which run the cluster itself and take no trainings here "
                                   "(allowControlPlane: false) (operator policy)"), problem
        assert check({"allowControlPlane": True}, scheduling=scheduling) == []


def test_keeping_off_the_control_plane_is_always_allowed():
    keep_off = node_affinity({"key": CONTROL_PLANE, "operator": "DoesNotExist"},
                             {"key": "node-role.kubernetes.io/master", "operator": "NotIn", "values": ["true"]})
    assert check({"allowedNodeSelectorKeys": [INSTANCE_TYPE]}, scheduling={"affinity": keep_off}) == []


def test_node_selector_keys():
    policy = {"allowedNodeSelectorKeys": ["team", INSTANCE_TYPE]}
    assert check(policy, scheduling={"nodeSelector": {"team": "mt"}}, network={"profile": "eks-p5"}, **GPU) == []
    assert check(policy, scheduling={"nodeSelector": {"zone": "a"}}) == [
        ("spec.scheduling.nodeSelector.zone", "selects nodes by 'zone', which is not allowed here; allowed keys: "
                                              f"team, {INSTANCE_TYPE} (operator policy)")]
    # The network profile's selector is where the pods go too.
    assert check({"allowedNodeSelectorKeys": ["team"]}, network={"profile": "gke-a3"}, **GPU) == [
        ("spec.network.profile", "gke-a3 selects nodes by 'cloud.google.com/gke-accelerator', which is not allowed "
                                 "here; allowed keys: team (operator policy)")]
    # Pod (anti-)affinity aims at pods: its topology key is not a node selector.
    spread = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}}]}}
    assert check(policy, scheduling={"affinity": spread}) == []


def test_node_affinity_terms_are_held_to_the_same_keys():
    policy = {"allowedNodeSelectorKeys": ["team"]}
    assert check(policy, scheduling={"affinity": node_affinity({"key": "team", "operator": "In", "values": ["mt"]})}) == []
    by_zone = node_affinity({"key": "team", "operator": "Exists"}, {"key": "zone", "operator": "NotIn", "values": ["a"]})
    assert check(policy, scheduling={"affinity": by_zone}) == [
        (f"{REQUIRED}.matchExpressions[1]", "selects nodes by 'zone', which is not allowed here; allowed keys: team "
                                            "(operator policy)")]
    by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]}]}}}
    assert paths(check(policy, scheduling={"affinity": by_name})) == [f"{REQUIRED}.matchFields[0]"]
    assert paths(check(policy, scheduling={"affinity": node_affinity({"key": "zone", "operator": "Exists"},
                                                                     preferred=True)})) == [
        f"{PREFERRED}.matchExpressions[0]"]


def test_node_selector_values():
    policy = {"allowedNodeSelectorValues": {INSTANCE_TYPE: ["p4d.24xlarge", "g5.12xlarge"]}}
    assert check(policy, scheduling={"nodeSelector": {INSTANCE_TYPE: "g5.12xlarge", "zone": "a"}}) == []
    assert check(policy, network={"profile": "eks-p4d"}, **GPU) == []
    assert check(policy, network={"profile": "eks-p5"}, **GPU) == [
        ("spec.network.profile", f"eks-p5 selects '{INSTANCE_TYPE}' = 'p5.48xlarge', which is not allowed here; "
                                 "allowed values: p4d.24xlarge, g5.12xlarge (operator policy)")]
    # The spec's own selector wins over the profile's, and is what is checked.
    assert paths(check(policy, scheduling={"nodeSelector": {INSTANCE_TYPE: "p5.48xlarge"}},
                       network={"profile": "eks-p4d"}, **GPU)) == [f"spec.scheduling.nodeSelector.{INSTANCE_TYPE}"]
    within = node_affinity({"key": INSTANCE_TYPE, "operator": "In", "values": ["p4d.24xlarge", "g5.12xlarge"]})
    assert check(policy, scheduling={"affinity": within}) == []
    for expression in ({"key": INSTANCE_TYPE, "operator": "In", "values": ["p4d.24xlarge", "p5.48xlarge"]},
                       {"key": INSTANCE_TYPE, "operator": "NotIn", "values": ["p5.48xlarge"]},
                       {"key": INSTANCE_TYPE, "operator": "Exists"}):
        (problem,) = check(policy, scheduling={"affinity": node_affinity(expression)})
        assert problem[0] == f"{REQUIRED}.matchExpressions[0]"
        assert "which is not allowed here; allowed values: p4d.24xlarge, g5.12xlarge" in problem[1]
    assert check(policy, scheduling={"affinity": node_affinity({"key": INSTANCE_TYPE, "operator": "NotIn",
                                                                "values": ["p5.48xlarge"]})})[0][1].startswith(
        f"selects '{INSTANCE_TYPE}' NotIn p5.48xlarge, which is not allowed here; allowed values: p4d.24xlarge, "
        "g5.12xlarge (operator In)")


def test_gpu_resources():
    policy = {"allowedGpuResources": ["nvidia.com/gpu"]}
    assert check(policy, **GPU) == []
    assert check(policy, resources={"gpuResource": "amd.com/gpu"}, **GPU) == [
        ("spec.resources.gpuResource", "'amd.com/gpu' is not allowed here; allowed: nvidia.com/gpu (operator policy)")]
    assert check({"allowedGpuResources": ["amd.com/gpu"]}, **GPU) == [
        ("spec.resources.gpuResource", "'nvidia.com/gpu' (the default) is not allowed here; allowed: amd.com/gpu "
                                       "(operator policy)")]
    assert check(policy, resources={"gpuResource": "amd.com/gpu"}) == []  # a CPU training requests none


def test_efa_devices():
    assert check({"maxEfaPerNode": 32}, network={"profile": "eks-p5"}, **GPU) == []
    assert check({"maxEfaPerNode": 4}, network={"profile": "eks-p5"}, **GPU) == [
        ("spec.network.profile", "eks-p5 asks for 32 EFA devices per pod; at most 4 here: set resources.efa or "
                                 "choose another profile (operator policy)")]
    assert check({"maxEfaPerNode": 4}, network={"profile": "eks-p5"}, resources={"efa": 4}, **GPU) == []
    assert check({"maxEfaPerNode": 0}, resources={"efa": 2}, **GPU) == [
        ("spec.resources.efa", "2 EFA devices per pod; at most 0 here (operator policy)")]
    assert check({"maxEfaPerNode": 0}, **GPU) == []  # the generic profile asks for none


def test_cpu_and_memory_per_pod():
    policy = {"maxCpuPerPod": 16, "maxMemoryPerPod": "64Gi"}
    assert check(policy, resources={"cpu": "15500m", "memory": "64Gi"}) == []
    assert check(policy, resources={"cpu": 17, "memory": "65Gi"}) == [
        ("spec.resources.cpu", "17 of CPU per pod; at most 16 here (operator policy)"),
        ("spec.resources.memory", "65Gi of memory per pod; at most 64Gi here (operator policy)")]
    # No memory is no limit at all; no CPU request reserves nothing (the pods get no CPU limit either way).
    assert check(policy) == [("spec.resources.memory", "unset, so the pods' memory would not be limited; set it: "
                                                       "at most 64Gi per pod here (operator policy)")]


def test_cpu_and_memory_per_training():
    policy = {"maxCpuPerTraining": 64, "maxMemoryPerTraining": "1Ti"}
    two = {"nodes": 2, "volumes": SHARED_CHECKPOINTS}
    assert check(policy, resources={"cpu": 32, "memory": "512Gi"}, **two) == []
    assert check(policy, resources={"cpu": 48, "memory": "600Gi"}, **two) == [
        ("spec.resources.cpu", "2 pods × 48 of CPU is more than the 64 a training may have here (operator policy)"),
        ("spec.resources.memory", "2 pods × 600Gi of memory is more than the 1Ti a training may have here "
                                  "(operator policy)")]


def test_the_after_training_evaluation_pod_is_a_pod_too():
    data = {**BASE["data"], "test": [{"format": "generated", "size": 10}]}
    policy = {"maxCpuPerPod": 4, "maxMemoryPerPod": "8Gi"}
    small = {"cpu": 4, "memory": "8Gi"}
    fields = {"resources": small, "data": data, "volumes": SHARED_CHECKPOINTS}
    assert check(policy, evaluation={"afterTraining": small}, **fields) == []
    assert check(policy, evaluation={"afterTraining": {"cpu": 6}}, **fields) == [
        ("spec.evaluation.afterTraining.cpu", "6 of CPU for the evaluation pod; at most 4 per pod here "
                                              "(operator policy)"),
        ("spec.evaluation.afterTraining.memory", "16Gi (the default) of memory for the evaluation pod; at most 8Gi "
                                                 "per pod here (operator policy)")]


def test_shared_memory():
    assert check({"maxShmSize": "16Gi"}) == []
    assert check({"maxShmSize": "8Gi"}) == [("spec.resources.shmSize", "16Gi (the default); at most 8Gi here "
                                                                       "(operator policy)")]
    assert check({"maxShmSize": "8Gi"}, resources={"shmSize": "8Gi"}) == []


def test_a_queue_may_be_required():
    assert check({"requireQueue": True}, scheduling={"queueName": "team-a"}) == []
    assert check({"requireQueue": True}) == [
        ("spec.scheduling.queueName", "unset; trainings here must wait for Kueue to admit them: name a LocalQueue "
                                      "of the namespace (operator policy)")]
    policy = {"requireQueue": True, "allowedQueues": ["gpu-batch", "gpu-interactive"]}
    assert check(policy)[0][1].endswith("name a LocalQueue of the namespace; allowed: gpu-batch, gpu-interactive "
                                        "(operator policy)")
    assert check(policy, scheduling={"queueName": "cpu"}) == [
        ("spec.scheduling.queueName", "'cpu' is not allowed here; allowed: gpu-batch, gpu-interactive "
                                      "(operator policy)")]
    assert check({"allowedQueues": ["gpu-batch"]}) == []  # a list alone does not require one


# ------------------------------------------------------------------------------ the defaults


def test_the_defaults_are_a_shared_clusters_limits(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_policy(tmp_path / "empty.yaml") == Policy()
    assert rules_for(None, "default") == Policy().for_namespace("default")
    many = {"nodes": 17, "volumes": SHARED_CHECKPOINTS}
    assert check({}, **many) == [("spec.nodes", "17 nodes; at most 16 per training here (operator policy)")]
    sixteen = {**GPU, "gpusPerNode": 16, "volumes": SHARED_CHECKPOINTS}
    assert check({}, nodes=9, **sixteen) == [
        ("spec.gpusPerNode", "9 nodes × 16 GPUs = 144 GPUs; at most 128 per training here (operator policy)")]
    assert check({}, nodes=8, **sixteen) == check({}, nodes=16, volumes=SHARED_CHECKPOINTS, **GPU) == []
    assert Policy().limits() == ["allowTolerateAll", "allowControlPlane", "maxNodes", "maxGpusPerTraining"]
    assert Policy.model_validate(UNLIMITED, by_name=False).limits() == []


def shipped_trainings() -> list[Path]:
    return sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "manifests" / "examples").glob("*.yaml")])


@pytest.mark.parametrize("path", shipped_trainings(), ids=lambda p: p.name)
def test_the_defaults_refuse_no_shipped_example(path):
    training = parse_training(read_yaml(path), str(path))
    assert violations(training.spec, None, training.metadata.namespace or "default") == []


# ----------------------------------------------------------------------------- namespaces


TEAMS = {"maxNodes": 2, "allowedRegistries": ["ghcr.io/rosetta-dev/"], "namespaces": {
    "research": {"maxNodes": None, "allowedRegistries": ["ghcr.io/rosetta-dev/", "ghcr.io/research/"]},
    "team-*": {"requireQueue": True},
    "team-?": {"maxNodes": 1},
    "team-a": {"allowedRegistries": []},
}}


def test_a_namespace_entry_replaces_the_fields_it_sets():
    policy = Policy.model_validate(TEAMS, by_name=False)
    research = policy.for_namespace("research")
    assert research.max_nodes is None  # null lifts the limit
    assert research.allowed_registries == ["ghcr.io/rosetta-dev/", "ghcr.io/research/"]  # a list replaces the list
    assert research.max_gpus_per_training == 128 and not research.require_queue  # the rest: cluster-wide
    other = policy.for_namespace("default")
    assert (other.max_nodes, other.allowed_registries, other.require_queue) == (2, ["ghcr.io/rosetta-dev/"], False)


def test_a_namespace_takes_its_exact_entry_else_the_first_matching_glob():
    policy = Policy.model_validate(TEAMS, by_name=False)
    exact = policy.for_namespace("team-a")  # not team-* nor team-?: one entry, never several
    assert exact.allowed_registries == [] and not exact.require_queue and exact.max_nodes == 2
    first = policy.for_namespace("team-b")
    assert first.require_queue and first.max_nodes == 2  # team-* comes before team-? in the file


def test_a_refusal_names_the_namespace_entry_it_came_from():
    forbidden = {"image": "docker.io/library/busybox:1", "nodes": 3, "volumes": SHARED_CHECKPOINTS}
    assert check(TEAMS, "research", image="ghcr.io/research/trainer:1", nodes=3, volumes=SHARED_CHECKPOINTS) == []
    assert check(TEAMS, "research", **forbidden) == [
        ("spec.image", "'docker.io/library/busybox:1' is not from an allowed registry; allowed: ghcr.io/rosetta-dev/, "
                       "ghcr.io/research/ (operator policy for namespace 'research')")]
    assert check(TEAMS, "team-b", **forbidden) == [
        ("spec.image", "'docker.io/library/busybox:1' is not from an allowed registry; allowed: ghcr.io/rosetta-dev/ "
                       "(operator policy for namespaces 'team-*')"),
        ("spec.scheduling.queueName", "unset; trainings here must wait for Kueue to admit them: name a LocalQueue "
                                      "of the namespace (operator policy for namespaces 'team-*')"),
        ("spec.nodes", "3 nodes; at most 2 per training here (operator policy for namespaces 'team-*')")]
    assert paths(check(TEAMS, "default", **forbidden)) == ["spec.image", "spec.nodes"]


def test_host_paths_per_namespace():
    policy = Policy.model_validate({"allowedHostPaths": ["/mnt/datasets"], "namespaces": {
        "sandbox": {"allowedHostPaths": []}, "data-team": {"allowedHostPaths": ["/mnt/datasets", "/scratch"]}}},
        by_name=False)
    assert rules_for(policy, "default").allows_host_path and not rules_for(policy, "sandbox").allows_host_path
    assert violations(spec(volumes=[HOST]), policy, "default") == []
    # An entry that allows none is the narrower word, even where --allow-host-path would allow them.
    assert violations(spec(volumes=[HOST]), policy, "sandbox") == [
        ("spec.volumes[0].hostPath", "hostPath volumes are not allowed here; use a persistentVolumeClaim "
                                     "(operator policy for namespace 'sandbox')")]
    scratch = [{**HOST, "hostPath": {"path": "/scratch/x"}}]
    assert violations(spec(volumes=scratch), policy, "data-team") == []
    assert paths(violations(spec(volumes=scratch), policy, "default")) == ["spec.volumes[0].hostPath.path"]
    only_one = Policy.model_validate({"namespaces": {"data-team": {"allowHostPath": True}}}, by_name=False)
    assert rules_for(only_one, "data-team").allows_host_path and not rules_for(only_one, "ml").allows_host_path


# ----------------------------------------------------------------------------- the file


def test_load_policy(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("allowedRegistries: [ghcr.io/rosetta-dev/]\nmaxNodes: 4\nallowRootGroup: false\n")
    policy = load_policy(path)
    assert policy.allowed_registries == ["ghcr.io/rosetta-dev/"] and policy.max_nodes == 4
    assert policy.limits() == ["allowedRegistries", "allowTolerateAll", "allowControlPlane", "maxNodes",
                               "maxGpusPerTraining", "allowRootGroup"]
    path.write_text("maxCpuPerPod: 96\nmaxMemoryPerPod: 1.5Ti\nnamespaces:\n  team-*: {maxNodes: null}\n")
    policy = load_policy(path)
    assert (policy.max_cpu_per_pod, policy.max_memory_per_pod) == ("96", "1.5Ti")
    assert policy.limits()[-1] == "namespaces" and policy.for_namespace("team-x").max_nodes is None


@pytest.mark.parametrize("text, error", [
    ("maxNodes: 0\n", "maxNodes: Input should be greater than or equal to 1"),
    ("max_nodes: 4\n", "max_nodes: Extra inputs are not permitted"),  # camelCase only, as in values.yaml
    ("allowedRegistry: [x]\n", "allowedRegistry: Extra inputs are not permitted"),
    ("maxNodes: true\n", "maxNodes:"),
    ("allowedHostPaths: [mnt]\n", "allowedHostPaths[0]: String should match pattern"),
    ("[ghcr.io/]\n", "expected a mapping of policy fields"),
    ("a: 1\na: 2\n", "duplicate key"),
    ("allowedRegistries: [\n", "line"),
    ("maxMemoryPerPod: lots\n", "maxMemoryPerPod: 'lots' is not a non-negative Kubernetes quantity"),
    ("allowedNodeSelectorValues: {zone: a}\n", "allowedNodeSelectorValues.zone: Input should be a valid list"),
    ("requireQueue: yes please\n", "requireQueue:"),
    ("namespaces: {ml: {namespaces: {}}}\n", "namespaces.ml.namespaces: Extra inputs are not permitted"),
    ("namespaces: {ML: {}}\n", "namespaces.ML.[key]: String should match pattern"),
    ("namespaces: {ml: {maxNode: 2}}\n", "namespaces.ml.maxNode: Extra inputs are not permitted"),
])
def test_a_bad_policy_file_is_one_line_naming_the_file(tmp_path, text, error):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    message = str(exc.value)
    assert message.startswith(f"policy {path}: ") and error in message and "\n" not in message


def test_a_missing_policy_file(tmp_path):
    with pytest.raises(PolicyError, match="no such file"):
        load_policy(tmp_path / "nope.yaml")


def test_policy_violation_names_the_policy():
    one = PolicyViolation([("spec.nodes", "3 nodes; at most 2")], "t.yaml", "p.yaml")
    assert str(one) == "TranslationTraining in t.yaml is not allowed by policy p.yaml: spec.nodes: 3 nodes; at most 2"
    two = PolicyViolation([("spec.nodes", "a"), ("spec.image", "b")])
    assert str(two).splitlines() == ["TranslationTraining is not allowed by the operator's policy (2 rules broken):",
                                     "  spec.nodes: a", "  spec.image: b"]
    default = PolicyViolation([("spec.nodes", "a")], "t.yaml", default=True)
    assert str(default) == "TranslationTraining in t.yaml is not allowed by the operator's default policy (no --policy): " \
                           "spec.nodes: a"


# ------------------------------------------------------------------ rosetta validate / render


def _files(tmp_path, policy: dict, namespace: str | None = None, **fields) -> tuple[str, str]:
    metadata = {"name": "mt", **({"namespace": namespace} if namespace else {})}
    doc = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": metadata,
           "spec": {**copy.deepcopy(BASE), **fields}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy))
    return str(tmp_path / "t.yaml"), str(tmp_path / "p.yaml")


@pytest.mark.parametrize("command", [["validate", "--skip-data"], ["render"]])
def test_validate_and_render_check_the_policy(tmp_path, capsys, command):
    training_file, policy_file = _files(tmp_path, {"allowedPriorityClasses": ["low"]},
                                        scheduling={"priorityClassName": "system-node-critical"})
    assert main([*command, "-f", training_file]) == 0
    capsys.readouterr()
    assert main([*command, "-f", training_file, "--policy", policy_file]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"error: TranslationTraining in {training_file} is not allowed by policy {policy_file}: "
                            "spec.scheduling.priorityClassName: 'system-node-critical' is not allowed here; "
                            "allowed: low (operator policy)\n")


def test_validate_with_a_bad_policy_file_is_one_line(tmp_path, capsys):
    training_file, policy_file = _files(tmp_path, {"maxNodes": "many"})
    assert main(["validate", "--skip-data", "-f", training_file, "--policy", policy_file]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: policy {policy_file}: maxNodes:") and err.count("\n") == 1


def test_the_operator_command_refuses_a_bad_policy_file_before_it_starts(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text("allowEverything: true\n")
    assert main(["operator", "--policy", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err == (f"error: policy {tmp_path / 'p.yaml'}: allowEverything: Extra inputs are "
                                       "not permitted\n")


def test_listed_host_paths_let_validate_accept_host_path_volumes(tmp_path, capsys):
    training_file, policy_file = _files(tmp_path, {"allowedHostPaths": ["/mnt/datasets"]}, volumes=[HOST])
    assert main(["validate", "--skip-data", "-f", training_file]) == 2   # hostPath is refused by default
    assert main(["validate", "--skip-data", "-f", training_file, "--policy", policy_file]) == 0


@pytest.mark.parametrize("command", [["validate", "--skip-data"], ["render"]])
def test_without_a_policy_file_validate_and_render_apply_the_defaults(tmp_path, capsys, command):
    training_file, _ = _files(tmp_path, {}, nodes=17, volumes=SHARED_CHECKPOINTS)
    assert main([*command, "-f", training_file]) == 2
    assert capsys.readouterr().err == (
        f"error: TranslationTraining in {training_file} is not allowed by the operator's default policy (no "
        "--policy): spec.nodes: 17 nodes; at most 16 per training here (operator policy)\n")


POLICY_OF_TEAMS = {"maxNodes": 1, "namespaces": {"research": {"maxNodes": 4}}}


@pytest.mark.parametrize("command", [["validate", "--skip-data"], ["render"]])
def test_validate_and_render_apply_the_namespaces_rules(tmp_path, capsys, command):
    two = {"nodes": 2, "volumes": SHARED_CHECKPOINTS}
    training_file, policy_file = _files(tmp_path, POLICY_OF_TEAMS, **two)
    assert main([*command, "-f", training_file, "--policy", policy_file]) == 2  # namespace default
    assert "at most 1 per training here (operator policy)" in capsys.readouterr().err
    assert main([*command, "-f", training_file, "--policy", policy_file, "-n", "research"]) == 0
    capsys.readouterr()
    # The document's own namespace, as `kubectl apply` would use it.
    training_file, policy_file = _files(tmp_path, POLICY_OF_TEAMS, namespace="research", **two)
    assert main([*command, "-f", training_file, "--policy", policy_file]) == 0
    assert main([*command, "-f", training_file, "--policy", policy_file, "-n", "ml"]) == 2
    assert "at most 1 per training here (operator policy)" in capsys.readouterr().err


def test_a_namespace_entry_lets_validate_accept_host_path_volumes_there_only(tmp_path, capsys):
    policy = {"namespaces": {"data-team": {"allowedHostPaths": ["/mnt/datasets"]}}}
    training_file, policy_file = _files(tmp_path, policy, volumes=[HOST])
    assert main(["validate", "--skip-data", "-f", training_file, "--policy", policy_file, "-n", "data-team"]) == 0
    capsys.readouterr()
    assert main(["validate", "--skip-data", "-f", training_file, "--policy", policy_file, "-n", "ml"]) == 2
    assert "hostPath volumes are not allowed by this operator" in capsys.readouterr().err


# ------------------------------------------------------------------------ the operator


def with_policy(fake, **policy) -> kopf.Memo:
    m = memo(fake)
    m.policy = Policy.model_validate(policy, by_name=False)
    return m


def test_the_operator_refuses_a_forbidden_training_and_creates_nothing(api, warnings):
    training(api, scheduling={"priorityClassName": "system-node-critical"})
    status = reconcile(api, with_policy(api, allowedPriorityClasses=["batch"]))["status"]
    message = ("spec.scheduling.priorityClassName: 'system-node-critical' is not allowed here; allowed: batch "
               "(operator policy)")
    assert status["phase"] == Phase.FAILED and status["message"] == message
    valid = condition(status, ConditionType.VALID)
    assert (valid["status"], valid["reason"], valid["message"]) == ("False", "ForbiddenByPolicy", message)
    assert condition(status, ConditionType.FAILED)["reason"] == "ForbiddenByPolicy"
    assert warnings == [{"name": NAME, "reason": "ForbiddenByPolicy", "message": message}]
    assert [c for c in api.calls if c[0] == "create"] == []


def test_an_allowed_training_gets_its_jobset(api, warnings):
    training(api, scheduling={"priorityClassName": "batch"})
    status = reconcile(api, with_policy(api, allowedPriorityClasses=["batch"], maxNodes=2))["status"]
    assert condition(status, ConditionType.VALID)["reason"] == "SpecValid"
    assert [c[1] for c in api.calls if c[0] == "create"] == ["configmaps", "jobsets"]
    assert warnings == []


def test_a_forbidden_change_leaves_the_running_jobset_alone(api, warnings):
    m = with_policy(api, maxNodes=2)
    training(api)
    reconcile(api, m)
    tt = api.get("translationtrainings", NAME)
    tt["spec"]["nodes"], tt["metadata"]["generation"] = 3, 2
    api.put("translationtrainings", tt)
    api.calls.clear()
    status = reconcile(api, m)["status"]
    assert [c for c in api.calls if c[1] == "jobsets" and c[0] != "get"] == []
    assert status["phase"] != Phase.FAILED
    assert condition(status, ConditionType.SPEC_APPLIED)["reason"] == "ForbiddenByPolicy"
    assert condition(status, ConditionType.VALID)["message"].startswith("spec.nodes: 3 nodes; at most 2")


def test_the_startup_hook_reads_the_policy_from_the_environment(tmp_path, monkeypatch):
    import kubernetes

    (tmp_path / "p.yaml").write_text("allowedHostPaths: [/mnt]\n")
    monkeypatch.setenv(handlers.POLICY_ENV, str(tmp_path / "p.yaml"))
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
    m = kopf.Memo()
    handlers.configure(settings=kopf.OperatorSettings(), memo=m, logger=logging.getLogger(__name__))
    m.api_client.close()
    assert m.policy.allowed_host_paths == ["/mnt"]
    assert m.allow_host_path is True   # listing host paths allows hostPath volumes under them


def test_without_a_policy_the_operator_applies_the_defaults(api, warnings):
    training(api, nodes=17)
    status = reconcile(api, memo(api))["status"]
    assert condition(status, ConditionType.VALID)["message"] == (
        "spec.nodes: 17 nodes; at most 16 per training here (operator policy)")
    assert [c for c in api.calls if c[0] == "create"] == []


def test_the_operator_applies_the_rules_of_the_trainings_namespace(api, warnings):
    training(api)  # two nodes, in namespace NS
    status = reconcile(api, with_policy(api, maxNodes=1, namespaces={"other": {"maxNodes": 2}}))["status"]
    assert condition(status, ConditionType.VALID)["reason"] == "ForbiddenByPolicy"
    api.calls.clear()
    status = reconcile(api, with_policy(api, maxNodes=1, namespaces={NS: {"maxNodes": 2}}))["status"]
    assert condition(status, ConditionType.VALID)["reason"] == "SpecValid"
    assert [c[1] for c in api.calls if c[0] == "create"] == ["configmaps", "jobsets"]


def test_a_namespace_entry_that_allows_host_paths_lets_the_operator_read_them(api, warnings):
    training(api, volumes=[HOST, *SHARED_CHECKPOINTS])
    status = reconcile(api, memo(api))["status"]
    assert "hostPath volumes are not allowed by this operator" in status["message"]
    status = reconcile(api, with_policy(api, namespaces={NS: {"allowedHostPaths": ["/mnt/datasets"]}}))["status"]
    assert condition(status, ConditionType.VALID)["reason"] == "SpecValid"


# ---------------------------------------------------- the after-training evaluation Job, judged again

AFTER = {"afterTraining": {"checkpoint": "best", "cpu": 6, "memory": "12Gi"}}
DATA = {**SPEC["data"], "test": [{"format": "generated", "size": 10, "seed": 3}]}


@pytest.fixture
def jobs(api, monkeypatch):
    """Jobs created on the in-memory API, by name."""
    created: dict[str, dict] = {}

    def create_namespaced_job(namespace, body):
        if body["metadata"]["name"] in created:
            raise ApiException(status=409, reason="AlreadyExists")
        created[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    api.create_namespaced_job = create_namespaced_job
    monkeypatch.setattr(kubernetes.client, "BatchV1Api", lambda _client=None: api)
    return created


def succeed(api, m, applied_spec: dict | None = None) -> dict:
    """The JobSet succeeds (its record of the spec rewritten to `applied_spec`, if given)."""
    if applied_spec is not None:
        jobset = api.get("jobsets", NAME)
        jobset["metadata"]["annotations"][APPLIED_SPEC] = json.dumps(applied_spec)
        api.put("jobsets", jobset)
    jobset = jobset_status(api, status={"conditions": [{"type": "Completed", "status": "True"}]})
    return jobset_event(api, m, jobset)["status"]


def test_a_policy_made_stricter_since_the_training_started_refuses_its_evaluation_job(api, warnings, jobs):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    m.policy = Policy(max_cpu_per_pod="4")
    status = succeed(api, m)
    message = "spec.evaluation.afterTraining.cpu: 6 of CPU for the evaluation pod; at most 4 per pod here (operator policy)"
    assert jobs == {}
    assert status["evaluation"] == {"phase": "Failed", "jobName": "mt-eval", "checkpoint": "best", "message": message}
    evaluated = condition(status, "Evaluated")
    assert (evaluated["status"], evaluated["reason"], evaluated["message"]) == ("False", "ForbiddenByPolicy", message)
    assert warnings == [{"name": NAME, "reason": "ForbiddenByPolicy", "message": f"no evaluation Job mt-eval: {message}"}]
    assert status["phase"] == "Succeeded"  # the training itself did


def test_a_rewritten_record_on_the_jobset_does_not_reach_the_evaluation_job(api, warnings, jobs):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    # Whoever may patch the JobSet writes a node's root into the spec the evaluation is built from.
    rewritten = {**SPEC, "evaluation": AFTER, "data": DATA,
                 "volumes": [*SHARED_CHECKPOINTS, {**HOST, "hostPath": {"path": "/"}}]}
    status = succeed(api, m, rewritten)
    assert jobs == {}
    evaluated = condition(status, "Evaluated")
    assert evaluated["reason"] == "InvalidSpec" and "hostPath volumes are not allowed" in evaluated["message"]


def test_the_evaluation_job_is_judged_with_the_operators_default_image(api, warnings, jobs):
    m = with_policy(api, allowedRegistries=["registry.internal/"])
    m.default_image = "registry.internal/rosetta-trainer:1"
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    status = succeed(api, m)
    assert status["evaluation"]["phase"] == "Pending" and warnings == []
    assert jobs["mt-eval"]["spec"]["template"]["spec"]["containers"][0]["image"] == m.default_image


def test_an_evaluation_only_run_waits_in_its_queue():
    evaluate = {"mode": "evaluate", "model": {"name": "/models/flan-t5-small"},
                "data": {"sourceLang": "en", "targetLangs": ["de"], "test": [{"format": "generated", "size": 10}]}}
    queued = render_evaluation_job(NAME, NS, parse_spec({**evaluate, "scheduling": {"queueName": "gpu"}}))
    assert queued["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "gpu" and queued["spec"]["suspend"] is True
    assert KUEUE_QUEUE_LABEL not in queued["spec"]["template"]["metadata"]["labels"]
    unqueued = render_evaluation_job(NAME, NS, parse_spec(evaluate))
    assert KUEUE_QUEUE_LABEL not in unqueued["metadata"]["labels"] and "suspend" not in unqueued["spec"]


def test_the_documented_example_policy_reads_and_means_what_the_docs_say():
    docs = (ROOT / "docs" / "operator.md").read_text()
    block = docs[docs.index("# policy.yaml: the cluster-wide rules"):]
    policy = Policy.model_validate(yaml.safe_load(block[:block.index("```")]), by_name=False)
    research, sandbox = policy.for_namespace("research"), policy.for_namespace("sandbox-alice")
    assert (research.max_nodes, research.max_gpus_per_training, research.require_queue) == (8, 64, True)
    assert (sandbox.max_gpus_per_node, sandbox.require_queue, sandbox.max_nodes) == (0, False, 4)
    assert policy.for_namespace("ml").allowed_registries == sandbox.allowed_registries
