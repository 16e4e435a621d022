"""What one training costs the operator in API requests, counted on a real kube-apiserver.

API calls are the operator's cost per training (the apiserver spends as much CPU on them as the
operator does), so this pins the budget for a training's create → JobSet → first status → Running.
The operator runs in this process (tests/conftest.py), so the count is taken where its requests
leave: `kubernetes.client.ApiClient.call_api`, one call per HTTP request, for every client except
the test's own (`cluster.api`), in the test's namespace only (the operator watches all
namespaces, and another test's leftovers may still be on their way out). kopf's own requests
(watches, its annotation and finalizer patches, events) go through aiohttp and are not counted:
they are kopf's, not the handlers'.

No JobSet controller runs here: the test plays it by patching the JobSet's status.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import kubernetes
import pytest
import yaml

from rosetta_contract.resource import Phase
from rosetta_operator import handlers
from support.cluster import REPO, Cluster, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "rosetta.dev", "v1alpha1", "translationtrainings"
JS_GROUP, JS_VERSION, JS_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())

# create → JobSet → first status: GET JobSet (absent), POST ConfigMap, POST JobSet, PATCH status
# (on kopf's body of the training). The JobSet's ADDED event costs nothing: it is the object
# reconcile just wrote the status from (event_memory.OwnCreations). The code before this budget made
# 13 or 14 requests, and 5 before the ADDED event was skipped.
CREATE_BUDGET = 4
# → Running: the JobSet event's GET training + PATCH status, and the progress daemon's first round
# (GET training, LIST pods: no rank 0 pod here).
RUNNING_BUDGET = 4
# A status writer that loses a resourceVersion race legitimately pays again: the 409'd PATCH,
# a fresh GET of the training and of the JobSet, the PATCH; and the winner patched too.
PER_CONFLICT = 4
# Long enough for a progress daemon to start and make its first round (it runs at once).
SETTLE = 2.0
# How late the JobSet POST's response reaches the operator. Under load the watch delivers the
# JobSet's ADDED event before it; the test makes that the rule rather than the exception.
SLOW_POST = 1.0


class RequestCounter:
    """Requests of every kubernetes ApiClient but `ignore`, by (verb, resource), in one namespace."""

    def __init__(self, namespace: str, ignore: kubernetes.client.ApiClient):
        self.prefix = f"/namespaces/{namespace}/"
        self.ignore = ignore
        self.lock = threading.Lock()
        self.calls: Counter = Counter()
        self.conflicts = 0
        self.clients: set[int] = set()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = kubernetes.client.ApiClient.call_api
        counter = self

        def call_api(client, method, url, *args, **kwargs):
            response = original(client, method, url, *args, **kwargs)
            if client is not counter.ignore:
                counter.record(client, method, url, response.status)
            return response

        monkeypatch.setattr(kubernetes.client.ApiClient, "call_api", call_api)

    def record(self, client: kubernetes.client.ApiClient, method: str, url: str, status: int) -> None:
        path = urlsplit(url).path
        if self.prefix not in path:
            return
        # …/namespaces/<ns>/<plural>[/<name>[/<subresource>]]
        parts = path.split(self.prefix, 1)[1].strip("/").split("/")
        verb = "LIST" if method == "GET" and len(parts) == 1 else method
        resource = parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "")
        with self.lock:
            self.clients.add(id(client))
            self.calls[(verb, resource)] += 1
            self.conflicts += status == 409

    def snapshot(self) -> tuple[Counter, int]:
        with self.lock:
            return Counter(self.calls), self.conflicts


def training(name: str) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    # A metrics port gives the training a progress daemon, as the spec's default (9400) does.
    doc["spec"].update(nodes=2, gpusPerNode=1, metrics={**doc["spec"].get("metrics", {}), "port": 9400})
    return doc


def status(cluster: Cluster, ns: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def jobset_events_handled(operator, jobset_uid: str) -> int:
    return sum("Handler 'jobset_changed' succeeded" in m for m in operator.messages(jobset_uid))


def describe(calls: Counter, conflicts: int) -> str:
    listed = ", ".join(f"{verb} {resource} ×{n}" for (verb, resource), n in sorted(calls.items()))
    return f"{sum(calls.values())} requests ({listed}); {conflicts} conflict(s)"


def slow_jobset_posts(monkeypatch: pytest.MonkeyPatch) -> None:
    create = handlers.lifecycle.create_jobset

    def create_jobset(*args, **kwargs):
        created = create(*args, **kwargs)
        time.sleep(SLOW_POST)
        return created

    monkeypatch.setattr(handlers.lifecycle, "create_jobset", create_jobset)


def test_one_training_costs_few_api_calls(cluster, namespace, operator, monkeypatch):
    counter = RequestCounter(namespace, ignore=cluster.api)
    counter.install(monkeypatch)
    slow_jobset_posts(monkeypatch)

    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, training("mt"))
    wait_for(lambda: status(cluster, namespace, "mt").get("phase") == Phase.PENDING, "the first status")
    js_uid = cluster.custom.get_namespaced_custom_object(
        JS_GROUP, JS_VERSION, namespace, JS_PLURAL, "mt")["metadata"]["uid"]
    wait_for(lambda: jobset_events_handled(operator, js_uid) >= 1, "the JobSet's ADDED event to be handled")
    time.sleep(SETTLE)
    created, conflicts = counter.snapshot()

    assert sum(created.values()) <= CREATE_BUDGET + PER_CONFLICT * conflicts, \
        f"create → JobSet → first status: {describe(created, conflicts)}"
    # The ADDED event no longer races reconcile's status write: nothing conflicts.
    assert conflicts == 0, describe(created, conflicts)
    assert created[("GET", "translationtrainings")] == 0, describe(created, conflicts)
    # Exactly one ConfigMap and one JobSet were asked for, and the JobSet was read once at most
    # (before creating it): the status writers reuse the one they hold.
    assert (created[("POST", "configmaps")], created[("POST", "jobsets")]) == (1, 1), describe(created, conflicts)
    assert created[("GET", "jobsets")] <= 1 + conflicts, describe(created, conflicts)
    # A Pending training's pods cannot be up yet: nobody looks for them.
    assert created[("LIST", "pods")] == 0, describe(created, conflicts)
    assert len(counter.clients) == 1, "expected the operator's one API client"

    # The JobSet controller reports the gang ready.
    handled = jobset_events_handled(operator, js_uid)
    cluster.custom.patch_namespaced_custom_object_status(JS_GROUP, JS_VERSION, namespace, JS_PLURAL, "mt", {
        "status": {"restarts": 0, "replicatedJobsStatus": [{"name": "node", "ready": 1, "active": 1,
                                                            "succeeded": 0, "failed": 0, "suspended": 0}]}})
    wait_for(lambda: status(cluster, namespace, "mt").get("phase") == Phase.RUNNING, "phase Running")
    wait_for(lambda: jobset_events_handled(operator, js_uid) > handled, "the JobSet's status event to be handled")
    # The progress daemon starts with Running and looks for rank 0 at once.
    wait_for(lambda: counter.snapshot()[0][("LIST", "pods")] >= 1, "the progress daemon's first round")
    time.sleep(SETTLE)
    total, conflicts = counter.snapshot()
    running = total - created

    assert sum(total.values()) <= CREATE_BUDGET + RUNNING_BUDGET + PER_CONFLICT * conflicts, \
        f"create → Running: {describe(total, conflicts)}"
    assert running[("GET", "jobsets")] <= conflicts, f"→ Running: {describe(running, conflicts)}"
    assert running[("PATCH", "translationtrainings/status")] >= 1, describe(running, conflicts)
