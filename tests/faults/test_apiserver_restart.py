"""The kube-apiserver restarts under a running operator: the operator reconnects by itself.

The session's control plane is restarted in place (tests/envtest/control_plane.py): etcd keeps
running, so every object survives, and the new apiserver listens on the same port with the same
certificates, so the session's clients and the controller-manager carry on as after a real
rolling upgrade of the control plane. `rosetta operator` runs as its own process throughout and
is never restarted: after the outage it must see new trainings, spec changes and JobSet status.
"""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from control_plane import free_port
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import ConditionType
from support.cluster import GROUP, PLURAL, REPO, VERSION, Cluster, OperatorProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
# Down long enough for the operator's watches and requests to fail and back off, as a
# control-plane upgrade on a managed cluster typically is.
OUTAGE = 10.0


def training(name: str) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"]["nodes"] = 1
    return doc


def status(cluster: Cluster, namespace: str, name: str) -> dict:
    return cluster.trainings(namespace)[name].get("status") or {}


def test_operator_survives_apiserver_restart(cluster: Cluster, namespace: str):
    port = free_port()
    op = OperatorProcess(cluster, f"operator-{namespace}", "--namespace", namespace,
                         "--liveness-port", str(port), "--metrics-port", "0")
    try:
        op.wait_healthy(port)
        for name in ("before", "edited"):
            cluster.create_training(namespace, training(name))
            wait_for(lambda: status(cluster, namespace, name).get("jobSetName"), f"{name}'s JobSet")
        written = status(cluster, namespace, "before")

        started = time.monotonic()
        cluster.cp.restart_apiserver(down_for=OUTAGE)
        back = time.monotonic()
        op.check_alive()

        # Everything the operator does after the outage, at once: a new training, a spec change and a
        # JobSet status change (the JobSet controller reporting a training's pod ready).
        cluster.create_training(namespace, training("after"))
        cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "edited",
                                                      {"spec": {"suspend": True}})
        cluster.play_jobset(namespace, "before", ready=1, active=1)

        wait_for(lambda: status(cluster, namespace, "after").get("jobSetName"),
                 "the operator to reconcile a training created after the restart", timeout=120)
        created_after = time.monotonic() - back
        wait_for(lambda: status(cluster, namespace, "edited").get("phase") == Phase.SUSPENDED
                 and cluster.jobsets(namespace)["edited"]["spec"]["suspend"] is True,
                 "the operator to apply a spec change made after the restart", timeout=120)
        wait_for(lambda: status(cluster, namespace, "before").get("phase") == Phase.RUNNING,
                 "the operator to mirror JobSet status written after the restart", timeout=120)
        all_after = time.monotonic() - back
        op.check_alive()
        op.wait_healthy(port, timeout=10)
    finally:
        code = op.stop()
    print(f"apiserver down {OUTAGE:.0f} s, back ready after {back - started:.1f} s; then the new training "
          f"was reconciled in {created_after:.1f} s, all three changes in {all_after:.1f} s")
    assert code == 0, op.tail()

    # Nothing was lost or duplicated across the outage.
    assert sorted(cluster.jobsets(namespace)) == ["after", "before", "edited"]
    before = status(cluster, namespace, "before")
    assert before["startTime"]
    assert status(cluster, namespace, "edited")["observedGeneration"] == 2
    kept = ("status", "reason", "lastTransitionTime")
    created = next(c for c in before["conditions"] if c["type"] == ConditionType.CREATED)
    first = next(c for c in written["conditions"] if c["type"] == ConditionType.CREATED)
    assert [created[k] for k in kept] == [first[k] for k in kept]

    # The rest of the session keeps its control plane: the same clients work, the GC still runs.
    assert cluster.core.read_namespace(namespace).metadata.name == namespace
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert cluster.cp.procs[name].poll() is None, cluster.cp.logs(name)
