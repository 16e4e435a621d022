"""An in-memory API for the handlers' unit tests: just the CustomObjectsApi and CoreV1Api calls
the handlers make, over a dict of objects, and a training and a reconcile call over it.

Its fixtures (`api`, `warnings`, `jobs`) are in tests/unit/operator/conftest.py, the one folder whose
tests use them, so that no test module imports a fixture by name.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import kopf
from kubernetes.client.rest import ApiException

from rosetta_operator import event_memory, handlers
from rosetta_operator.scheduling_status import UnschedulablePods
from support.cel_cases import BASE, SHARED_CHECKPOINTS

NS, NAME, UID, JOBSET_UID = "team", "mt", "uid-mt", "uid-js"
SPEC = {**copy.deepcopy(BASE), "nodes": 2, "volumes": SHARED_CHECKPOINTS}  # the smallest valid spec on two nodes


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeAPI:
    """Just the CustomObjectsApi and CoreV1Api calls the handlers make, over a dict of objects;
    `calls` records each one, so a test can say that nothing was asked."""

    def __init__(self, kueue: bool = True):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple] = []
        self.kueue = kueue
        self.version = 0

    def put(self, plural: str, obj: dict) -> dict:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(plural, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, plural: str, name: str) -> dict:
        return self.objects[(plural, NS, name)]

    def _read(self, plural, namespace, name):
        try:
            return copy.deepcopy(self.objects[(plural, namespace, name)])
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    # CustomObjectsApi
    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.calls.append(("get", plural, name))
        return self._read(plural, namespace, name)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.calls.append(("create", plural, body["metadata"]["name"]))
        body = copy.deepcopy(body)
        body["metadata"].setdefault("uid", JOBSET_UID)
        return self.put(plural, body)

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.calls.append(("patch", plural, name, copy.deepcopy(body)))
        obj = self._read(plural, namespace, name)
        _merge(obj, body)
        return self.put(plural, obj)

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self.calls.append(("patch_status", plural, name))
        obj = self._read(plural, namespace, name)
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        obj.setdefault("status", {})
        _merge(obj["status"], body["status"])
        return self.put(plural, obj)

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=""):
        self.calls.append(("list", plural, label_selector))
        if plural == "workloads" and not self.kueue:
            raise ApiException(status=404, reason="Not Found")
        key, _, value = label_selector.partition("=")
        items = [copy.deepcopy(o) for (p, ns, _), o in self.objects.items()
                 if p == plural and ns == namespace and (o["metadata"].get("labels") or {}).get(key) == value]
        return {"items": items}

    # CoreV1Api
    def create_namespaced_config_map(self, namespace, body):
        self.calls.append(("create", "configmaps", body["metadata"]["name"]))

    def list_namespaced_pod(self, namespace, label_selector=""):
        self.calls.append(("list", "pods", label_selector))
        return SimpleNamespace(items=[])

    def of(self, kind: str) -> list[tuple]:
        return [c for c in self.calls if c[1] == kind]


def memo(api: FakeAPI) -> kopf.Memo:
    return kopf.Memo(api_client=SimpleNamespace(sanitize_for_serialization=lambda o: o), allow_host_path=False,
                     own_creations=event_memory.OwnCreations(), unschedulable_pods=UnschedulablePods(), failed_pods=event_memory.Decisions(),
                     workload_decisions=event_memory.Decisions(), quota_retry=handlers.QUOTA_RETRY_DELAY)


def training(api: FakeAPI, **spec) -> dict:
    return api.put("translationtrainings", {
        "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
        "spec": {**SPEC, **spec}})


def reconcile(api: FakeAPI, m: kopf.Memo) -> dict:
    body = kopf.Body(api.get("translationtrainings", NAME))
    handlers.reconcile(body=body, spec=body.spec, name=NAME, namespace=NS, uid=UID, memo=m,
                       logger=logging.getLogger(__name__))
    return api.get("translationtrainings", NAME)


def jobset_status(api: FakeAPI, **status) -> dict:
    """The JobSet controller (or Kueue) moved: returns the JobSet as the watch would deliver it."""
    jobset = api.get("jobsets", NAME)
    _merge(jobset, status)
    return api.put("jobsets", jobset)


def jobset_event(api: FakeAPI, m: kopf.Memo, jobset: dict) -> dict:
    handlers.jobset_changed(event={"type": "MODIFIED"}, body=kopf.Body(jobset), namespace=NS, memo=m)
    return api.get("translationtrainings", NAME)
