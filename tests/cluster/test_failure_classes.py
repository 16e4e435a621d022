"""Why an attempt ended, on real controllers: each failure class gets its reason in status.attempts
and in a Warning event, and its action: the deterministic ones fail the training at once (the
JobSet's fail-fast rule for the trainer's exit codes, the operator for what only the kubelet says),
the transient ones restart the gang.

kwok runs the pods until a test ends one (`end_pod`: exit code, termination message, the runtime's
reason) or evicts it; the Job controller's pod failure policy, the JobSet controller's failure
policy and the operator do the rest. An image that cannot be pulled needs a real kubelet: that one
is in test_real_pods.py.
"""

from __future__ import annotations

from test_lifecycle import small_training, start, uids, wait_running
from workloads import condition, jobset, provision, status

from controllers import NODE_POOLS
from rosetta_contract.failures import termination_message
from support.cluster import wait_for

WAIT = 90


def events(cluster, namespace: str, name: str, reason: str) -> list:
    return [e for e in cluster.core.list_namespaced_event(namespace).items
            if e.involved_object.name == name and e.reason == reason and e.type == "Warning"]


def failed_with(cluster, namespace: str, name: str, reason: str) -> dict:
    got = wait_for(lambda: (s := status(cluster, namespace, name)).get("phase") == "Failed" and s,
                   f"{name} Failed", WAIT)
    failed = condition(cluster, namespace, name, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", reason), failed
    return got


def test_cuda_out_of_memory_fails_the_jobset_at_once_by_its_own_rule(live_cluster, live_namespace, live_operator):
    ns = live_namespace
    pods = start(live_cluster, ns, "cuda-oom", max_restarts=3)
    live_cluster.end_pod(ns, pods[1].metadata.name, 80,
                         termination_message("CudaOutOfMemory", "CUDA out of memory. Tried to allocate 2.00 GiB"))
    got = failed_with(live_cluster, ns, "cuda-oom", "CudaOutOfMemory")
    # The JobSet controller failed it (the fail-fast rule), not the operator after a restart.
    js = wait_for(lambda: (j := jobset(live_cluster, ns, "cuda-oom")) and any(
        c["type"] == "Failed" and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or []) and j,
        "the JobSet Failed", WAIT)
    failed = next(c for c in js["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailJobSetFailurePolicyAction" and not js["spec"].get("suspend"), failed
    assert int(js["status"].get("restarts") or 0) == 0 and got.get("restarts", 0) == 0
    (attempt,) = got["attempts"]
    assert attempt["attempt"] == 0 and attempt["reason"] == "CudaOutOfMemory" and attempt["exitCode"] == 80
    assert attempt["pod"] == pods[1].metadata.name and attempt["nodeRank"] == 1 and attempt["node"]
    assert "Tried to allocate 2.00 GiB" in attempt["message"] and attempt["endTime"]
    assert "Tried to allocate" in got["message"]
    wait_for(lambda: events(live_cluster, ns, "cuda-oom", "CudaOutOfMemory"), "a CudaOutOfMemory event", WAIT)


def test_oomkilled_stops_the_gang_and_names_the_memory_limit(live_cluster, live_namespace, live_operator):
    ns = live_namespace
    pods = start(live_cluster, ns, "oom", max_restarts=3)
    live_cluster.end_pod(ns, pods[0].metadata.name, 137, reason="OOMKilled")
    got = failed_with(live_cluster, ns, "oom", "OOMKilled")
    attempt = next(a for a in got["attempts"] if a["attempt"] == 0)
    assert attempt["reason"] == "OOMKilled" and attempt["pod"] == pods[0].metadata.name
    assert "memory limit" in attempt["message"] and "spec.resources.memory" in attempt["message"]
    # No attempt runs on with the same memory: the JobSet is stopped.
    wait_for(lambda: jobset(live_cluster, ns, "oom")["spec"].get("suspend") is True
             or any(c["type"] == "Failed" and c["status"] == "True"
                    for c in (jobset(live_cluster, ns, "oom").get("status") or {}).get("conditions") or []),
             "the JobSet stopped", WAIT)
    wait_for(lambda: events(live_cluster, ns, "oom", "OOMKilled"), "an OOMKilled event", WAIT)


def test_transient_classes_restart_and_every_attempt_is_recorded(live_cluster, live_namespace, live_operator):
    """A collective timeout restarts (counted), a preemption restarts (free), OOMKilled restarts
    when the spec says so, and the last attempt succeeds: four attempts, each with its reason."""
    ns = live_namespace
    first = start(live_cluster, ns, "flaky", max_restarts=3)
    live_cluster.end_pod(ns, first[0].metadata.name, 75,
                         termination_message("CollectiveTimeout", "rank 1 did not join the all-reduce in 1800 s"))
    second = wait_running(live_cluster, ns, "flaky", exclude=uids(first))
    live_cluster.evict(ns, second[1].metadata.name)
    third = wait_running(live_cluster, ns, "flaky", exclude=uids(first) | uids(second))
    for pod in third:
        live_cluster.end_pod(ns, pod.metadata.name, 0)
    got = wait_for(lambda: (s := status(live_cluster, ns, "flaky")).get("phase") == "Succeeded"
                   and len(s.get("attempts") or []) == 3 and s, "Succeeded with three attempts", WAIT)
    reasons = [(a["attempt"], a["reason"]) for a in got["attempts"]]
    assert reasons == [(0, "CollectiveTimeout"), (1, "Preempted"), (2, "Succeeded")], got["attempts"]
    assert (got["restarts"], got["preemptions"]) == (1, 1)
    assert got["attempts"][0]["exitCode"] == 75 and got["attempts"][1]["pod"] == second[1].metadata.name
    assert all(a.get("endTime") for a in got["attempts"])
    assert events(live_cluster, ns, "flaky", "CollectiveTimeout") and events(live_cluster, ns, "flaky", "Preempted")


def start_with(cluster, namespace: str, name: str, max_restarts: int, **spec) -> list:
    """start(), with `spec` merged into the training's spec."""
    doc = small_training(namespace, name, max_restarts)
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    provision(cluster, namespace, doc)
    cluster.create_training(namespace, doc)
    return wait_running(cluster, namespace, name)


def test_a_spec_may_restart_on_oomkilled(live_cluster, live_namespace, live_operator):
    ns = live_namespace
    first = start_with(live_cluster, ns, "oom-retry", 2, failurePolicy={"actions": {"oomKilled": "Restart"}})
    live_cluster.end_pod(ns, first[1].metadata.name, 137, reason="OOMKilled")
    wait_running(live_cluster, ns, "oom-retry", exclude=uids(first))
    got = wait_for(lambda: (s := status(live_cluster, ns, "oom-retry")).get("restarts") == 1
                   and any(a.get("reason") == "OOMKilled" for a in s.get("attempts") or []) and s,
                   "restarted after OOMKilled", WAIT)
    assert got["phase"] in ("Running", "Restarting") and jobset(live_cluster, ns, "oom-retry")["spec"].get("suspend") is not True


def node_affinity_keeps_off(pod) -> set[str]:
    affinity = pod.spec.affinity
    terms = affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms \
        if affinity and affinity.node_affinity and affinity.node_affinity.required_during_scheduling_ignored_during_execution else []
    return {v for t in terms for f in t.match_fields or [] if f.key == "metadata.name" and f.operator == "NotIn"
            for v in f.values}


def test_a_node_that_fails_the_preflight_is_kept_out_of_the_next_attempts(live_cluster, live_namespace, live_operator):
    """The gang's pods wait behind the operator's gate, which it lifts at once; a pod that exits
    NodeUnhealthy gets its node excluded, and the restarted gang's pods are kept off it, up to
    maxExcludedNodes."""
    ns = live_namespace
    first = start_with(live_cluster, ns, "preflight", 3,
                       faultTolerance={"preflight": {"enabled": True, "maxExcludedNodes": 1}})
    assert all(not p.spec.scheduling_gates for p in first) and not any(map(node_affinity_keeps_off, first))
    bad = first[0]
    live_cluster.end_pod(ns, bad.metadata.name, 81,
                         termination_message("NodeUnhealthy", f"pre-flight on node {bad.spec.node_name}: GPU 0 "
                                                               "computed a wrong matmul"))
    second = wait_running(live_cluster, ns, "preflight", exclude=uids(first))
    assert all(node_affinity_keeps_off(p) == {bad.spec.node_name} for p in second)
    assert all(p.spec.node_name != bad.spec.node_name for p in second)
    got = wait_for(lambda: (s := status(live_cluster, ns, "preflight")).get("excludedNodes") and s,
                   "status.excludedNodes", WAIT)
    (excluded,) = got["excludedNodes"]
    assert (excluded["node"], excluded["reason"], excluded["attempt"]) == (bad.spec.node_name, "NodeUnhealthy", 0)
    assert got["attempts"][0]["reason"] == "NodeUnhealthy" and got["attempts"][0]["node"] == bad.spec.node_name
    wait_for(lambda: events(live_cluster, ns, "preflight", "NodeExcluded"), "a NodeExcluded event", WAIT)

    # Past maxExcludedNodes (1) a second bad node is recorded in its attempt, not excluded.
    other = second[0]
    live_cluster.end_pod(ns, other.metadata.name, 81, termination_message("NodeUnhealthy", "all-reduce too slow"))
    third = wait_running(live_cluster, ns, "preflight", exclude=uids(first) | uids(second))
    got = wait_for(lambda: (s := status(live_cluster, ns, "preflight")).get("restarts") == 2
                   and len(s.get("attempts") or []) >= 2 and s.get("attempts")[1].get("reason") and s,
                   "the second attempt's end recorded", WAIT)
    assert [e["node"] for e in got["excludedNodes"]] == [bad.spec.node_name]
    assert got["attempts"][1]["reason"] == "NodeUnhealthy"
    assert all(node_affinity_keeps_off(p) == {bad.spec.node_name} for p in third)


def test_a_node_that_goes_away_is_nodelost_and_restarts_for_free(live_cluster, live_namespace, live_operator):
    """The node object is deleted (a terminated instance): the pod garbage collector fails its pods
    with DisruptionTarget (DeletionByPodGC) after its quarantine, and the restart does not count."""
    ns = live_namespace
    (node,) = live_cluster.kwok.add_nodes(NODE_POOLS["cpu"])
    pods = start_with(live_cluster, ns, "lost", 1, scheduling={"nodeSelector": {"kubernetes.io/hostname": node}})
    assert {p.spec.node_name for p in pods} == {node}
    live_cluster.core.delete_node(node)
    got = wait_for(lambda: (s := status(live_cluster, ns, "lost")).get("attempts")
                   and s["attempts"][0].get("reason") and s, "attempt 0 ended", 180)
    first = got["attempts"][0]
    assert first["reason"] == "NodeLost" and first["node"] == node and "DeletionByPodGC" in first["message"], first
    got = wait_for(lambda: (s := status(live_cluster, ns, "lost")).get("preemptions") == 1 and s,
                   "a free restart", WAIT)
    assert got.get("restarts", 0) == 0 and got["phase"] != "Failed"
