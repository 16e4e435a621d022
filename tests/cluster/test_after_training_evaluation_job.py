"""evaluation.afterTraining on real controllers: the gang's pods succeed, the operator creates the
CPU evaluation Job once, its pod ends with `rosetta evaluate`'s termination message, and the
scores reach status.evaluation while the training stays Succeeded."""

from __future__ import annotations

from pathlib import Path

import kubernetes
from workloads import condition, in_namespace, provision, running_pods, status, training_doc

from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
WAIT = 90
MESSAGE = 'Evaluation: {"bleu":12.5,"chrf":40.25,"samples":40,"step":200,"checkpoint":"step-00000200"}'


def test_a_succeeded_training_is_evaluated_on_cpu_once(live_cluster, live_namespace, live_operator):
    ns, name = live_namespace, "evaluated"
    doc = in_namespace(training_doc(QUICKSTART), ns, name)
    doc["spec"]["evaluation"] = {**doc["spec"].get("evaluation", {}),
                                 "afterTraining": {"checkpoint": "final", "cpu": 1, "memory": "1Gi"}}
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)
    pods = wait_for(lambda: (p := running_pods(live_cluster, ns, name)) and len(p) == 2 and p,
                    "2 running pods", WAIT)
    batch = kubernetes.client.BatchV1Api(live_cluster.api)
    assert batch.list_namespaced_job(ns, label_selector=f"rosetta.dev/evaluation={name}").items == []
    for pod in pods:
        live_cluster.end_pod(ns, pod.metadata.name, 0)

    job = wait_for(lambda: (j := batch.list_namespaced_job(ns, label_selector=f"rosetta.dev/evaluation={name}").items)
                   and j, "the evaluation Job", WAIT)
    assert [j.metadata.name for j in job] == [f"{name}-eval"]
    assert job[0].metadata.owner_references[0].name == name
    got = wait_for(lambda: (s := status(live_cluster, ns, name)).get("phase") == "Succeeded"
                   and (s.get("evaluation") or {}).get("phase") in ("Pending", "Running") and s,
                   "training Succeeded, evaluation started", WAIT)
    assert got["evaluation"]["jobName"] == f"{name}-eval" and got["evaluation"]["checkpoint"] == "final"

    eval_pod = wait_for(lambda: (p := [x for x in live_cluster.core.list_namespaced_pod(
        ns, label_selector=f"job-name={name}-eval").items if x.status.phase == "Running"]) and p[0],
        "the evaluation pod running", WAIT)
    (container,) = eval_pod.spec.containers
    assert "nvidia.com/gpu" not in (container.resources.limits or {})
    assert container.command[3:4] == ["evaluate"] and "--device" in container.command
    live_cluster.end_pod(ns, eval_pod.metadata.name, 0, MESSAGE)

    done = wait_for(lambda: (s := status(live_cluster, ns, name)).get("evaluation", {}).get("phase") == "Succeeded"
                    and s, "evaluation Succeeded", WAIT)
    assert done["phase"] == "Succeeded"
    assert {k: done["evaluation"].get(k) for k in ("bleu", "chrf", "samples", "step", "checkpointPath")} == {
        "bleu": 12.5, "chrf": 40.25, "samples": 40, "step": 200, "checkpointPath": "step-00000200"}
    assert condition(live_cluster, ns, name, "Evaluated")["status"] == "True"

    # an operator restart replays every JobSet: still one Job
    live_operator.restart()
    wait_for(lambda: status(live_cluster, ns, name).get("phase") == "Succeeded", "status after restart", WAIT)
    assert len(batch.list_namespaced_job(ns, label_selector=f"rosetta.dev/evaluation={name}").items) == 1
