"""model.source / data.source on real controllers: the JobSet controller starts the gang only after
the stage job completed (dependsOn), the operator says the training is staging meanwhile, and a
stage pod that reports a missing source fails the training with DataInvalid, without a restart."""

from __future__ import annotations

from pathlib import Path

from workloads import condition, in_namespace, jobset, provision, running_pods, status, training_doc

from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
WAIT = 90
STAGE = "jobset.sigs.k8s.io/replicatedjob-name"


def staged_doc(ns: str, name: str) -> dict:
    doc = in_namespace(training_doc(QUICKSTART), ns, name)
    spec = doc["spec"]
    spec["model"] = {"name": "/checkpoints/models/t5-small", "source": {"uri": "s3://weights/t5-small"}}
    spec.pop("tokenizer", None)
    spec["data"]["source"] = {"uri": "hf://datasets/wmt/wmt16@main", "path": "/checkpoints/corpora/wmt16"}
    return doc


def pods_of(cluster, ns: str, name: str, job: str) -> list:
    return [p for p in running_pods(cluster, ns, name) if p.metadata.labels.get(STAGE) == job]


def apply_staged(cluster, ns: str, name: str, **spec) -> None:
    doc = staged_doc(ns, name)
    doc["spec"].update(spec)
    if doc["spec"].get("mode") == "evaluate":
        doc["spec"].pop("training", None)
    provision(cluster, ns, doc)
    cluster.create_training(ns, doc)


def running_stage_pod(cluster, ns: str, name: str):
    (stage,) = wait_for(lambda: pods_of(cluster, ns, name, "stage"), "the stage pod running", WAIT)
    return stage


def test_the_gang_starts_only_after_the_stage_job_completed(live_cluster, live_namespace, live_operator):
    ns, name = live_namespace, "staged"
    apply_staged(live_cluster, ns, name)
    stage = running_stage_pod(live_cluster, ns, name)
    assert stage.spec.containers[0].command[3] == "stage"
    got = wait_for(lambda: (s := status(live_cluster, ns, name)).get("message", "").startswith("staging") and s,
                   "status saying it is staging", WAIT)
    assert got["phase"] == "Pending"
    # The JobSet controller holds the gang back: no node Job while the stage job runs.
    js = jobset(live_cluster, ns, name)
    assert [r["name"] for r in js["status"].get("replicatedJobsStatus", []) if r.get("active")] == ["stage"]
    assert pods_of(live_cluster, ns, name, "node") == []

    live_cluster.end_pod(ns, stage.metadata.name, 0)
    gang = wait_for(lambda: (p := pods_of(live_cluster, ns, name, "node")) and len(p) == 2 and p,
                    "2 gang pods running after staging", WAIT)
    env = {e.name: e.value for e in gang[0].spec.containers[0].env}
    assert env["HF_HUB_OFFLINE"] == "1"
    wait_for(lambda: status(live_cluster, ns, name).get("phase") == "Running", "Running", WAIT)
    for pod in gang:
        live_cluster.end_pod(ns, pod.metadata.name, 0)
    wait_for(lambda: status(live_cluster, ns, name).get("phase") == "Succeeded", "Succeeded", WAIT)


def test_a_missing_source_fails_the_training_without_starting_the_gang(live_cluster, live_namespace, live_operator):
    ns, name = live_namespace, "unstaged"
    apply_staged(live_cluster, ns, name)
    stage = running_stage_pod(live_cluster, ns, name)
    # What `rosetta stage` leaves when the prefix is empty: the data-error exit and message.
    live_cluster.end_pod(ns, stage.metadata.name, 65, "DataInvalid: s3://weights/t5-small: no objects under this prefix")

    got = wait_for(lambda: (s := status(live_cluster, ns, name)).get("phase") == "Failed" and s, "Failed", WAIT)
    cond = condition(live_cluster, ns, name, "DataInvalid")
    assert cond and cond["status"] == "True" and "no objects under this prefix" in cond["message"]
    assert "no objects under this prefix" in got["message"]
    assert not got.get("restarts")
    assert [p for p in live_cluster.pods(ns, name) if p.metadata.labels.get(STAGE) == "node"] == []


def test_in_mode_evaluate_the_evaluation_pod_stages_in_an_init_container(live_cluster, live_namespace,
                                                                         live_operator):
    ns, name = live_namespace, "evaluate-staged"
    apply_staged(live_cluster, ns, name, mode="evaluate")
    # Accepted by the apiserver and placed by the scheduler (kwok's stages here do not play init
    # containers through, so the pod stays in its init phase).
    pod = wait_for(lambda: (p := [x for x in live_cluster.core.list_namespaced_pod(
        ns, label_selector=f"job-name={name}-eval").items if x.spec.node_name]) and p[0],
        "the evaluation pod scheduled", WAIT)
    (init,) = pod.spec.init_containers
    assert init.name == "stage" and init.command[3] == "stage"
    assert {e.name: e.value for e in pod.spec.containers[0].env}["HF_HUB_OFFLINE"] == "1"
    assert jobset(live_cluster, ns, name) is None
    got = wait_for(lambda: (s := status(live_cluster, ns, name)).get("evaluation", {}).get("phase") == "Running" and s,
                   "the evaluation Running", WAIT)
    assert got["evaluation"]["jobName"] == f"{name}-eval"
