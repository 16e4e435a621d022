"""api_calls.end_attempt on a real kube-apiserver: a stalled attempt's Job gets a deadline that has
passed, and only that Job: the uid the stalled pod names is a precondition the apiserver enforces, so
a newer Job of the same name (the JobSet names a restarted gang's Job as before) is left alone."""

from __future__ import annotations

import kubernetes
import pytest

from rosetta_operator.api_calls import end_attempt
from support.cluster import wait_for

pytestmark = pytest.mark.integration


def gang_job(cluster, namespace: str) -> dict:
    job = {"metadata": {"name": "mt-node-0"},
           # Suspended: no pod, nothing for the Job controller to do but keep it.
           "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "trainer", "image": "busybox", "command": ["true"]}]}}}}
    return cluster.api.sanitize_for_serialization(
        kubernetes.client.BatchV1Api(cluster.api).create_namespaced_job(namespace, job))


def pod_of(job: dict) -> dict:
    return {"metadata": {"name": "mt-node-0-0-abcde", "ownerReferences": [
        {"kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"]}]}}


def deadline(cluster, namespace: str) -> int | None:
    return kubernetes.client.BatchV1Api(cluster.api).read_namespaced_job("mt-node-0", namespace).spec.active_deadline_seconds


def test_the_stalled_attempts_job_and_no_other(cluster, namespace):
    batch = kubernetes.client.BatchV1Api(cluster.api)
    old = gang_job(cluster, namespace)
    stalled = pod_of(old)
    batch.delete_namespaced_job("mt-node-0", namespace, propagation_policy="Background")
    wait_for(lambda: not batch.list_namespaced_job(namespace).items, "the old Job to be gone")
    new = gang_job(cluster, namespace)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]

    assert end_attempt(cluster.api, namespace, stalled) is False  # the old attempt's: refused by its uid
    assert deadline(cluster, namespace) is None
    assert end_attempt(cluster.api, namespace, pod_of(new)) is True
    assert deadline(cluster, namespace) == 1
