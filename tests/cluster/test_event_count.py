"""One Kubernetes event per situation, not one per retry: a training that waits for room under a
ResourceQuota and one the operator refuses (InvalidSpec) each get exactly one Warning, over a window
long enough for several of the quota's retries and an operator restart.

Every event on either training is counted, whatever its reason or source, with the repeats that
Kubernetes folds into one Event (count, series): a log line that kopf turned into an event, or an
event posted again each time the handler retries, would show here as a second one.
"""

from __future__ import annotations

import time

from test_admin_policy import operator
from test_lifecycle import small_training
from workloads import condition, provision

from support.cluster import JS_GROUP, JS_PLURAL, wait_for

# Long enough for three retries of the quota-blocked create, the operator restart between them; the
# retry shortened from its 30 s default (--quota-retry), which only spaces them out.
RETRIES = 3
QUOTA_RETRY = 3.0
WINDOW = RETRIES * QUOTA_RETRY + 10


def events_on(cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every event on training `name`, once per occurrence."""
    seen = []
    for event in cluster.core.list_namespaced_event(namespace).items:
        involved = event.involved_object
        if involved.kind != "TranslationTraining" or involved.name != name:
            continue
        times = max(event.count or 1, event.series.count if event.series else 1)
        seen += [(event.type, event.reason, event.message)] * times
    return seen


def test_a_blocked_and_an_invalid_training_get_one_event_each(live_cluster, live_namespace):
    ns = live_namespace
    quota = {"metadata": {"name": "jobsets"}, "spec": {"hard": {f"count/{JS_PLURAL}.{JS_GROUP}": "0"}}}
    live_cluster.core.create_namespaced_resource_quota(ns, quota)
    # Until the quota controller has filled in its status, admission refuses for another reason.
    wait_for(lambda: live_cluster.core.read_namespaced_resource_quota("jobsets", ns).status.hard or {},
             "the quota's status")
    blocked = small_training(ns, "blocked")
    provision(live_cluster, ns, blocked)
    # Passes the CRD's schema; hostPath needs the operator's --allow-host-path, which it lacks.
    invalid = small_training(ns, "invalid")
    invalid["spec"]["volumes"].append({"name": "scratch", "mountPath": "/scratch", "hostPath": {"path": "/var/tmp"}})

    with operator(live_cluster, ns, "--quota-retry", f"{QUOTA_RETRY:g}") as op:
        live_cluster.create_training(ns, blocked)
        live_cluster.create_training(ns, invalid)
        wait_for(lambda: (condition(live_cluster, ns, "blocked", "Created") or {}).get("reason") == "QuotaExceeded",
                 "Created=False (QuotaExceeded)")
        wait_for(lambda: (condition(live_cluster, ns, "invalid", "Valid") or {}).get("reason") == "InvalidSpec",
                 "Valid=False (InvalidSpec)")
        time.sleep(WINDOW / 2)
        first_retries = op.reconciles().get("quota", 0)
        log = op.log.read_text()
    # A restart resumes both trainings: still the same situations.
    with operator(live_cluster, ns, "--quota-retry", f"{QUOTA_RETRY:g}") as op:
        time.sleep(WINDOW / 2)
        retries = first_retries + op.reconciles().get("quota", 0)
        log += op.log.read_text()
    assert retries >= RETRIES, f"{retries} quota retries in {WINDOW:g} s"
    # The operator's own log still says why, each time.
    assert log.count("the API refused JobSet blocked") >= retries and "spec.volumes[1].hostPath" in log

    got = events_on(live_cluster, ns, "blocked")
    assert [(kind, reason) for kind, reason, _ in got] == [("Warning", "QuotaExceeded")], got
    assert "exceeded quota: jobsets" in got[0][2]
    got = events_on(live_cluster, ns, "invalid")
    assert [(kind, reason) for kind, reason, _ in got] == [("Warning", "InvalidSpec")], got
    assert "spec.volumes[1].hostPath" in got[0][2]
