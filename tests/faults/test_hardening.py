"""Hardening: what a TranslationTraining may not do to the cluster, and what its pods may not do.

    trainer pods     non-root (the image's UID 10001 unless podSecurity picks another, never 0),
                     no ServiceAccount token unless asked for, no privilege escalation, no
                     capabilities, seccomp RuntimeDefault, a read-only root (emptyDirs at /tmp, HOME)
    credentials      env names like *_TOKEN, *_SECRET*, *_PASSWORD, *_API_KEY only via secretKeyRef
    hostPath         refused unless the operator runs with --allow-host-path
    names, labels    the training's name fits every child's name; label values are valid labels

Each rule is checked where it is enforced: the pydantic spec (the operator and `rosetta
validate`), the CRD (schema and CEL rules, which the test apiserver is too old to run: they are
evaluated here with cel-python) and, at the end, a real apiserver with the operator.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from rosetta_cli.main import main
from rosetta_contract.profiles import PROFILES
from rosetta_contract.resource import Phase
from rosetta_contract.spec import ConfigError, parse_spec, parse_training
from rosetta_contract.trainer_pod import MAX_NAME_LENGTH, TRAINER_UID, is_secret_env
from rosetta_operator.conditions import ConditionType, Reason
from rosetta_operator.crd import build_crd, spec_schema
from rosetta_operator.names import label_value
from rosetta_operator.pod_template import SCRATCH_MOUNTS
from rosetta_operator.render import render
from support.cluster import GROUP, JS_GROUP, JS_PLURAL, JS_VERSION, PLURAL, REPO, VERSION, Cluster, wait_for
from support.openapi_check import assert_valid_jobset, cel_failures, schema_errors, with_defaults

TRAINER = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}
SPEC_SCHEMA = spec_schema()
ROOT_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SECRET_REF = {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
HOST_PATH = [{"name": "nvme", "mountPath": "/scratch", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}}]
# The checkpoints volume every pod of a training on more than one node shares.
SHARED = [{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", "persistentVolumeClaim": {"claimName": "efs"}}]
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def document(name: str = "mt", **cluster) -> dict:
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": name},
            "spec": {**copy.deepcopy(TRAINER), **cluster}}


def errors_of(doc: dict, allow_host_path: bool = False) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_training(doc, allow_host_path=allow_host_path)
    return dict(info.value.errors)


def cel_messages(spec: dict) -> list[str]:
    # The apiserver applies the schema's defaults before it runs the rules.
    assert schema_errors(SPEC_SCHEMA, spec) == [], "the plain schema accepts it: CEL is what is tested"
    return [message for _, _, message in cel_failures(SPEC_SCHEMA, with_defaults(SPEC_SCHEMA, spec))]


def pod_of(jobset: dict) -> dict:
    (job,) = jobset["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]


def build(name: str = "mt", allow_host_path: bool = False, **cluster):
    spec = parse_spec({**copy.deepcopy(TRAINER), **cluster}, allow_host_path=allow_host_path)
    return render(name, "team", spec)


def assert_hardened(pod: dict, uid: int = TRAINER_UID) -> None:
    """What every trainer pod must look like, whatever the spec asked for."""
    assert pod["automountServiceAccountToken"] is False
    sec = pod["securityContext"]
    assert sec["runAsNonRoot"] is True
    assert sec["runAsUser"] == uid != 0
    assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    csec = container["securityContext"]
    assert csec == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]}}
    # A read-only root needs somewhere to write: scratch emptyDirs at /tmp and the image's HOME.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for path in SCRATCH_MOUNTS:
        assert mounts[path]["emptyDir"] == {}, path
    assert not any("hostPath" in v for v in pod["volumes"])
    assert not any(is_secret_env(e["name"]) and "value" in e for e in container["env"])


# ------------------------------------------------------------------------------ trainer pods


SPECS = {
    "default": {},
    "irsa service account": {"serviceAccountName": "s3-reader"},
    "cpu, several processes": {"nodes": 2, "procsPerNode": 2, "volumes": SHARED},
    "deepspeed": {"gpusPerNode": 2, "launcher": "deepspeed", "training": {"maxSteps": 10, "device": "cuda"}},
    **{f"profile {name}": {"nodes": 2, "gpusPerNode": 8, "network": {"profile": name}, "volumes": SHARED}
       for name, profile in PROFILES.items() if profile.needs_gpus},
}


@pytest.mark.parametrize("fields", SPECS.values(), ids=SPECS.keys())
def test_trainer_pods_are_hardened(fields):
    rendered = build(**fields)
    pod = pod_of(rendered.jobset)
    assert_hardened(pod)
    if "serviceAccountName" in fields:
        # IRSA's webhook mounts its own projected token (aws-iam-token): the API token stays out.
        assert pod["serviceAccountName"] == fields["serviceAccountName"]
    assert_valid_jobset(rendered.jobset)


def test_no_network_profile_needs_a_capability():
    # EFA's memory registration wants memlock, not CAP_IPC_LOCK: a non-root process never gets an
    # added capability (no ambient capabilities in Kubernetes), so none is added for any profile.
    for name in PROFILES:
        fields = {"gpusPerNode": 8, "network": {"profile": name}} if PROFILES[name].needs_gpus else {}
        (container,) = pod_of(build(**fields).jobset)["containers"]
        assert "add" not in container["securityContext"]["capabilities"], name


def test_pod_security_chooses_the_user_not_whether_it_is_root():
    pod = pod_of(build(podSecurity={"runAsUser": 1000, "fsGroup": 2000}).jobset)
    assert_hardened(pod, uid=1000)
    assert (pod["securityContext"]["runAsGroup"], pod["securityContext"]["fsGroup"]) == (1000, 2000)
    # The API token only when the spec asks for it.
    assert pod_of(build(podSecurity={"automountServiceAccountToken": True}).jobset)[
        "automountServiceAccountToken"] is True


@pytest.mark.parametrize("pod_security, field, message", [
    ({"runAsUser": 0}, "spec.podSecurity.runAsUser", "do not run as root"),
    ({"runAsNonRoot": False}, "spec.podSecurity.runAsNonRoot", "always run as non-root"),
])
def test_root_is_refused_by_the_operator_and_the_crd(pod_security, field, message):
    doc = document(podSecurity=pod_security)
    errors = errors_of(doc)
    assert list(errors) == [field] and message in errors[field]
    (cel,) = cel_messages(doc["spec"])
    assert "root" in cel


# ------------------------------------------------------------------------------- credentials


CREDENTIALS = ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD", "OAUTH_CLIENT_SECRET", "MY_SECRETS_FILE",
               "OPENAI_API_KEY", "hf_token"]
NOT_CREDENTIALS = ["TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "HF_HOME", "MAX_TOKENS", "SECRETARY", "WANDB_PROJECT"]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_credential_in_clear_is_refused(name):
    literal = document(env=[{"name": name, "value": "hunter2"}])
    errors = errors_of(literal)
    assert list(errors) == ["spec.env[0].value"]
    assert f"{name} holds a credential" in errors["spec.env[0].value"]
    assert "valueFrom.secretKeyRef" in errors["spec.env[0].value"]
    assert "hunter2" not in errors["spec.env[0].value"]  # the error must not leak it either
    (cel,) = cel_messages(literal["spec"])
    assert "secretKeyRef" in cel

    from_configmap = document(env=[{"name": name, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}])
    errors = errors_of(from_configmap)
    assert list(errors) == ["spec.env[0].valueFrom"] and "Secret" in errors["spec.env[0].valueFrom"]
    assert len(cel_messages(from_configmap["spec"])) == 1


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_credential_from_a_secret_reaches_the_pod_as_a_reference(name):
    rendered = build(env=[{"name": name, "valueFrom": SECRET_REF}])
    (container,) = pod_of(rendered.jobset)["containers"]
    assert {"name": name, "valueFrom": SECRET_REF} in container["env"]
    assert cel_messages({**TRAINER, "env": [{"name": name, "valueFrom": SECRET_REF}]}) == []


@pytest.mark.parametrize("name", NOT_CREDENTIALS)
def test_ordinary_variables_keep_literal_values(name):
    (container,) = pod_of(build(env=[{"name": name, "value": "1"}]).jobset)["containers"]
    assert {"name": name, "value": "1"} in container["env"]
    assert cel_messages({**TRAINER, "env": [{"name": name, "value": "1"}]}) == []


# ---------------------------------------------------------------------------------- hostPath


def test_host_path_needs_the_operator_flag(tmp_path, capsys):
    doc = document(volumes=HOST_PATH)
    errors = errors_of(doc)
    assert list(errors) == ["spec.volumes[0].hostPath"] and "--allow-host-path" in errors["spec.volumes[0].hostPath"]
    (volume,) = [v for v in pod_of(build(volumes=HOST_PATH, allow_host_path=True).jobset)["volumes"]
                 if v["name"] == "nvme"]
    assert volume["hostPath"] == {"path": "/mnt/nvme", "type": "Directory"}

    # `rosetta render` and `rosetta validate` answer as an operator with the same flag would.
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(doc))
    for command in ("render", "validate"):
        assert main([command, "-f", str(path)]) == 2
        assert "spec.volumes[0].hostPath: hostPath volumes are not allowed" in capsys.readouterr().err
    assert main(["render", "-f", str(path), "--allow-host-path"]) == 0
    jobset = list(yaml.safe_load_all(capsys.readouterr().out))[1]
    assert {"name": "nvme", "hostPath": {"path": "/mnt/nvme", "type": "Directory"}} in pod_of(jobset)["volumes"]


def test_the_operator_pod_is_hardened_and_passes_the_host_path_flag():
    from support.chart import raw_manifests  # Helm's engine: loaded only here
    from support.chart import render as render_chart

    def deployment(objects):
        return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]

    for pod in (deployment(render_chart({})), deployment(raw_manifests())):  # chart and manifests/operator.yaml
        # Unlike the trainer, the operator needs its token: it watches and writes the API.
        assert pod["automountServiceAccountToken"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "--allow-host-path" not in container["args"]
    allowed = deployment(render_chart({"operator": {"allowHostPath": True}}))
    assert "--allow-host-path" in allowed["containers"][0]["args"]


# ------------------------------------------------------------------------- names and labels


def max_name_length(nodes: int) -> int:
    # <name>-node-0-<nodes-1>-<5 random>: JobSet's webhook refuses a longest pod name over 63.
    return 63 - len(f"-node-0-{nodes - 1}-abcde")


@pytest.mark.parametrize("nodes", [1, 9, 10, 11, 100, 101, 1000, 4096])
def test_the_longest_accepted_name_fits_every_pod_name(nodes):
    longest = min(MAX_NAME_LENGTH, max_name_length(nodes))
    rendered = build("a" * longest, nodes=nodes, volumes=SHARED)
    pod_name = rendered.names.pod_hostname(nodes - 1) + "-abcde"
    assert len(pod_name) <= 63 and DNS1035.match(pod_name)
    assert DNS1035.match(rendered.names.jobset) and len(rendered.names.configmap) <= 253
    with pytest.raises(ConfigError) as info:
        parse_training(document("a" * (longest + 1), nodes=nodes, volumes=SHARED)) if longest == MAX_NAME_LENGTH \
            else build("a" * (longest + 1), nodes=nodes, volumes=SHARED)
    ((field, message),) = info.value.errors
    assert field == "metadata.name" and f"at most {longest}" in message


def test_the_crd_refuses_names_no_pod_could_carry():
    name_schema = ROOT_SCHEMA["properties"]["metadata"]["properties"]["name"]
    assert name_schema["maxLength"] == MAX_NAME_LENGTH == max_name_length(10)
    assert schema_errors(name_schema, "a" * MAX_NAME_LENGTH) == []
    assert schema_errors(name_schema, "a" * (MAX_NAME_LENGTH + 1))
    assert schema_errors(name_schema, "9lives")  # the JobSet's Service name must start with a letter


@pytest.mark.parametrize("raw, expected", [
    ("google/flan-t5-xl", "google-flan-t5-xl"),
    ("Helsinki-NLP/opus-mt-en-de", "Helsinki-NLP-opus-mt-en-de"),
    ("-_.x._-", "x"),
    ("a" * 70, "a" * 63),
    ("a" * 62 + "/b", "a" * 62),
    ("///", ""),
])
def test_label_values_are_sanitised(raw, expected):
    assert label_value(raw) == expected
    assert LABEL_VALUE.match(expected) and len(expected) <= 63


def test_every_rendered_label_is_a_valid_label():
    rendered = build("a" * MAX_NAME_LENGTH, model={"name": "google/flan-t5-xl"}, tokenizer={},
                     scheduling={"queueName": "team-a"}, suspend=True)
    metadatas = [rendered.configmap["metadata"], rendered.jobset["metadata"]]
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    metadatas += [job["template"]["metadata"], job["template"]["spec"]["template"]["metadata"]]
    for meta in metadatas:
        for key, value in meta["labels"].items():
            assert LABEL_VALUE.match(value) and len(value) <= 63, (key, value)
        # The model name is no label or annotation value: it only lives in the ConfigMap's config.
        assert "flan" not in yaml.safe_dump(meta)


# ------------------------------------------------------------- against a real apiserver


def quickstart(name: str, **spec) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec)
    return doc


@pytest.mark.integration
def test_the_operator_refuses_unsafe_trainings_and_hardens_the_rest(cluster: Cluster, namespace, operator):
    from kubernetes.client.rest import ApiException

    def create(doc):
        return cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)

    def status(name):
        return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}

    def jobsets():
        return cluster.custom.list_namespaced_custom_object(JS_GROUP, JS_VERSION, namespace, JS_PLURAL)["items"]

    # The schema refuses a name no pod could carry, and the CEL rules a literal credential and root,
    # naming the field and never echoing the value.
    for doc, field in ((quickstart("a" * (MAX_NAME_LENGTH + 1)), "metadata.name"),
                       (quickstart("leaky", env=[{"name": "WANDB_API_KEY", "value": "hunter2"}]), "spec.env[0]"),
                       (quickstart("rooted", podSecurity={"runAsUser": 0}), "spec.podSecurity")):
        with pytest.raises(ApiException) as info:
            create(doc)
        assert info.value.status == 422 and field in info.value.body and "hunter2" not in info.value.body

    # hostPath passes the schema (an installation may allow it); this operator refuses it, in status,
    # and creates nothing.
    create(quickstart("hostpath", nodes=1, volumes=HOST_PATH))  # one node: no shared checkpoints needed
    create(quickstart("fine", env=[{"name": "WANDB_API_KEY", "valueFrom": SECRET_REF}]))
    st = wait_for(lambda: status("hostpath").get("phase") == Phase.FAILED and status("hostpath"), "hostpath to fail")
    valid = next(c for c in st["conditions"] if c["type"] == ConditionType.VALID)
    assert (valid["status"], valid["reason"]) == ("False", Reason.INVALID_SPEC)
    assert "spec.volumes[0].hostPath" in valid["message"]
    assert "jobSetName" not in st

    # The one JobSet, as the apiserver stored it (nothing pruned): the hardened pod.
    (jobset,) = wait_for(jobsets, "the JobSet of 'fine'")
    assert jobset["metadata"]["name"] == "fine"
    pod = pod_of(jobset)
    assert_hardened(pod)
    assert {"name": "WANDB_API_KEY", "valueFrom": SECRET_REF} in pod["containers"][0]["env"]
    assert [cm.metadata.name for cm in cluster.core.list_namespaced_config_map(namespace).items
            if cm.metadata.name.endswith("-config")] == ["fine-config"]
