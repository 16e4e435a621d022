"""Every object the operator renders is its template's output as it is (nothing edits it afterwards),
and every pod of a training (the gang's, the stage job's, the evaluation Job's) gets its shared parts
from one builder (pod_builder.py)."""

from __future__ import annotations

import copy

import pytest
from test_after_training_evaluation import AFTER, DATA
from test_staging_render import MODEL, MODELS

from rosetta_contract.spec import parse_spec
from rosetta_operator import evaluation_job, render
from rosetta_operator.names import STAGE_JOB
from support.handler_api import NAME, NS, SPEC

OWNER = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "name": NAME, "uid": "uid-mt"}
# Everything a pod shares with the training's others, set, and a stage job with a source to copy.
POD = {
    "serviceAccountName": "trainer", "imagePullSecrets": ["registry"], "imagePullPolicy": "Always",
    "podSecurity": {"runAsUser": 2000, "fsGroup": 3000},
    "scheduling": {"queueName": "team-a", "priorityClassName": "high", "nodeSelector": {"pool": "train"},
                   "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]},
    "env": [{"name": "MY_FLAG", "value": "1"}],
}
TRAINING = {**copy.deepcopy(SPEC), **POD, "volumes": [*SPEC["volumes"], MODELS], "model": MODEL, "data": DATA,
            "evaluation": AFTER, "faultTolerance": {"preflight": {"enabled": True}}}
TRAINING.pop("tokenizer", None)
EVALUATE = {**POD, "mode": "evaluate", "model": MODEL, "volumes": [*SPEC["volumes"], MODELS],
            "data": {**DATA, "train": []}, "gpusPerNode": 1}
# What every pod of a training takes from the pod builder, the same in each.
SHARED_POD_FIELDS = ("serviceAccountName", "automountServiceAccountToken", "imagePullSecrets", "securityContext",
                     "enableServiceLinks", "restartPolicy")
SHARED_CONTAINER_FIELDS = ("image", "imagePullPolicy", "securityContext", "terminationMessagePolicy")


@pytest.fixture
def template_outputs(monkeypatch):
    """Each template's output as rendered, with a copy of it taken before anyone else held it."""
    outputs: list[tuple[str, dict, dict]] = []
    for module in (render, evaluation_job):
        original = module.render_template

        def spy(template, _original=original, **context):
            out = _original(template, **context)
            outputs.append((template, out, copy.deepcopy(out)))
            return out

        monkeypatch.setattr(module, "render_template", spy)
    return outputs


def assert_unedited(obj: dict, outputs: list[tuple[str, dict, dict]], template: str) -> None:
    (rendered, before), = [(out, copy_) for name, out, copy_ in outputs if name == template]
    assert obj is rendered, f"{template}: the object returned is not the template's output"
    assert obj == before, f"{template}: its output was edited after rendering"


def test_the_configmap_and_jobset_are_their_templates_output_unedited(template_outputs):
    rendered = render.render(NAME, NS, parse_spec(TRAINING), OWNER)
    assert_unedited(rendered.configmap, template_outputs, "configmap.yaml.j2")
    assert_unedited(rendered.jobset, template_outputs, "jobset.yaml.j2")
    stage, gang = rendered.jobset["spec"]["replicatedJobs"]
    # What the post-render edits once added, now from the template itself.
    assert stage["name"] == STAGE_JOB and gang["dependsOn"] == [{"name": STAGE_JOB, "status": "Complete"}]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in gang["template"]["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("raw", [TRAINING, EVALUATE], ids=["after-training", "mode-evaluate"])
def test_the_evaluation_job_is_its_templates_output_unedited(template_outputs, raw):
    job = evaluation_job.render_evaluation_job(NAME, NS, parse_spec(raw), OWNER)
    assert_unedited(job, template_outputs, "evaluation-job.yaml.j2")
    queued = raw.get("mode") == "evaluate"  # only mode evaluate's Job is queued
    assert job["spec"].get("suspend", False) is queued
    assert ("kueue.x-k8s.io/queue-name" in job["metadata"]["labels"]) is queued
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]


def pods_of(raw: dict) -> dict[str, dict]:
    spec = parse_spec(raw)
    pods = {}
    if spec.mode == "train":
        for job in render.render(NAME, NS, spec, OWNER).jobset["spec"]["replicatedJobs"]:
            pods[job["name"]] = job["template"]["spec"]["template"]["spec"]
    eval_pod = evaluation_job.render_evaluation_job(NAME, NS, spec, OWNER)["spec"]["template"]["spec"]
    pods["evaluate"] = eval_pod
    for init in eval_pod.get("initContainers", []):
        pods[f"evaluate/{init['name']}"] = {**eval_pod, "containers": [init]}
    return pods


@pytest.mark.parametrize("raw", [TRAINING, EVALUATE], ids=["training", "mode-evaluate"])
def test_every_pod_takes_its_shared_parts_from_one_builder(raw):
    pods = pods_of(raw)
    assert len(pods) >= 2, list(pods)
    for field in SHARED_POD_FIELDS:
        values = {name: pod.get(field) for name, pod in pods.items()}
        assert len({repr(v) for v in values.values()}) == 1, (field, values)
    for field in SHARED_CONTAINER_FIELDS:
        values = {name: pod["containers"][0].get(field) for name, pod in pods.items()}
        assert len({repr(v) for v in values.values()}) == 1, (field, values)
    assert all(pod["securityContext"]["runAsUser"] == 2000 for pod in pods.values())
    for name, pod in pods.items():
        # The user's env comes last in every container, as the builder has it.
        env = [e["name"] for e in pod["containers"][0]["env"]]
        assert env[env.index("MY_FLAG") + 1:] in ([], ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"]), (name, env)
        # /dev/shm is the gang's alone; every other volume every pod has.
        mounts = {m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert ("dshm" in mounts) is (name == "node"), name
