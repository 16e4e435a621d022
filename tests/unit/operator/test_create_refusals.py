"""The API refuses a training's ConfigMap or JobSet: for good (a condition, no retry until the spec
changes) or for now (a quota: a condition, retried), against the handlers' in-memory API."""

from __future__ import annotations

import json

import kopf
import pytest
from kubernetes.client.rest import ApiException

from rosetta_contract.resource import Phase
from rosetta_operator import api_calls
from rosetta_operator.conditions import ConditionType, Reason, condition
from support.handler_api import NAME, memo, reconcile, training

VAP = ("jobsets.jobset.x-k8s.io \"mt\" is forbidden: ValidatingAdmissionPolicy 'no-jobsets' with binding "
       "'no-jobsets' denied request: training JobSets are closed")
WEBHOOK = 'admission webhook "policy.example.com" denied the request: image not signed'
QUOTA = ('jobsets.jobset.x-k8s.io "mt" is forbidden: exceeded quota: jobsets, requested: '
         'count/jobsets.jobset.x-k8s.io=1, used: count/jobsets.jobset.x-k8s.io=1, limited: count/jobsets.jobset.x-k8s.io=1')
RBAC = ('jobsets.jobset.x-k8s.io is forbidden: User "system:serviceaccount:rosetta-system:rosetta" cannot create '
        'resource "jobsets" in API group "jobset.x-k8s.io" in the namespace "team"')
INVALID = 'JobSet.jobset.x-k8s.io "mt" is invalid: spec.replicatedJobs[0].name: Invalid value: "x": too long'


def error(status: int, message: str = "", reason: str = "") -> ApiException:
    exc = ApiException(status=status, reason=reason or "Error")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return exc


@pytest.mark.parametrize("status, message, reason", [
    (422, INVALID, Reason.CREATE_REJECTED),
    (400, "the object provided is unrecognized", Reason.CREATE_REJECTED),
    (413, "Request entity too large: limit is 3145728", Reason.CREATE_REJECTED),
    (403, VAP, Reason.CREATE_REJECTED),
    (403, WEBHOOK, Reason.CREATE_REJECTED),
    (403, QUOTA, Reason.QUOTA_EXCEEDED),
    (403, RBAC, None),                     # the operator's RBAC: an admin fixes it, kopf retries
    (404, "the server could not find the requested resource", None),   # no JobSet CRD yet
    (409, "already exists", None),
    (429, "too many requests", None),
    (500, "etcdserver: request timed out", None),
    (503, "", None),
])
def test_which_refusals_are_for_good(status, message, reason):
    refusal = api_calls.create_refusal(error(status, message))
    assert (refusal.reason if refusal else None) == reason
    if refusal:
        assert refusal.message == message


def test_the_apis_message_is_one_line_and_bounded():
    exc = error(422, "line one\nline two  " + "x" * 5000)
    message = api_calls.api_message(exc)
    assert message.startswith("line one line two x") and len(message) <= 800 and "\n" not in message
    assert api_calls.api_message(ApiException(status=502, reason="Bad Gateway")) == "502 Bad Gateway"


CREATE = {"jobsets": "create_namespaced_custom_object", "configmaps": "create_namespaced_config_map"}


def refuse(fake, plural: str, exc: ApiException) -> list[int]:
    """Creating `plural` fails with `exc` until `allow`; returns the attempt counter."""
    attempts = [0]

    def refused(*_args, **_kwargs):
        attempts[0] += 1
        raise exc
    setattr(fake, CREATE[plural], refused)
    return attempts


def allow(fake, plural: str) -> None:
    delattr(fake, CREATE[plural])   # the in-memory API's own method again


def test_a_jobset_refused_for_good_fails_the_training_once(api, warnings):
    attempts = refuse(api, "jobsets", error(422, INVALID))
    training(api)
    m = memo(api)
    status = reconcile(api, m)["status"]   # returns: kopf does not call it again for this generation
    message = f"the API refused JobSet {NAME}: {INVALID}"
    assert attempts == [1]
    assert status["phase"] == Phase.FAILED and status["message"] == message
    created = condition(status, ConditionType.CREATED)
    assert (created["status"], created["reason"], created["message"]) == ("False", "CreateRejected", message)
    assert condition(status, ConditionType.FAILED)["reason"] == "CreateRejected"
    assert condition(status, ConditionType.VALID)["status"] == "True"
    assert "jobSetName" not in status   # never created: nothing for the JobSet watch to mirror
    assert warnings == [{"name": NAME, "reason": "CreateRejected", "message": message}]

    # The spec changes (a new generation) and the API takes it: the training runs.
    allow(api, "jobsets")
    tt = api.get("translationtrainings", NAME)
    tt["metadata"]["generation"] = 2
    api.put("translationtrainings", tt)
    status = reconcile(api, m)["status"]
    assert status["phase"] == Phase.PENDING and status["jobSetName"] == NAME
    assert condition(status, ConditionType.CREATED)["reason"] == "JobSetCreated"
    assert condition(status, ConditionType.FAILED)["status"] == "False"


def test_a_configmap_refused_for_good_is_named(api, warnings):
    refuse(api, "configmaps", error(413, "Request entity too large: limit is 3145728"))
    training(api)
    status = reconcile(api, memo(api))["status"]
    assert status["message"] == f"the API refused ConfigMap {NAME}-config: Request entity too large: limit is 3145728"
    assert [c for c in api.calls if c[:2] == ("create", "jobsets")] == []


def test_a_quota_refusal_is_retried_with_one_warning(api, warnings):
    attempts = refuse(api, "jobsets", error(403, QUOTA))
    training(api)
    m = memo(api)
    m.quota_retry = 7.0  # --quota-retry
    for _ in range(3):
        with pytest.raises(kopf.TemporaryError) as exc:
            reconcile(api, m)
        assert exc.value.delay == 7.0
    status = api.get("translationtrainings", NAME)["status"]
    assert attempts == [3]
    assert status["phase"] == Phase.PENDING
    assert condition(status, ConditionType.CREATED)["reason"] == "QuotaExceeded"
    assert condition(status, ConditionType.FAILED) is None
    assert [w["reason"] for w in warnings] == ["QuotaExceeded"]   # not one per retry

    allow(api, "jobsets")   # another training finished
    status = reconcile(api, m)["status"]
    assert condition(status, ConditionType.CREATED)["reason"] == "JobSetCreated"


@pytest.mark.parametrize("status, message", [(403, RBAC), (500, "etcdserver: request timed out")])
def test_other_errors_are_raised_for_kopf_to_retry(api, warnings, status, message):
    refuse(api, "jobsets", error(status, message))
    training(api)
    with pytest.raises(ApiException):
        reconcile(api, memo(api))
    assert warnings == [] and "status" not in api.get("translationtrainings", NAME)
