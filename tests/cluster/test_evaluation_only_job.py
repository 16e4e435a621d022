"""spec.mode: evaluate on real controllers: the operator creates the evaluation Job and no JobSet,
the Job's pod runs on a node with the GPU it asks for, and when it ends with `rosetta evaluate`'s
termination message the scores reach status.evaluation and the training's phase follows the Job."""

from __future__ import annotations

from pathlib import Path

import kubernetes
from workloads import condition, in_namespace, jobset, provision, status, training_doc

from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "flan-t5-xl-gender-eval.yaml"
WAIT = 90
MESSAGE = 'Evaluation: {"bleu":21.5,"chrf":48.25,"samples":11000,"checkpoint":"flan-t5-xl"}'


def eval_pods(cluster, ns: str, name: str, phase: str) -> list:
    return [p for p in cluster.core.list_namespaced_pod(ns, label_selector=f"job-name={name}-eval").items
            if p.status.phase == phase and not p.metadata.deletion_timestamp]


def test_an_evaluation_only_run_is_one_job_whose_end_is_the_runs_end(live_cluster, live_namespace, live_operator):
    ns, name = live_namespace, "gender-eval"
    doc = in_namespace(training_doc(EXAMPLE), ns, name)
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)

    batch = kubernetes.client.BatchV1Api(live_cluster.api)
    jobs = wait_for(lambda: (j := batch.list_namespaced_job(ns, label_selector=f"rosetta.dev/evaluation={name}").items)
                    and j, "the evaluation Job", WAIT)
    assert [j.metadata.name for j in jobs] == [f"{name}-eval"]
    assert jobs[0].metadata.owner_references[0].name == name
    pod = wait_for(lambda: (p := eval_pods(live_cluster, ns, name, "Running")) and p[0], "the evaluation pod", WAIT)
    (container,) = pod.spec.containers
    assert int(container.resources.limits["nvidia.com/gpu"]) == 1
    assert container.command[3:4] == ["evaluate"] and "--checkpoint" not in container.command
    got = wait_for(lambda: (s := status(live_cluster, ns, name)).get("phase") == "Running" and s, "Running", WAIT)
    assert got["evaluation"]["checkpoint"] == "pretrained" and "jobSetName" not in got
    assert jobset(live_cluster, ns, name) is None

    live_cluster.end_pod(ns, pod.metadata.name, 0, MESSAGE)
    done = wait_for(lambda: (s := status(live_cluster, ns, name)).get("phase") == "Succeeded" and s,
                    "Succeeded", WAIT)
    assert done["evaluation"]["phase"] == "Succeeded"
    assert (done["evaluation"]["bleu"], done["evaluation"]["samples"]) == (21.5, 11000)
    assert condition(live_cluster, ns, name, "Evaluated")["status"] == "True"
    assert jobset(live_cluster, ns, name) is None


def test_a_failed_evaluation_fails_the_run(live_cluster, live_namespace, live_operator):
    ns, name = live_namespace, "failed-eval"
    doc = in_namespace(training_doc(EXAMPLE), ns, name)
    provision(live_cluster, ns, doc)
    live_cluster.create_training(ns, doc)
    # backoffLimit 1: the first failure is retried once
    ended: set[str] = set()
    for attempt in range(2):
        pod = wait_for(lambda: (p := [x for x in eval_pods(live_cluster, ns, name, "Running")
                                      if x.metadata.name not in ended]) and p[0],
                       f"evaluation pod, attempt {attempt}", WAIT)
        live_cluster.end_pod(ns, pod.metadata.name, 1)
        ended.add(pod.metadata.name)
    done = wait_for(lambda: (s := status(live_cluster, ns, name)).get("phase") == "Failed" and s, "Failed", WAIT)
    assert done["evaluation"]["phase"] == "Failed"
