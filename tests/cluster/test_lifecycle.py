"""A training's life on real controllers: its pods end, fail, are evicted; the JobSet controller
restarts the gang or gives up, and the operator says what happened.

Pods are ended by the test (kwok runs them until told: `end_pod`), evicted through the eviction API
(which sets the DisruptionTarget condition, as a drain, a spot reclaim or a preemption does), and
everything else is the Job controller, the JobSet controller and the operator."""

from __future__ import annotations

from pathlib import Path

from workloads import condition, in_namespace, jobset, provision, running_pods, status, training_doc

from rosetta_operator.conditions import Reason
from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
WAIT = 90


def small_training(namespace: str, name: str, max_restarts: int = 1) -> dict:
    """quickstart-cpu on the simulated CPU nodes: two pods, `max_restarts` gang restarts. Its
    checkpoints claim must exist first (`provision`)."""
    doc = in_namespace(training_doc(QUICKSTART), namespace, name)
    doc["spec"]["failurePolicy"] = {"maxRestarts": max_restarts}
    return doc


def start(cluster, namespace: str, name: str, **kwargs) -> list:
    doc = small_training(namespace, name, **kwargs)
    provision(cluster, namespace, doc)
    cluster.create_training(namespace, doc)
    return wait_running(cluster, namespace, name)


def wait_running(cluster, namespace: str, name: str, exclude: set[str] = frozenset()) -> list:
    """Both pods Running (none of `exclude`, the uids of an earlier gang) and the training Running."""
    pods = wait_for(lambda: (p := [x for x in running_pods(cluster, namespace, name) if x.metadata.uid not in exclude])
                    and len(p) == 2 and p, f"2 running pods of {name}", WAIT)
    wait_for(lambda: status(cluster, namespace, name).get("phase") == "Running", f"{name} Running", WAIT)
    return pods


def uids(pods) -> set[str]:
    return {p.metadata.uid for p in pods}


def test_all_pods_succeed_then_training_succeeds(live_cluster, live_namespace, live_operator):
    pods = start(live_cluster, live_namespace, "ok")
    running = status(live_cluster, live_namespace, "ok")
    assert running["startTime"] and "completionTime" not in running
    assert condition(live_cluster, live_namespace, "ok", "Running")["reason"] == Reason.ALL_JOBS_READY
    for pod in pods:
        live_cluster.end_pod(live_namespace, pod.metadata.name, 0)
    got = wait_for(lambda: (s := status(live_cluster, live_namespace, "ok")).get("phase") == "Succeeded" and s,
                   "training Succeeded", WAIT)
    assert got.get("restarts", 0) == 0
    assert got["completionTime"] >= got["startTime"]
    assert condition(live_cluster, live_namespace, "ok", "Succeeded")["status"] == "True"
    assert condition(live_cluster, live_namespace, "ok", "Running")["status"] == "False"


def test_failed_pod_restarts_the_gang_until_max_restarts(live_cluster, live_namespace, live_operator):
    first = start(live_cluster, live_namespace, "crash", max_restarts=1)
    live_cluster.end_pod(live_namespace, first[0].metadata.name, 1)

    # The JobSet controller recreates the whole gang: new pods, counted as a failure.
    second = wait_running(live_cluster, live_namespace, "crash", exclude=uids(first))
    got = wait_for(lambda: (s := status(live_cluster, live_namespace, "crash")).get("restarts") == 1 and s,
                   "status.restarts == 1", WAIT)
    assert got.get("preemptions", 0) == 0

    # Past maxRestarts: Failed, with the JobSet controller's reason.
    live_cluster.end_pod(live_namespace, second[1].metadata.name, 1)
    got = wait_for(lambda: (s := status(live_cluster, live_namespace, "crash")).get("phase") == "Failed" and s,
                   "training Failed", WAIT)
    failed = condition(live_cluster, live_namespace, "crash", "Failed")
    assert (failed["status"], failed["reason"]) == ("True", Reason.JOBSET_FAILED)
    assert got["completionTime"]
    assert "ReachedMaxRestarts" in got["message"] or "ReachedMaxRestarts" in failed["message"], got


def test_evictions_restart_the_gang_without_using_up_max_restarts(live_cluster, live_namespace, live_operator):
    gang = start(live_cluster, live_namespace, "spot", max_restarts=1)
    # Three spot reclaims: more than maxRestarts, and the training must survive every one.
    for n in range(1, 4):
        live_cluster.evict(live_namespace, gang[0].metadata.name)
        gang = wait_running(live_cluster, live_namespace, "spot", exclude=uids(gang))
        got = wait_for(lambda: (s := status(live_cluster, live_namespace, "spot")).get("preemptions") == n and s,
                       f"status.preemptions == {n}", WAIT)
        assert got.get("restarts", 0) == 0, got
    js = jobset(live_cluster, live_namespace, "spot")
    assert js["status"]["restarts"] == 3 and js["status"].get("restartsCountTowardsMax", 0) == 0

    # A real failure still counts.
    live_cluster.end_pod(live_namespace, gang[0].metadata.name, 1)
    wait_running(live_cluster, live_namespace, "spot", exclude=uids(gang))
    got = wait_for(lambda: (s := status(live_cluster, live_namespace, "spot")).get("restarts") == 1 and s,
                   "status.restarts == 1 after a crash", WAIT)
    assert got["preemptions"] == 3


def test_deleting_a_training_removes_everything_it_made(live_cluster, live_namespace, live_operator):
    start(live_cluster, live_namespace, "gc")
    ns = live_namespace
    assert live_cluster.configmaps(ns) and live_cluster.jobsets(ns)
    live_cluster.custom.delete_namespaced_custom_object("rosetta.dev", "v1alpha1", ns, "translationtrainings", "gc")

    def gone() -> bool:
        import kubernetes
        jobs = kubernetes.client.BatchV1Api(live_cluster.api).list_namespaced_job(ns).items
        return not (live_cluster.trainings(ns) or live_cluster.jobsets(ns) or jobs
                    or live_cluster.pods(ns) or live_cluster.configmaps(ns))
    # The garbage collector follows ownerReferences: training → JobSet → Jobs → pods, → ConfigMap.
    wait_for(gone, "the training, its JobSet, Jobs, pods and ConfigMap to be gone", WAIT)
