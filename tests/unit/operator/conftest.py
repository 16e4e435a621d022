"""The in-memory API's fixtures (support/handler_api.py), for the handlers' tests in this folder.

Here rather than imported by each test module: a fixture imported by name is an unused import to
every linter, and a test module importing another for its fixtures ties their collection together.
"""

from __future__ import annotations

import copy

import kopf
import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from support.handler_api import FakeAPI


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    fake = FakeAPI()
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda _client=None: fake)
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda _client=None: fake)
    return fake


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    posted: list[dict] = []
    monkeypatch.setattr(kopf, "warn", lambda obj, *, reason, message="", **_: posted.append(
        {"name": obj["metadata"]["name"], "reason": reason, "message": message}))
    return posted


@pytest.fixture
def jobs(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:
    """Batch API calls on the in-memory API: created Jobs by name."""
    created: dict[str, dict] = {}

    def create_namespaced_job(namespace, body):
        api.calls.append(("create", "jobs", body["metadata"]["name"]))
        if body["metadata"]["name"] in created:
            raise ApiException(status=409, reason="AlreadyExists")
        created[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def read_namespaced_job(name, namespace):
        api.calls.append(("get", "jobs", name))
        return copy.deepcopy(created[name])

    api.create_namespaced_job = create_namespaced_job
    api.read_namespaced_job = read_namespaced_job
    monkeypatch.setattr(kubernetes.client, "BatchV1Api", lambda _client=None: api)
    return created
