"""spec.mode: evaluate: a pretrained model on the test sets, no training. The spec rules, the one
Job it renders (no JobSet), and the operator creating it and following it into the phase (an
in-memory API)."""

from __future__ import annotations

import copy

import kopf
import pytest
import yaml
from test_after_training_evaluation import OWNER, finished_job, pod_with

from rosetta_contract.config import TrainerSpec
from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator import handlers
from rosetta_operator.conditions import condition
from rosetta_operator.evaluation_job import EVALUATION_LABEL, render_evaluation_job
from support.handler_api import NAME, NS, UID, memo, reconcile
from support.openapi_check import jobset_schema, schema_errors

MTGENEVAL = [{"format": "mtgeneval", "path": f"/data/mt-geneval/{lang}", "targetLang": lang} for lang in ("de", "fr")]
EVALUATE = {
    "mode": "evaluate",
    "model": {"name": "/models/flan-t5-small"},
    "data": {"sourceLang": "en", "targetLangs": ["de", "fr"], "test": MTGENEVAL},
    "evaluation": {"metrics": ["bleu", "chrf", "gender"]},
}


def spec_with(**patch):
    return parse_spec({**copy.deepcopy(EVALUATE), **patch})


def job_of(**patch) -> dict:
    return render_evaluation_job(NAME, NS, spec_with(**patch), owner=OWNER)


# ------------------------------------------------------------------------------- spec rules


def test_evaluate_mode_needs_no_training_section():
    spec = spec_with()
    assert spec.mode == "evaluate" and spec.training.max_steps is None
    assert TrainerSpec.model_validate(EVALUATE).uses_task_prefix()  # two targets: task prefixes


def test_train_mode_still_needs_training():
    with pytest.raises(ConfigError, match="training"):
        spec_with(mode="train")


@pytest.mark.parametrize("patch, message", [
    ({"model": {"architecture": "transformer", "size": "tiny"}, "tokenizer": {"path": "/tok"}}, "set model.name"),
    ({"data": {"sourceLang": "en", "targetLangs": ["de"], "test": []}}, "data.test is empty"),
])
def test_evaluate_mode_needs_a_pretrained_model_and_test_data(patch, message):
    with pytest.raises(ConfigError, match=message):
        spec_with(**patch)


# ------------------------------------------------------------------------------- render


def test_the_job_evaluates_the_pretrained_model_on_the_cpu():
    job = job_of(resources={"cpu": "8", "memory": "32Gi"})
    assert job["metadata"]["labels"][EVALUATION_LABEL] == NAME
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", "rosetta_trainer", "evaluate", "-f", "/etc/rosetta/training.yaml",
                            "--device", "cpu", "--split", "test", "--output", "/checkpoints/mt/evaluation"]
    assert "--checkpoint" not in c["command"]
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in c["env"]
    assert {"name": "OMP_NUM_THREADS", "value": "8"} in c["env"]


def test_gpus_per_node_gives_the_job_its_gpus_and_placement():
    job = job_of(gpusPerNode=1, scheduling={"nodeSelector": {"gpu": "h100"}})
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--device" in c["command"] and c["command"][c["command"].index("--device") + 1] == "cuda"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # strings: BatchV1Api validates quantities
    assert not any(e["name"] == "CUDA_VISIBLE_DEVICES" for e in c["env"])
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    # The JobSet CRD embeds batch/v1's JobTemplateSpec: the same schema the apiserver applies to a Job.
    template = jobset_schema()["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]["template"]
    assert schema_errors(template, {"spec": job["spec"]}) == []


# ------------------------------------------------------------------------------- handlers


def evaluate_training(api) -> None:
    api.put("translationtrainings", {
        "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
        "spec": {**copy.deepcopy(EVALUATE), "image": "rosetta:test"}})


def job_event(api, m, job: dict) -> dict:
    handlers.evaluation_changed(event={"type": "MODIFIED"}, body=kopf.Body(job), namespace=NS, memo=m)
    return api.get("translationtrainings", NAME)


def test_the_operator_creates_the_job_and_no_jobset(api, jobs):
    m = memo(api)
    evaluate_training(api)
    tt = reconcile(api, m)
    assert list(jobs) == ["mt-eval"]
    creates = [c[1] for c in api.calls if c[0] == "create"]
    assert "configmaps" in creates and "jobsets" not in creates
    status = tt["status"]
    assert status["phase"] == "Pending" and "jobSetName" not in status
    assert status["evaluation"] == {"phase": "Pending", "jobName": "mt-eval", "checkpoint": "pretrained"}
    assert condition(status, "Created")["reason"] == "EvaluationJobCreated"
    # a restart of the operator: the Job exists (409) and is ours
    reconcile(api, memo(api))
    assert list(jobs) == ["mt-eval"]


def test_the_phase_follows_the_job(api, jobs, monkeypatch):
    m = memo(api)
    evaluate_training(api)
    reconcile(api, m)
    job = copy.deepcopy(jobs["mt-eval"])
    tt = job_event(api, m, {**job, "status": {"active": 1, "startTime": "2026-01-01T00:00:00Z"}})
    assert tt["status"]["phase"] == "Running" and tt["status"]["evaluation"]["phase"] == "Running"
    pod = pod_with('Evaluation: {"bleu":31.5,"chrf":58.2,"samples":40,"checkpoint":"flan-t5-small"}')
    monkeypatch.setattr(api, "list_namespaced_pod", lambda namespace, label_selector: type("L", (), {"items": [pod]}),
                        raising=False)
    done = {**job, **finished_job("Complete")}
    done["metadata"] = job["metadata"]
    tt = job_event(api, m, done)
    assert tt["status"]["phase"] == "Succeeded"
    assert tt["status"]["evaluation"]["bleu"] == 31.5 and tt["status"]["evaluation"]["phase"] == "Succeeded"


def test_a_failed_job_fails_the_run(api, jobs):
    m = memo(api)
    evaluate_training(api)
    reconcile(api, m)
    failed = {**finished_job("Failed", "BackoffLimitExceeded"), "metadata": jobs["mt-eval"]["metadata"]}
    tt = job_event(api, m, failed)
    assert tt["status"]["phase"] == "Failed" and tt["status"]["evaluation"]["phase"] == "Failed"


def test_train_refuses_an_evaluate_mode_file(tmp_path):
    from rosetta_contract.strict_model import ConfigError as TrainerConfigError
    from rosetta_trainer.commands.train import train_from_file

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
                                    "metadata": {"name": "eval"}, "spec": EVALUATE}))
    with pytest.raises(TrainerConfigError, match="rosetta evaluate -f"):
        train_from_file(str(path), str(tmp_path / "out"), progress=False)


def test_a_finished_evaluation_is_not_run_again(api, jobs):
    m = memo(api)
    evaluate_training(api)
    reconcile(api, m)
    failed = {**finished_job("Failed", "BackoffLimitExceeded"), "metadata": jobs["mt-eval"]["metadata"]}
    job_event(api, m, failed)
    jobs.clear()  # deleted by hand, or by a TTL
    tt = reconcile(api, memo(api))  # an operator restart
    assert jobs == {} and tt["status"]["phase"] == "Failed"
