"""model.source / data.source on the cluster: the spec's rules, the JobSet's stage job that the gang
depends on, and the status the operator reads from it (the JobSet controller acting on dependsOn is
tests/cluster/test_staging_cluster.py)."""

from __future__ import annotations

import copy
import re

import pytest

from rosetta_contract.exits import DATA_INVALID_EXIT
from rosetta_contract.resource import Phase
from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator import evaluation_status as es
from rosetta_operator.jobset_status import expected_jobs, job_counts, observe_jobset, shows_failure
from rosetta_operator.names import STAGE_JOB
from rosetta_operator.progress import _is_rank0
from rosetta_operator.render import render
from support.handler_api import NAME, NS, SPEC
from support.openapi_check import jobset_schema, schema_errors

MODELS = {"name": "models", "mountPath": "/models", "purpose": "model", "persistentVolumeClaim": {"claimName": "models"}}
MODEL = {"name": "/models/flan-t5-small", "source": {"uri": "s3://weights/flan-t5-small",
                                                     "endpointUrl": "http://minio:9000", "credentialsSecret": "s3"}}


def spec_with(model=None, data_source=None, volumes=None, **patch):
    raw = copy.deepcopy(SPEC)
    raw["volumes"] = [*raw["volumes"], *(volumes if volumes is not None else [MODELS])]
    if model is not None:
        raw["model"] = model
        raw.pop("tokenizer", None)
    if data_source is not None:
        raw["data"] = {**raw["data"], "source": data_source}
    return parse_spec({**raw, **patch})


def problems(**kw) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        spec_with(**kw)
    return info.value.errors


def jobs(spec) -> dict[str, dict]:
    return {job["name"]: job for job in render(NAME, NS, spec).jobset["spec"]["replicatedJobs"]}


# ---------------------------------------------------------------------------------- spec


@pytest.mark.parametrize("uri, says", [
    ("gs://bucket/x", "must start with s3:// or hf://"),
    ("s3:///prefix", "names no bucket"),
    ("s3://Bad_Bucket/x", "is not a valid S3 bucket name"),
    ("hf://org/../etc", "is not a hub repository"),
    ("hf://a/b/c", "is not a hub repository"),
])
def test_a_source_uri_must_be_s3_or_a_hub_repository(uri, says):
    (field, message), = problems(model={**MODEL, "source": {"uri": uri}})
    assert field == "spec.model.source.uri" and says in message


def test_the_model_is_staged_into_an_absolute_model_name():
    (field, message), = problems(model={"name": "google/flan-t5-small", "source": {"uri": "hf://google/flan-t5-small"}})
    assert field == "spec.model" and "must then be an absolute directory" in message
    (_, message), = problems(model={**MODEL, "source": {"uri": "hf://google/flan-t5-small", "path": "/models/other"}})
    assert "source.path must be name" in message
    (_, message), = problems(model={**MODEL, "source": {"uri": "hf://datasets/org/corpus"}})
    assert "is a dataset repository" in message


def test_s3_options_are_refused_for_a_hub_source():
    (_, message), = problems(model={**MODEL, "source": {"uri": "hf://google/flan-t5-small", "region": "eu-west-1"}})
    assert "region apply to s3:// sources only" in message


def test_data_source_needs_a_path_on_a_shared_writable_volume():
    (field, message), = problems(data_source={"uri": "s3://corpora/wmt"})
    assert field == "spec.data" and "source.path is required" in message
    (field, message), = problems(data_source={"uri": "s3://corpora/wmt", "path": "/scratch/wmt"})
    assert field == "spec" and "data.source: /scratch/wmt is not on a persistentVolumeClaim volume" in message
    read_only = [{**MODELS, "readOnly": True}]
    (_, message), = problems(data_source={"uri": "s3://corpora/wmt", "path": "/models/wmt"}, volumes=read_only)
    assert "mounted read-only; the stage job writes there" in message


def test_one_credentials_secret_for_both_sources():
    spec = spec_with(model=MODEL, data_source={"uri": "s3://corpora/wmt", "path": "/models/wmt",
                                               "credentialsSecret": "other"})
    with pytest.raises(ConfigError, match="use one Secret"):
        render(NAME, NS, spec)


# -------------------------------------------------------------------------------- render


def test_without_a_source_the_jobset_is_the_gang_alone():
    assert list(jobs(parse_spec(SPEC))) == ["node"]
    rules = render(NAME, NS, parse_spec(SPEC)).jobset["spec"]["failurePolicy"]["rules"]
    assert [r["name"] for r in rules] == ["fail_fast", "preemption"] and "targetReplicatedJobs" not in rules[1]


