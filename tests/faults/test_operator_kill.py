"""The operator SIGKILLed mid-reconcile and restarted: never a second JobSet, never a lost status.

`rosetta operator` runs as its own process (a real SIGKILL: no cleanup, no finished handler). Each
round creates a burst of trainings and kills the operator at a moment that a watch catches:

    configmap   the first ConfigMap of the burst appears: its JobSet is the operator's next call
    jobset      the first JobSet of the burst appears: its training's status is not written yet
    timed       a seeded random moment in the burst's first half second
    resume      right after a restart, while it resumes everything earlier rounds left

The next round starts a new operator, which must finish what the killed one left. Between rounds
the test plays the JobSet controller (earlier trainings go Running), so the kills also fall on
trainings with a status worth keeping. At the end: one JobSet and one ConfigMap per training,
owned by it, never recreated; status complete and unchanged where it was already written.
"""

from __future__ import annotations

import copy
import random
import threading
import time

import pytest
import yaml
from kubernetes import watch

from control_plane import free_port
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import ConditionType, Reason
from support.cluster import GROUP, JS_GROUP, JS_PLURAL, JS_VERSION, REPO, VERSION, Cluster, OperatorProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
BURST = 8
ROUNDS = ("configmap", "jobset", "timed", "resume", "configmap", "jobset")
# The JobSet controller's view of earlier trainings while later rounds are killed.
RUNNING = dict(ready=1, active=1)


def training(name: str) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"]["nodes"] = 1
    return doc


