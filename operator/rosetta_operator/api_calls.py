"""The operator's writes to the API: the training's status (one writer, conflict-safe), the JobSet and
ConfigMap it owns, and what a refused create means.

Status is written with the parent's resourceVersion as a precondition, so the reconcile handler and the
JobSet watch never overwrite each other's view; a first attempt trusts what the caller already holds
and only a 409 makes it read again.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
from typing import Any, Callable, Mapping, NamedTuple, Optional, TypeVar, Union, cast

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.resource import GROUP, KIND, PLURAL, VERSION
from rosetta_operator.actions import Decision, Settled
from rosetta_operator.conditions import FALSE, Cond, ConditionType, Reason, truncate, upsert_conditions
from rosetta_operator.names import TRAINING_LABEL
from rosetta_operator.operator_metrics import (
    JOBSETS_CREATED,
    STATUS_PATCHES,
    observe_time_to_running,
    record_status_change,
)
from rosetta_operator.status import status_patch

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
# Kueue labels each Workload with the uid of the job it admits.
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
Observed = TypeVar("Observed")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_status(api: kubernetes.client.ApiClient, namespace: str, name: str, uid: str,
                 compute: Callable[[Mapping[str, Any], Mapping[str, Any]], Union[dict[str, Any], Decision]],
                 attempts: int = 8, parent: Optional[Mapping[str, Any]] = None) -> Optional[Settled]:
    """Compute the training's desired status, patch what changed, retry on conflict; `compute`
    (training, current status) is pure and may return a Decision with the actions for the caller
    to carry out once this returns (act.py). None when the training is gone (or not `uid`'s)."""
    return settle_status(api, namespace, name, uid, lambda _training: None,
                         lambda _seen, training, current: compute(training, current), attempts=attempts, parent=parent)


def settle_status(api: kubernetes.client.ApiClient, namespace: str, name: str, uid: str,
                  gather: Callable[[Mapping[str, Any]], Observed],
                  decide: Callable[[Observed, Mapping[str, Any], Mapping[str, Any]], Union[dict[str, Any], Decision]],
                  *, attempts: int = 8, parent: Optional[Mapping[str, Any]] = None,
                  gather_again: bool = False) -> Optional[Settled]:
    """Gather, decide, write: `gather(training)` reads the cluster into an observation, once;
    `decide(observation, training, current status)` is pure, and a 409 conflict runs it again on
    the training read afresh. Nothing here acts: the caller carries out the returned actions once
    the status that asked for them is written (or already says it), so a retried write repeats no
    suspend and no event. None when the training is gone (or not `uid`'s).

    `gather_again`: after a conflict, gather once more first (reads only). The writer that won may
    have seen a newer JobSet than the one this call read; a decision on the older one would undo
    its status. Not for a JobSet that came with the event: a newer one comes as a later event.

    `parent` is the training as the caller already has it (kopf's body): the first attempt uses it
    instead of a read. That is safe because the patch carries its resourceVersion: if the training
    changed since, the apiserver answers 409 and every later attempt reads it afresh.
    """
    custom = kubernetes.client.CustomObjectsApi(api)
    known = copy.deepcopy(dict(parent)) if parent is not None else None
    seen: list[Observed] = []
    for _attempt in range(attempts):
        if known is not None:
            parent, known = known, None
        else:
            parent = get_training(api, namespace, name)
            if parent is None:
                return None
        meta = parent["metadata"]
        if meta["uid"] != uid or meta.get("deletionTimestamp"):
            return None  # a newer object with the same name, or on its way out: not ours to describe
        if not seen or gather_again:
            seen[:] = [gather(parent)]
        current = parent.get("status") or {}
        decided = decide(seen[0], parent, current)
        decision = decided if isinstance(decided, Decision) else Decision(decided)
        patch = status_patch(current, decision.status)
        if patch is None:
            return Settled(parent, decision.status, decision.actions)
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch}
        try:
            custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body)
        except ApiException as exc:
            if exc.status == 404:
                return None  # deleted since the parent was read: nothing left to describe
            if exc.status != 409:
                raise
            continue
        STATUS_PATCHES.inc()
        if patch.get("startTime") and not current.get("startTime"):
            observe_time_to_running(meta.get("creationTimestamp"), patch["startTime"])
        record_status_change(current, {**current, **patch})
        return Settled(parent, decision.status, decision.actions)
    raise kopf.TemporaryError(f"status of {namespace}/{name} kept changing; retrying", delay=1)


