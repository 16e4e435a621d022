"""The admin's policy (policy.py): each rule, the policy file, `rosetta validate/render --policy`, and
the operator's reconcile refusing what the policy forbids (against the handlers' in-memory API)."""

from __future__ import annotations

import copy
import logging

import kopf
import pytest
import yaml

from rosetta_cli.main import main
from rosetta_contract.spec import parse_spec
from rosetta_operator import handlers
from rosetta_operator import status as st
from rosetta_operator.policy import Policy, PolicyError, PolicyViolation, load_policy, normalized_image, violations
from support.cel_cases import BASE, SHARED_CHECKPOINTS
from support.handler_api import NAME, api, memo, reconcile, training, warnings  # noqa: F401 - fixtures

GPU = {"gpusPerNode": 8, "training": {"maxSteps": 10, "device": "cuda"}}
HOST = {"name": "data", "mountPath": "/data", "purpose": "data", "hostPath": {"path": "/mnt/datasets/wmt"}}


def spec(**fields):
    return parse_spec({**copy.deepcopy(BASE), **fields}, allow_host_path=True)


def check(policy: dict, **fields) -> list[tuple[str, str]]:
    return violations(spec(**fields), Policy.model_validate(policy, by_name=False))


def paths(problems: list[tuple[str, str]]) -> list[str]:
    return [path for path, _ in problems]


# ------------------------------------------------------------------------------- each rule


def test_an_empty_policy_allows_everything_a_spec_may_ask_for():
    assert check({}, image="evil.example/miner:1", serviceAccountName="admin",
                 podSecurity={"automountServiceAccountToken": True, "runAsGroup": 0, "fsGroup": 0},
                 scheduling={"priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}]},
                 nodes=64, volumes=[HOST] + SHARED_CHECKPOINTS, **GPU) == []


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
    problems = check(policy, scheduling={"tolerations": ok + [{"key": "node-role.kubernetes.io/control-plane",
                                                               "operator": "Exists"}]})
    assert problems == [("spec.scheduling.tolerations[2].key", "'node-role.kubernetes.io/control-plane' is not "
                                                               "allowed here; allowed: nvidia.com/gpu, spot "
                                                               "(operator policy)")]


@pytest.mark.parametrize("policy", [{"allowTolerateAll": False}, {"allowedTolerationKeys": ["spot"]}])
def test_tolerating_every_taint(policy):
    (problem,) = check(policy, scheduling={"tolerations": [{"operator": "Exists"}]})
    assert problem[0] == "spec.scheduling.tolerations[0]"
    assert problem[1].startswith("an empty key with operator Exists tolerates every taint")
    assert check({}, scheduling={"tolerations": [{"operator": "Exists"}]}) == []


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


# ----------------------------------------------------------------------------- the file


def test_load_policy(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("allowedRegistries: [ghcr.io/rosetta-dev/]\nmaxNodes: 4\nallowRootGroup: false\n")
    policy = load_policy(path)
    assert policy.allowed_registries == ["ghcr.io/rosetta-dev/"] and policy.max_nodes == 4
    assert policy.limits() == ["allowedRegistries", "maxNodes", "allowRootGroup"]
    path.write_text("")
    assert load_policy(path) == Policy()


@pytest.mark.parametrize("text, error", [
    ("maxNodes: 0\n", "maxNodes: Input should be greater than or equal to 1"),
    ("max_nodes: 4\n", "max_nodes: Extra inputs are not permitted"),  # camelCase only, as in values.yaml
    ("allowedRegistry: [x]\n", "allowedRegistry: Extra inputs are not permitted"),
    ("maxNodes: true\n", "maxNodes:"),
    ("allowedHostPaths: [mnt]\n", "allowedHostPaths[0]: String should match pattern"),
    ("[ghcr.io/]\n", "expected a mapping of policy fields"),
    ("a: 1\na: 2\n", "duplicate key"),
    ("allowedRegistries: [\n", "line"),
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


# ------------------------------------------------------------------ rosetta validate / render


def _files(tmp_path, policy: dict, **fields) -> tuple[str, str]:
    doc = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "mt"},
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
    assert status["phase"] == st.Phase.FAILED and status["message"] == message
    valid = st.condition(status, st.ConditionType.VALID)
    assert (valid["status"], valid["reason"], valid["message"]) == ("False", "ForbiddenByPolicy", message)
    assert st.condition(status, st.ConditionType.FAILED)["reason"] == "ForbiddenByPolicy"
    assert warnings == [{"name": NAME, "reason": "ForbiddenByPolicy", "message": message}]
    assert [c for c in api.calls if c[0] == "create"] == []


def test_an_allowed_training_gets_its_jobset(api, warnings):
    training(api, scheduling={"priorityClassName": "batch"})
    status = reconcile(api, with_policy(api, allowedPriorityClasses=["batch"], maxNodes=2))["status"]
    assert st.condition(status, st.ConditionType.VALID)["reason"] == "SpecValid"
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
    assert status["phase"] != st.Phase.FAILED
    assert st.condition(status, st.ConditionType.SPEC_APPLIED)["reason"] == "ForbiddenByPolicy"
    assert st.condition(status, st.ConditionType.VALID)["message"].startswith("spec.nodes: 3 nodes; at most 2")


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