def cond(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


class Operator:
    """One operator process at a time; each start is a new process with its own log."""

    def __init__(self, cluster: Cluster, namespace: str):
        self.cluster, self.namespace = cluster, namespace
        self.proc: OperatorProcess | None = None
        self.starts = 0
        self.crashes: list[str] = []  # the log of each process found dead when it was to be killed

    def start(self) -> None:
        port = free_port()
        self.starts += 1
        self.proc = OperatorProcess(self.cluster, f"operator-{self.namespace}-{self.starts}", "--namespace",
                                    self.namespace, "--liveness-port", str(port), "--metrics-port", "0")
        self.proc.wait_healthy(port)

    def kill(self) -> None:
        # Maybe called from the watch's thread: a process that had died already is recorded, not failed here.
        if self.proc.proc.poll() is not None:
            self.crashes.append(self.proc.tail())
        self.proc.kill()


def kill_on_first(cluster: Cluster, operator: Operator, namespace: str, kind: str, names: set[str],
                  timeout: float = 60) -> None:
    """SIGKILL the operator the moment the watch shows the first `kind` of one of `names`."""
    w = watch.Watch()
    if kind == "configmap":
        stream = w.stream(cluster.core.list_namespaced_config_map, namespace, timeout_seconds=int(timeout))
        name_of = lambda obj: obj.metadata.name.removesuffix("-config")  # noqa: E731
    else:
        stream = w.stream(cluster.custom.list_namespaced_custom_object, JS_GROUP, JS_VERSION, namespace,
                          JS_PLURAL, timeout_seconds=int(timeout))
        name_of = lambda obj: obj["metadata"]["name"]  # noqa: E731
    for event in stream:
        if event["type"] == "ADDED" and name_of(event["object"]) in names:
            operator.kill()
            w.stop()
            return
    pytest.fail(f"no {kind} for {sorted(names)} within {timeout} s; operator log:\n{operator.proc.tail()}")


def snapshot(cluster: Cluster, namespace: str, names: set[str]) -> dict[str, int]:
    """How far the killed operator got with the burst."""
    cms, jss = cluster.configmaps(namespace), cluster.jobsets(namespace)
    trainings = cluster.trainings(namespace)
    return {
        "configmap": sum(f"{n}-config" in cms for n in names),
        "jobset": sum(n in jss for n in names),
        "status": sum(bool((trainings[n].get("status") or {}).get("jobSetName")) for n in names),
    }


def reconciled(cluster: Cluster, namespace: str, names: set[str]) -> bool:
    trainings = cluster.trainings(namespace)
    for name in names:
        status = trainings[name].get("status") or {}
        if status.get("observedGeneration") != trainings[name]["metadata"]["generation"] \
                or cond(status, ConditionType.CREATED).get("status") != "True":
            return False
    return True


def test_sigkill_mid_reconcile_never_duplicates_or_loses_status(cluster: Cluster, namespace: str):
    rng = random.Random(20240611)
    operator = Operator(cluster, namespace)
    created: set[str] = set()
    settled: dict[str, dict] = {}   # name → status once reconciled and playing Running
    child_uids: dict[str, tuple[str, str]] = {}
    hits: list[tuple[str, dict]] = []
    try:
        operator.start()
        for number, when in enumerate(ROUNDS):
            burst = {f"r{number}-{i}" for i in range(BURST)}
            if when == "resume":
                # Killed while it resumes: the burst is created while no operator runs.
                operator.kill()
                for name in sorted(burst):
                    cluster.create_training(namespace, training(name))
                operator.start()
                operator.kill()
            elif when == "timed":
                kill_at = time.monotonic() + rng.uniform(0.05, 0.5)
                for name in sorted(burst):
                    cluster.create_training(namespace, training(name))
                time.sleep(max(0.0, kill_at - time.monotonic()))
                operator.kill()
            else:
                watcher = threading.Thread(target=kill_on_first,
                                           args=(cluster, operator, namespace, when, burst), daemon=True)
                watcher.start()
                time.sleep(0.5)  # the watch is open before the first create
                for name in sorted(burst):
                    cluster.create_training(namespace, training(name))
                watcher.join(90)
                assert not watcher.is_alive(), f"round {number}: the {when} watch never fired"
            assert not operator.crashes, f"round {number}: the operator had exited:\n{operator.crashes[0]}"
            created |= burst
            hits.append((when, snapshot(cluster, namespace, burst)))

            operator.start()
            wait_for(lambda: reconciled(cluster, namespace, created),
                     f"round {number} ({when}): all {len(created)} trainings reconciled after the restart",
                     timeout=120)
            # The JobSet controller moves the trainings that are not settled yet.
            for name in sorted(created - set(settled)):
                cluster.play_jobset(namespace, name, **RUNNING)
            wait_for(lambda: all((t.get("status") or {}).get("phase") == Phase.RUNNING
                                 for t in cluster.trainings(namespace).values()),
                     f"round {number}: every training Running", timeout=120)
            trainings = cluster.trainings(namespace)
            for name in sorted(created - set(settled)):
                settled[name] = trainings[name]["status"]
                child_uids[name] = (cluster.jobsets(namespace)[name]["metadata"]["uid"],
                                    cluster.configmaps(namespace)[f"{name}-config"].metadata.uid)
        operator.proc.check_alive()
    finally:
        if operator.proc is not None and operator.proc.proc.poll() is None:
            operator.proc.stop()
    print("state at each kill (of", BURST, "new trainings):", hits)

    trainings = cluster.trainings(namespace)
    jobsets, configmaps = cluster.jobsets(namespace), cluster.configmaps(namespace)
    # Exactly one JobSet and one ConfigMap per training, each owned by it alone ...
    assert sorted(jobsets) == sorted(created)
    assert sorted(configmaps) == sorted(f"{n}-config" for n in created)
    for name, obj in trainings.items():
        owner = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "TranslationTraining", "name": name,
                  "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        assert jobsets[name]["metadata"]["ownerReferences"] == owner, name
        refs = [r.to_dict() for r in configmaps[f"{name}-config"].metadata.owner_references]
        assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in refs] == \
            [("TranslationTraining", name, obj["metadata"]["uid"], True)], name
        # ... and never recreated by a later operator.
        assert (jobsets[name]["metadata"]["uid"], configmaps[f"{name}-config"].metadata.uid) == child_uids[name]

    # Status: complete, and what later operators found already written is unchanged.
    for name, obj in trainings.items():
        status = obj["status"]
        assert status["phase"] == Phase.RUNNING, name
        assert status["observedGeneration"] == obj["metadata"]["generation"], name
        assert (status["jobSetName"], status["configMapName"]) == (name, f"{name}-config"), name
        assert (status["nodes"], status["worldSize"]) == (1, 1), name
        for type_, reason in ((ConditionType.VALID, Reason.SPEC_VALID), (ConditionType.CREATED, Reason.JOBSET_CREATED),
                              (ConditionType.SPEC_APPLIED, Reason.SPEC_IN_SYNC)):
            assert (cond(status, type_)["status"], cond(status, type_)["reason"]) == ("True", reason), (name, type_)
        before = settled[name]
        assert status["startTime"] == before["startTime"], name
        for type_ in (ConditionType.VALID, ConditionType.CREATED, ConditionType.RUNNING):
            assert cond(status, type_)["lastTransitionTime"] == cond(before, type_)["lastTransitionTime"], (name, type_)
    # The restarts did not need to fall back on a retry after an error to get there.
    logs = "".join(p.read_text() for p in sorted(operator_logs(cluster, namespace)))
    assert "Traceback" not in logs, logs[-4000:]


def operator_logs(cluster: Cluster, namespace: str):
    return cluster.cp.workdir.glob(f"operator-{namespace}-*.log")