def test_the_gang_depends_on_a_stage_job_that_runs_rosetta_stage():
    spec = spec_with(model=MODEL)
    rendered = render(NAME, NS, spec)
    assert [j["name"] for j in rendered.jobset["spec"]["replicatedJobs"]] == [STAGE_JOB, "node"]
    stage, gang = jobs(spec)[STAGE_JOB], jobs(spec)["node"]
    assert gang["dependsOn"] == [{"name": STAGE_JOB, "status": "Complete"}]
    assert stage["replicas"] == 1 and stage["template"]["spec"]["completions"] == 1
    pod = stage["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "rosetta_trainer", "stage", "-f", "$(ROSETTA_CONFIG)"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    # The credentials by reference to the Secret, never their values.
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert refs == {"AWS_ACCESS_KEY_ID": "s3", "AWS_SECRET_ACCESS_KEY": "s3", "AWS_SESSION_TOKEN": "s3"}
    # The shared volumes, not the gang's /dev/shm.
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/models", "/runs", "/etc/rosetta"}
    assert "dshm" not in {v["name"] for v in pod["volumes"]}
    # The gang reads the staged copy with the hub offline.
    gang_env = {e["name"]: e.get("value") for e in gang["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert gang_env["HF_HUB_OFFLINE"] == "1" and gang_env["HF_DATASETS_OFFLINE"] == "1"
    assert not schema_errors(jobset_schema(), rendered.jobset, skip=("metadata",))


def test_a_refused_source_fails_the_jobset_and_a_preemption_still_restarts_the_gang():
    spec = spec_with(model=MODEL)
    stage = jobs(spec)[STAGE_JOB]["template"]["spec"]
    refused = stage["podFailurePolicy"]["rules"][0]
    assert refused["action"] == "FailJob" and refused["onExitCodes"]["values"] == [DATA_INVALID_EXIT]
    rules = {r["name"]: r for r in render(NAME, NS, spec).jobset["spec"]["failurePolicy"]["rules"]}
    assert rules["stage_refused"]["action"] == "FailJobSet"
    assert rules["stage_refused"]["targetReplicatedJobs"] == [STAGE_JOB]
    # What JobSet's webhook accepts as a rule name (it refused "stage-refused").
    assert all(re.fullmatch(r"[a-zA-Z]([a-zA-Z0-9_,:]*[a-zA-Z0-9_])?", name) for name in rules)
    assert rules["preemption"]["targetReplicatedJobs"] == ["node"]


def test_a_user_offline_setting_is_kept():
    spec = spec_with(model=MODEL, env=[{"name": "HF_HUB_OFFLINE", "value": "0"}])
    env = jobs(spec)["node"]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "HF_HUB_OFFLINE"] == [{"name": "HF_HUB_OFFLINE", "value": "0"}]


# ------------------------------------------------------------ data.prepare: BeforeTraining


def prepared_spec(**patch):
    raw = copy.deepcopy(SPEC)
    raw["data"] = {**raw["data"], "prepare": "BeforeTraining"}
    return parse_spec({**raw, **patch})


def test_preparing_before_training_alone_makes_a_stage_job_that_tokenizes_into_the_output():
    spec = prepared_spec(resources={"cpu": 6, "memory": "24Gi"})
    rendered = render(NAME, NS, spec)
    assert [j["name"] for j in rendered.jobset["spec"]["replicatedJobs"]] == [STAGE_JOB, "node"]
    stage, gang = jobs(spec)[STAGE_JOB], jobs(spec)["node"]
    assert gang["dependsOn"] == [{"name": STAGE_JOB, "status": "Complete"}]
    (container,) = stage["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--prepare", "$(ROSETTA_OUTPUT)"]
    stage_env = {e["name"]: e.get("value") for e in container["env"]}
    gang_env = {e["name"]: e.get("value") for e in gang["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert stage_env["ROSETTA_OUTPUT"] == gang_env["ROSETTA_OUTPUT"] == f"/runs/{NAME}"
    # Tokenizing takes the cores a gang pod would have, and no GPU.
    assert container["resources"] == {"requests": {"cpu": "6", "memory": "24Gi"}, "limits": {"memory": "24Gi"}}
    # Nothing is staged, so the gang may still reach the hub.
    assert "HF_HUB_OFFLINE" not in gang_env
    rules = {r["name"] for r in rendered.jobset["spec"]["failurePolicy"]["rules"]}
    assert rules == {"fail_fast", "stage_refused", "preemption"}  # a data error in the stage pod fails at once
    assert not schema_errors(jobset_schema(), rendered.jobset, skip=("metadata",))


def test_preparing_and_staging_are_one_stage_job():
    raw = copy.deepcopy(SPEC)
    raw["volumes"] = [*raw["volumes"], MODELS]
    raw["model"] = MODEL
    raw.pop("tokenizer", None)
    raw["data"] = {**raw["data"], "prepare": "BeforeTraining"}
    stage = jobs(parse_spec(raw))[STAGE_JOB]
    (container,) = stage["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "rosetta_trainer", "stage", "-f", "$(ROSETTA_CONFIG)",
                                    "--prepare", "$(ROSETTA_OUTPUT)"]


def test_preparing_before_training_needs_the_checkpoints_on_a_claim():
    raw = copy.deepcopy(SPEC)
    raw.update(nodes=1, volumes=[])
    raw["data"] = {**raw["data"], "prepare": "BeforeTraining"}
    with pytest.raises(ConfigError) as info:
        parse_spec(raw)
    (field, message), = info.value.errors
    assert field == "spec" and "data.prepare: BeforeTraining" in message and "no volume has purpose: checkpoints" in message


def test_while_preparing_the_status_says_where_the_data_goes():
    js = render(NAME, NS, prepared_spec()).jobset
    js["status"] = {"replicatedJobsStatus": [{"name": STAGE_JOB, "active": 1}, {"name": "node"}]}
    observed = observe_jobset(js)
    assert observed.phase == Phase.PENDING
    assert observed.message.startswith(f"staging: tokenizing the training data into /runs/{NAME}/prepared")


# -------------------------------------------------------------------------------- status


def jobset_with(stage: dict | None, node: dict) -> dict:
    spec_jobs = ([{"name": STAGE_JOB, "replicas": 1}] if stage is not None else []) + [{"name": "node", "replicas": 1}]
    statuses = ([{"name": STAGE_JOB, **stage}] if stage is not None else []) + [{"name": "node", **node}]
    return {"metadata": {"name": NAME}, "spec": {"replicatedJobs": spec_jobs}, "status": {"replicatedJobsStatus": statuses}}


def test_while_staging_the_training_is_pending_and_says_so():
    js = jobset_with({"active": 1, "ready": 1}, {})
    observed = observe_jobset(js)
    assert observed.phase == Phase.PENDING and observed.message.startswith("staging:")
    assert expected_jobs(js) == 1 and job_counts(js)["ready"] == 0


def test_after_staging_the_gang_alone_makes_it_running():
    js = jobset_with({"succeeded": 1}, {"active": 1, "ready": 1})
    observed = observe_jobset(js)
    assert observed.phase == Phase.RUNNING and observed.message == "running: 1/1 jobs ready"


def test_a_failed_stage_job_is_a_failure_to_look_into():
    assert shows_failure(jobset_with({"failed": 1}, {}), previous_restarts=0)
    assert not shows_failure(jobset_with({"succeeded": 1}, {"active": 1}), previous_restarts=0)


def test_progress_is_read_from_the_gang_not_from_the_stage_pod():
    def pod(job: str) -> dict:
        return {"metadata": {"labels": {"jobset.sigs.k8s.io/jobset-name": NAME, "jobset.sigs.k8s.io/job-index": "0",
                                        "jobset.sigs.k8s.io/replicatedjob-name": job},
                             "annotations": {"batch.kubernetes.io/job-completion-index": "0"}}}
    assert _is_rank0(pod("node"), NAME) and not _is_rank0(pod(STAGE_JOB), NAME)


# ---------------------------------------------------------------------------- mode evaluate


EVALUATE = {
    "mode": "evaluate",
    "model": {"name": "/models/flan-t5-small", "source": {"uri": "hf://google/flan-t5-small"}},
    "data": {"sourceLang": "en", "targetLangs": ["de"],
             "test": [{"format": "jsonl", "path": "/models/test.de.jsonl"}]},
    "volumes": [MODELS],
}


def test_in_mode_evaluate_the_evaluation_pod_stages_first_in_an_init_container():
    from rosetta_operator.evaluation_job import render_evaluation_job

    job = render_evaluation_job(NAME, NS, parse_spec(copy.deepcopy(EVALUATE)))
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == STAGE_JOB and init["command"][3] == "stage"
    assert {m["mountPath"] for m in init["volumeMounts"]} == {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": STAGE_JOB, "operator": "In",
                                                             "values": [DATA_INVALID_EXIT]}}
    plain = render_evaluation_job(NAME, NS, parse_spec({**copy.deepcopy(EVALUATE),
                                                        "model": {"name": "/models/flan-t5-small"}}))
    assert "initContainers" not in plain["spec"]["template"]["spec"]


def test_a_failed_staging_is_the_evaluation_s_failure_message():
    job = {"metadata": {"name": f"{NAME}-eval"},
           "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                                      "message": "Container stage for pod x failed with exit code 65"}]}}
    pod = {"metadata": {"name": f"{NAME}-eval-abcde"}, "status": {"initContainerStatuses": [{"name": STAGE_JOB, "state": {
        "terminated": {"exitCode": 65, "message": "DataInvalid: hf://google/flan-t5-small: RepositoryNotFoundError"}}}]}}
    evaluation, cond = es.observe_evaluation(job, [pod], None)
    assert evaluation["phase"] == "Failed"
    assert evaluation["message"] == f"pod {NAME}-eval-abcde: hf://google/flan-t5-small: RepositoryNotFoundError"