def first_attempt_only(value: Optional[Mapping[str, Any]]) -> Callable[[], Optional[Mapping[str, Any]]]:
    """`value` on the first call, None after: what a handler held before a 409 conflict is stale."""
    box = [value]
    return lambda: box.pop() if box else None


def get_training(api: kubernetes.client.ApiClient, namespace: str, name: str) -> Optional[dict[str, Any]]:
    """The TranslationTraining as the API holds it now; None when it is gone."""
    return _get_custom_object(api, (GROUP, VERSION, PLURAL), namespace, name)


def get_jobset(api: kubernetes.client.ApiClient, namespace: str, name: str) -> Optional[dict[str, Any]]:
    return _get_custom_object(api, (JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL), namespace, name)


def _get_custom_object(api: kubernetes.client.ApiClient, resource: tuple[str, str, str], namespace: str,
                       name: str) -> Optional[dict[str, Any]]:
    """A custom object (group, version, plural) as the API holds it now; None on 404."""
    group, version, plural = resource
    try:
        # The client returns the decoded JSON; its stubs say object.
        return cast(dict[str, Any], kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object(
            group, version, namespace, plural, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_jobset(api: kubernetes.client.ApiClient, owner: kopf.Body, jobset: dict[str, Any]) -> dict[str, Any]:
    """Create, or adopt the one a previous attempt created (409): never a second JobSet."""
    namespace = jobset["metadata"]["namespace"]
    try:
        created = cast(dict[str, Any], kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, jobset))
        JOBSETS_CREATED.inc()
        return created
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = get_jobset(api, namespace, jobset["metadata"]["name"])
    if existing is None:  # deleted between our create and read: let kopf call us again
        raise kopf.TemporaryError("JobSet vanished while being created", delay=1)
    check_owned(api, owner, existing)
    return existing


def ensure_configmap(api: kubernetes.client.ApiClient, owner: kopf.Body, configmap: dict[str, Any]) -> None:
    """Create the ConfigMap, or bring ours up to date: it may be left from an attempt that stopped
    before its JobSet was created, with an older spec."""
    core = kubernetes.client.CoreV1Api(api)
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    try:
        core.create_namespaced_config_map(namespace, configmap)  # type: ignore[arg-type]  # a dict body is sent as is
        return
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = core.read_namespaced_config_map(name, namespace)
    check_owned(api, owner, {"kind": "ConfigMap", **api.sanitize_for_serialization(existing)})
    if existing.data != configmap.get("data"):
        core.patch_namespaced_config_map(name, namespace, {"data": configmap.get("data")})


def patch_jobset(api: kubernetes.client.ApiClient, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """Returns the patched JobSet."""
    return cast(dict[str, Any], kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, patch))


def set_jobset_suspend(api: kubernetes.client.ApiClient, namespace: str, name: str, suspend: bool) -> dict[str, Any]:
    """Returns the patched JobSet."""
    return patch_jobset(api, namespace, name, {"spec": {"suspend": suspend}})


def end_attempt(api: kubernetes.client.ApiClient, namespace: str, pod: Mapping[str, Any]) -> bool:
    """Fail the Job that runs `pod` now, as a failed pod would: the Job controller enforces an
    activeDeadlineSeconds that has passed by terminating its pods (SIGTERM, then SIGKILL after the
    grace period, which a hung trainer needs), and the JobSet restarts the gang, counted towards
    failurePolicy.maxRestarts. Nothing is deleted. The Job's uid is a precondition: the JobSet names
    a restarted gang's Job as before, and the new attempt must not be ended for the old one's stall.
    False when that Job is gone already."""
    ref = next((r for r in (pod.get("metadata") or {}).get("ownerReferences") or [] if r.get("kind") == "Job"), None)
    if ref is None:
        return False
    try:
        kubernetes.client.BatchV1Api(api).patch_namespaced_job(
            ref["name"], namespace, {"metadata": {"uid": ref["uid"]}, "spec": {"activeDeadlineSeconds": 1}})
    except ApiException as exc:
        if exc.status in (404, 409, 422):  # gone, or a new Job of the same name (the uid differs)
            return False
        raise
    return True


def check_owned(api: kubernetes.client.ApiClient, owner: kopf.Body, child: Mapping[str, Any]) -> None:
    """A same-named child that is not ours (another tool's, or the previous incarnation's still
    being garbage-collected) is never touched; the condition says so and kopf retries later."""
    uid = owner.metadata["uid"]
    if any(ref.get("uid") == uid for ref in child["metadata"].get("ownerReferences") or []):
        return
    kind = child.get("kind") or "object"
    message = f"{kind} {child['metadata']['name']} exists and is not owned by this TranslationTraining"
    conflict = Cond(ConditionType.CREATED, FALSE, Reason.NAME_CONFLICT, message)
    generation = owner.metadata.get("generation")
    write_status(api, owner.metadata["namespace"], owner.metadata["name"], uid, lambda parent, current: {
        **current, "conditions": upsert_conditions(current.get("conditions") or [], [conflict],
                                                   now=now(), generation=generation)})
    raise kopf.TemporaryError(message, delay=30)


def owner_ref(child: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    for ref in child.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            return cast(Mapping[str, Any], ref)
    return None


class Refusal(NamedTuple):
    reason: str   # Reason.CREATE_REJECTED (for good) or Reason.QUOTA_EXCEEDED (for now)
    message: str  # the API's, on one line


def create_refusal(exc: ApiException) -> Optional[Refusal]:
    """What the API's answer to creating a child means when retrying it as it is cannot help; None
    when it can, and kopf retries with its backoff.

    400 BadRequest, 413 RequestEntityTooLarge, 422 Invalid (schema, CEL, a ValidatingAdmissionPolicy)
    and a 403 in which admission "denied the request" (a webhook, or a policy that answers Forbidden):
    the same object would be refused again, so CreateRejected until the spec changes. A 403 from a
    ResourceQuota ("exceeded quota") clears as other work ends: QuotaExceeded, and retried. Any other
    403 (the operator's own RBAC, a namespace being deleted), 404 (no JobSet CRD yet), 409, 429 and
    5xx are retried as they always were.
    """
    message = api_message(exc)
    if exc.status in (400, 413, 422):
        return Refusal(Reason.CREATE_REJECTED, message)
    if exc.status == 403:
        if "exceeded quota" in message:
            return Refusal(Reason.QUOTA_EXCEEDED, message)
        if "denied the request" in message or "denied request" in message:
            return Refusal(Reason.CREATE_REJECTED, message)
    return None


def api_message(exc: ApiException, limit: int = 800) -> str:
    """The Status message of an API error, on one line and cut to `limit` (it may quote the object,
    whose values are the user's own spec: nothing from a Secret is ever rendered into it)."""
    message = ""
    try:
        message = str((json.loads(exc.body or "") or {}).get("message") or "")
    except (ValueError, TypeError, AttributeError):
        pass
    text = " ".join((message or f"{exc.status} {exc.reason or ''}").split())
    return truncate(text, limit)


# ------------------------------------------------------------------------------ Kueue


def jobset_and_training(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str,
                         jobset_uid: Optional[str] = None) -> tuple[Optional[dict[str, Any]], Optional[Mapping[str, Any]]]:
    """The JobSet and the ownerReference of its TranslationTraining; (…, None) when it is not one
    of ours (or no longer the one `jobset_uid` names)."""
    jobset = get_jobset(api, namespace, jobset_name)
    if jobset is None or (jobset_uid and jobset["metadata"].get("uid") != jobset_uid) \
            or TRAINING_LABEL not in (jobset["metadata"].get("labels") or {}):
        return jobset, None
    return jobset, owner_ref(jobset)


def hold_in_queue(api: kubernetes.client.ApiClient, namespace: str, jobset: Mapping[str, Any], hold: bool) -> None:
    """Deactivate (hold) or reactivate the Kueue Workload of a queued JobSet."""
    workload = get_workload(api, namespace, jobset)
    if workload is None:
        # Kueue makes the Workload moments after the JobSet; the edit is applied once it exists.
        raise kopf.TemporaryError(f"Kueue has no Workload for JobSet {jobset['metadata']['name']} yet", delay=2)
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOAD_PLURAL, workload["metadata"]["name"],
        {"spec": {"active": not hold}})


def get_workload(api: kubernetes.client.ApiClient, namespace: str, jobset: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """Kueue's Workload for the JobSet, None when there is none yet or Kueue is not installed."""
    try:
        listed = cast(dict[str, Any], kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOAD_PLURAL,
            label_selector=f"{KUEUE_JOB_UID_LABEL}={jobset['metadata'].get('uid')}"))
    except ApiException as exc:
        if exc.status != 404:  # 404: no Kueue in this cluster, the queue label is only a label
            logging.getLogger(__name__).warning("cannot list the Kueue Workloads in %s: %s", namespace, exc.reason)
        return None
    items = listed.get("items") or []
    # A re-created Workload (e.g. after its JobSet's spec changed) replaces the older one.
    return max(items, key=lambda w: w["metadata"].get("creationTimestamp") or "", default=None)
