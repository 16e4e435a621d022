"""spec.evaluation.afterTraining: the CPU evaluation Job (rendered), the operator creating it once
when the JobSet succeeded (an in-memory API), and status.evaluation from its termination message."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import kopf
import pytest

from rosetta_contract import final_result
from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator import evaluation_status as es
from rosetta_operator import handlers
from rosetta_operator.conditions import condition
from rosetta_operator.evaluation_job import EVALUATION_LABEL, render_evaluation_job
from rosetta_operator.render import render
from support.handler_api import (
    NAME,
    NS,
    SPEC,
    UID,
    jobset_event,
    jobset_status,
    memo,
    reconcile,
    training,
)
from support.openapi_check import jobset_schema, schema_errors

AFTER = {"afterTraining": {"checkpoint": "best", "cpu": 6, "memory": "12Gi"}}
DATA = {**SPEC["data"], "test": [{"format": "generated", "size": 10, "seed": 3}]}
OWNER = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "name": NAME, "uid": UID}


def spec_with(**patch):
    return parse_spec({**copy.deepcopy(SPEC), "data": DATA, "evaluation": AFTER, **patch})


def job_of(**patch) -> dict:
    return render_evaluation_job(NAME, NS, spec_with(**patch), owner=OWNER)


# ------------------------------------------------------------------------------- render


def test_no_job_without_after_training():
    assert render_evaluation_job(NAME, NS, parse_spec(SPEC)) is None


def test_the_job_evaluates_the_picked_checkpoint_on_the_cpu():
    job = job_of()
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("batch/v1", "Job", "mt-eval")
    assert job["metadata"]["labels"][EVALUATION_LABEL] == NAME
    assert job["metadata"]["ownerReferences"] == [{**OWNER, "controller": True, "blockOwnerDeletion": True}]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", "rosetta_trainer", "evaluate", "-f", "/etc/rosetta/training.yaml",
                            "--checkpoint", "/runs/mt/checkpoints", "--pick", "best", "--device", "cpu",
                            "--split", "test", "--output", "/runs/mt/evaluation"]
    assert c["resources"] == {"requests": {"cpu": "6", "memory": "12Gi"}, "limits": {"cpu": "6", "memory": "12Gi"}}
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in c["env"]
    assert {"name": "OMP_NUM_THREADS", "value": "6"} in c["env"]


@pytest.mark.parametrize("cpu, threads", [("8", 8), ("7500m", 7), ("500m", 1), ("1.5", 1)])
def test_the_pod_uses_as_many_threads_as_it_has_cores(cpu, threads):
    env = job_of(evaluation={"afterTraining": {"cpu": cpu}})["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "OMP_NUM_THREADS", "value": str(threads)} in env


def test_after_training_needs_test_data():
    data = {**SPEC["data"], "test": []}
    with pytest.raises(ConfigError, match="data.test is empty"):
        spec_with(data=data)


def test_the_job_mounts_the_trainings_volumes_and_keeps_its_security_context():
    spec = spec_with(gpusPerNode=8, training={"maxSteps": 10, "device": "cuda"},
                     scheduling={"nodeSelector": {"gpu": "h100"}})
    training_pod = render(NAME, NS, spec).jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    job = render_evaluation_job(NAME, NS, spec, owner=OWNER)
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (trainer,) = training_pod["containers"]
    assert pod["securityContext"] == training_pod["securityContext"]
    assert c["securityContext"] == trainer["securityContext"] and c["image"] == trainer["image"]
    assert pod["volumes"] == [v for v in training_pod["volumes"] if v["name"] != "dshm"]
    assert c["volumeMounts"] == [m for m in trainer["volumeMounts"] if m["name"] != "dshm"]
    # a CPU pod: no GPU, none of the GPU nodes' selector or tolerations
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_an_absolute_checkpoint_dir_is_read_where_the_trainer_wrote_it():
    job = job_of(checkpoint={"dir": "/runs/mt/ckpt"})
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--checkpoint") + 1] == "/runs/mt/ckpt"


def test_the_job_passes_the_jobs_pod_template_schema():
    # The JobSet CRD embeds batch/v1's JobTemplateSpec: the same schema the apiserver applies to a Job.
    template = jobset_schema()["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]["template"]
    job = job_of()
    assert schema_errors(template, {"spec": job["spec"]}) == []


@pytest.mark.parametrize("volumes, expected", [
    ([], "no volume has purpose: checkpoints"),
    ([{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints", "emptyDir": {}}], "is not a persistentVolumeClaim"),
])
def test_after_training_needs_the_checkpoints_on_a_claim(volumes, expected):
    with pytest.raises(ConfigError) as err:
        parse_spec({**copy.deepcopy(SPEC), "data": DATA, "nodes": 1, "volumes": volumes, "evaluation": AFTER})
    assert "evaluation.afterTraining" in str(err.value) and expected in str(err.value)


def test_an_absolute_checkpoint_dir_off_the_claim_is_refused():
    with pytest.raises(ConfigError, match="checkpoint.dir /elsewhere is not on a persistentVolumeClaim"):
        parse_spec({**copy.deepcopy(SPEC), "data": DATA, "nodes": 1, "checkpoint": {"dir": "/elsewhere"},
                    "evaluation": AFTER})


def test_the_averaged_model_needs_checkpoint_average():
    with pytest.raises(ConfigError, match="checkpoint.average is not set"):
        spec_with(evaluation={"afterTraining": {"checkpoint": "averaged"}})
    spec = spec_with(evaluation={"afterTraining": {"checkpoint": "averaged"}},
                     checkpoint={"keep": 3, "interval": 5, "average": {"last": 2}})
    assert spec.evaluation.after_training.checkpoint == "averaged"


# ------------------------------------------------------------------------------- status (pure)


def finished_job(condition: str, message: str = "") -> dict:
    return {"metadata": {"name": "mt-eval"}, "status": {
        "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T01:00:00Z",
        "conditions": [{"type": condition, "status": "True", "message": message}]}}


def pod_with(message: str) -> dict:
    return {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 0, "message": message}}}]}}


def test_the_termination_message_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSETTA_TERMINATION_LOG", str(tmp_path / "log"))
    final_result.report_evaluation({"rouge1": 41.234567, "rougeL": 38.1, "samples": 11490, "bleu": float("nan"),
                                    "langs": {"en": {}}}, checkpoint="step-00004000", step=4000)
    message = (tmp_path / "log").read_text()
    assert message.startswith("Evaluation: ")
    assert final_result.parse_evaluation(message) == {
        "rouge1": 41.2346, "rougeL": 38.1, "samples": 11490, "step": 4000, "checkpoint": "step-00004000"}
    assert final_result.parse_evaluation("Result: {}") is None
    assert final_result.parse_evaluation("Evaluation: [1]") is None


def test_a_succeeded_job_gives_its_scores():
    pod = pod_with('Evaluation: {"rougeL":38.1,"rouge1":41.2,"samples":20,"step":400,"checkpoint":"step-00000400"}')
    evaluation, cond = es.observe_evaluation(finished_job("Complete"), [pod], {"phase": "Running", "checkpoint": "best"})
    assert evaluation == {"phase": "Succeeded", "jobName": "mt-eval", "checkpoint": "best",
                          "checkpointPath": "step-00000400", "step": 400, "samples": 20, "rouge1": 41.2,
                          "rougeL": 38.1, "startTime": "2026-01-01T00:00:00Z",
                          "completionTime": "2026-01-01T01:00:00Z"}
    assert (cond.type, cond.status, cond.reason) == ("Evaluated", "True", "EvaluationSucceeded")
    assert "rouge1 41.2" in cond.message and "20 test pairs" in cond.message


def test_a_failed_job_says_why():
    evaluation, cond = es.observe_evaluation(finished_job("Failed", "Job has reached the specified backoff limit"),
                                             [], {"phase": "Running"})
    assert evaluation["phase"] == "Failed" and "backoff limit" in evaluation["message"]
    assert (cond.status, cond.reason) == ("False", "EvaluationFailed") and "kubectl logs job/mt-eval" in cond.message


def test_a_running_job():
    evaluation, cond = es.observe_evaluation({"metadata": {"name": "mt-eval"}, "status": {"active": 1}}, [], None)
    assert evaluation == {"phase": "Running", "jobName": "mt-eval"}
    assert cond.reason == "EvaluationRunning"


def test_the_jobs_first_event_says_which_checkpoint():
    # The Job's ADDED event may be handled before the status write that follows its creation.
    job = {**job_of(), "status": {}}
    evaluation, cond = es.observe_evaluation(job, [], None)
    assert evaluation == {"phase": "Pending", "jobName": "mt-eval", "checkpoint": "best"}
    assert cond.reason == "EvaluationPending"


# ------------------------------------------------------------------------------- handlers


def succeed_training(api, m):
    jobset = jobset_status(api, status={"conditions": [{"type": "Completed", "status": "True"}]})
    return jobset_event(api, m, jobset), jobset


def test_a_succeeded_training_gets_one_evaluation_job(api, jobs):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    assert jobs == {}  # nothing before the training succeeded
    tt, jobset = succeed_training(api, m)
    assert list(jobs) == ["mt-eval"]
    assert tt["status"]["phase"] == "Succeeded"  # the training's phase is the training's
    assert tt["status"]["evaluation"] == {"phase": "Pending", "jobName": "mt-eval", "checkpoint": "best"}
    assert condition(tt["status"], "Evaluated")["reason"] == "EvaluationPending"
    # another event, an operator restart: the status says it exists, no second create is tried
    jobset_event(api, memo(api), jobset)
    assert [c for c in api.calls if c[:2] == ("create", "jobs")] == [("create", "jobs", "mt-eval")]


def test_a_job_left_from_a_lost_status_write_is_adopted(api, jobs):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    # created, then the status write was lost
    jobs["mt-eval"] = {"metadata": {"name": "mt-eval", "ownerReferences": [{**OWNER, "controller": True}]}}
    tt, _ = succeed_training(api, m)
    assert list(jobs) == ["mt-eval"] and tt["status"]["evaluation"]["phase"] == "Pending"


def test_a_previous_trainings_job_is_not_adopted(api, jobs):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    jobs["mt-eval"] = {"metadata": {"name": "mt-eval", "ownerReferences": [{**OWNER, "uid": "uid-of-the-last-mt"}]}}
    jobset = jobset_status(api, status={"conditions": [{"type": "Completed", "status": "True"}]})
    with pytest.raises(kopf.TemporaryError, match="not this training's"):
        jobset_event(api, m, jobset)
    assert "evaluation" not in api.get("translationtrainings", NAME).get("status", {})


def test_no_job_without_after_training_or_before_success(api, jobs):
    m = memo(api)
    training(api)
    reconcile(api, m)
    succeed_training(api, m)
    assert jobs == {}
    assert not [c for c in api.calls if c[:2] == ("create", "jobs")]


def test_the_jobs_events_bring_the_scores_into_status(api, jobs, monkeypatch):
    m = memo(api)
    training(api, evaluation=AFTER, data=DATA)
    reconcile(api, m)
    succeed_training(api, m)
    job = {**jobs["mt-eval"], "status": {"active": 1}}
    job["metadata"] = {**job["metadata"], "namespace": NS}
    handlers.evaluation_changed(event={"type": "MODIFIED"}, body=kopf.Body(job), namespace=NS, memo=m)
    assert api.get("translationtrainings", NAME)["status"]["evaluation"]["phase"] == "Running"

    pod = pod_with('Evaluation: {"bleu":27.5,"chrf":55.0,"samples":100,"step":10,"checkpoint":"step-00000010"}')
    monkeypatch.setattr(api, "list_namespaced_pod", lambda namespace, label_selector="": SimpleNamespace(items=[pod]))
    done = {**job, "status": finished_job("Complete")["status"]}
    handlers.evaluation_changed(event={"type": "MODIFIED"}, body=kopf.Body(done), namespace=NS, memo=m)
    status = api.get("translationtrainings", NAME)["status"]
    assert status["phase"] == "Succeeded"
    assert {k: status["evaluation"][k] for k in ("phase", "bleu", "chrf", "samples", "step")} == {
        "phase": "Succeeded", "bleu": 27.5, "chrf": 55.0, "samples": 100, "step": 10}
    assert condition(status, "Evaluated")["status"] == "True"
