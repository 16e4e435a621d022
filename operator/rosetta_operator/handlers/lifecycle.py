"""A training's life: create its ConfigMap and JobSet (or the evaluation Job), refuse what cannot
change, and mirror the JobSet's state into the status; the phase gauge."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any, Mapping, Optional

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION, Phase
from rosetta_contract.spec import TranslationTrainingSpec, parse_training
from rosetta_contract.strict_model import ConfigError
from rosetta_operator import evaluation_status as es
from rosetta_operator import policy as pol
from rosetta_operator.act import act
from rosetta_operator.actions import Decision, PostEvent
from rosetta_operator.api_calls import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    check_owned,
    create_jobset,
    create_refusal,
    ensure_configmap,
    first_attempt_only,
    get_jobset,
    hold_in_queue,
    now,
    owner_ref,
    patch_jobset,
    settle_status,
    write_status,
)
from rosetta_operator.applied_spec import (
    APPLIED_SPEC,
    applied_spec_of,
    parsed_spec,
    with_default_image,
    without_mutable,
)
from rosetta_operator.conditions import (
    FALSE,
    TRUE,
    Cond,
    ConditionType,
    Reason,
    changed_fields,
    condition,
    invalid_spec_message,
    refused_message,
    upsert_conditions,
)
from rosetta_operator.decide import decide_status
from rosetta_operator.evaluation_job import required_evaluation_job
from rosetta_operator.handlers.evaluation import start_evaluation
from rosetta_operator.jobset_status import jobset_finished, jobset_succeeded, queue_of
from rosetta_operator.names import TRAINING_LABEL
from rosetta_operator.observation import Seen, gather
from rosetta_operator.operator_metrics import (
    Wait,
    count_phases,
    instrumented,
    record_outcome,
)
from rosetta_operator.render import render, suspend_patch
from rosetta_operator.status import stopped_for_good

# ---------------------------------------------------------------------------- reconcile


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@instrumented("reconcile")
def reconcile(body: kopf.Body, spec: kopf.Spec, name: str, namespace: str, uid: str, memo: kopf.Memo,
              logger: logging.Logger, **_: Any) -> None:
    """Level-based on purpose: the same function serves create, restart and update, so an operator
    restart or a lost handler state can never produce a second JobSet."""
    api = memo.api_client
    generation = body.metadata.get("generation")
    document = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": namespace},
                "spec": with_default_image(spec, memo.get("default_image"))}
    try:
        # Without --policy the default policy applies; a namespace's entry may allow hostPath volumes.
        policy = memo.get("policy")
        allow_host_path = memo.allow_host_path or pol.rules_for(policy, namespace).allows_host_path
        training = parse_training(document, allow_host_path=allow_host_path)
        forbidden = pol.violations(training.spec, policy, namespace)
        if forbidden:
            record_outcome("forbidden")
            report_invalid(api, body, forbidden, logger, reason=Reason.FORBIDDEN_BY_POLICY)
            return
        rendered = render(name, namespace, training.spec, owner=body)
    except ConfigError as exc:
        record_outcome("invalid")
        report_invalid(api, body, exc.errors, logger)
        return
    if training.spec.mode == "evaluate":
        reconcile_evaluation(api, body, training.spec, rendered.configmap, name, namespace, uid, logger)
        return

    jobset_name = rendered.names.jobset
    applied_spec = without_mutable(spec)
    jobset = get_jobset(api, namespace, jobset_name)
    if jobset is None:
        rendered.jobset["metadata"].setdefault("annotations", {})[APPLIED_SPEC] = json.dumps(
            applied_spec, sort_keys=True, separators=(",", ":"))
        child = f"ConfigMap {rendered.names.configmap}"
        try:
            ensure_configmap(api, body, rendered.configmap)
            child = f"JobSet {jobset_name}"
            with memo.own_creations.creating(namespace, jobset_name):
                jobset = create_jobset(api, body, rendered.jobset)
                memo.own_creations.add(jobset)  # its status is written below, not by its ADDED event
        except ApiException as exc:
            refusal = create_refusal(exc)
            if refusal is None:
                raise  # transient (409 after a race, 429, 5xx, RBAC being fixed): kopf retries
            report_refused(api, body, f"the API refused {child}: {refusal.message}", refusal.reason, logger)
            if refusal.reason == Reason.QUOTA_EXCEEDED:
                raise Wait(f"{child}: {refusal.message}", "quota", delay=memo.quota_retry) from None
            record_outcome("rejected")
            return  # for good: the next reconcile is the next edit of the spec (or an operator restart)
        logger.info("created JobSet %s and ConfigMap %s", jobset_name, rendered.names.configmap)
    else:
        check_owned(api, body, jobset)

    applied = applied_spec_of(jobset, applied_spec)
    refused = changed_fields(applied, applied_spec, prefix="spec")
    record_outcome("refused" if refused else "applied")
    # Status describes the gang that runs: after a refused change, that is the applied spec's.
    running = parsed_spec(applied) if refused else training.spec
    if refused:
        spec_applied = Cond(ConditionType.SPEC_APPLIED, FALSE, Reason.SPEC_CHANGE_REFUSED,
                            refused_message(refused))
    else:
        spec_applied = Cond(ConditionType.SPEC_APPLIED, TRUE, Reason.SPEC_IN_SYNC)
    suspend = suspend_patch(jobset, training.spec.suspend)
    if suspend is not None and not jobset_finished(jobset) \
            and not stopped_for_good(body.get("status") or {}):  # stopped for good (decide.stop_for_good)
        # Suspend is the one change a JobSet takes while it exists: the JobSet controller stops the
        # gang's Jobs and recreates them on resume (from the last checkpoint). Only the user's edit
        # is applied, never the same value again: Kueue may have unsuspended it since.
        if "spec" in suspend and queue_of(jobset):
            # Kueue owns a queued JobSet's suspend (it un-suspends whatever it admitted): the user's
            # hold goes through Kueue's own switch, the Workload's spec.active, and Kueue stops or
            # re-queues the gang.
            hold_in_queue(api, namespace, jobset, training.spec.suspend)
            suspend = {"metadata": suspend["metadata"]}
        jobset = patch_jobset(api, namespace, jobset_name, suspend)
        if "spec" in suspend:
            logger.info("JobSet %s: suspend=%s", jobset_name, training.spec.suspend)

    fixed = {
        "observedGeneration": generation,
        "jobSetName": jobset_name,
        "configMapName": rendered.names.configmap,
    }
    if running is not None:
        fixed.update(nodes=running.nodes, gpusPerNode=running.gpus_per_node, worldSize=running.world_size)
    conditions = (Cond(ConditionType.VALID, TRUE, Reason.SPEC_VALID),
                  Cond(ConditionType.CREATED, TRUE, Reason.JOBSET_CREATED,
                       f"JobSet {jobset_name}, ConfigMap {rendered.names.configmap}"),
                  spec_applied)
    known = first_attempt_only(jobset)

    def decide(seen: Seen, parent: Mapping[str, Any], current: Mapping[str, Any]) -> Decision:
        stamp = now()
        decided = decide_status(seen, parent, current, now=stamp)
        desired = {**decided.status, **fixed}
        desired["conditions"] = upsert_conditions(desired.get("conditions") or [], conditions,
                                                  now=stamp, generation=generation)
        # A refusal that the status does not say yet.
        news = bool(refused) and not said(current, spec_applied, generation)
        refusal = (PostEvent(Reason.SPEC_CHANGE_REFUSED, spec_applied.message),) if news else ()
        return Decision(desired, decided.actions + refusal)

    act(api, settle_status(api, namespace, name, uid,
                           lambda training: gather(api, namespace, jobset_name, training, known()), decide,
                           parent=body, gather_again=True))


def reconcile_evaluation(api: kubernetes.client.ApiClient, body: kopf.Body, spec: TranslationTrainingSpec,
                         configmap: dict[str, Any], name: str, namespace: str, uid: str, logger: logging.Logger) -> None:
    """mode evaluate: the ConfigMap and one evaluation Job, no JobSet. The Job's name is fixed, so
    a second reconcile finds it (409); evaluation_changed moves status.evaluation and the phase."""
    job = required_evaluation_job(name, namespace, spec, owner=body)
    job_name = job["metadata"]["name"]
    child = f"ConfigMap {configmap['metadata']['name']}"
    finished = ((body.get("status") or {}).get("evaluation") or {}).get("phase") in es.EvaluationPhase.TERMINAL
    if finished:
        return  # evaluated once: an operator restart or an edit does not run it again, even if its Job is gone
    try:
        ensure_configmap(api, body, configmap)
        child = f"Job {job_name}"
        kubernetes.client.BatchV1Api(api).create_namespaced_job(namespace, job)  # type: ignore[arg-type]  # dict body
        logger.info("created evaluation Job %s and %s", job_name, configmap["metadata"]["name"])
    except ApiException as exc:
        if exc.status == 409 and child.startswith("Job"):
            existing = api.sanitize_for_serialization(
                kubernetes.client.BatchV1Api(api).read_namespaced_job(job_name, namespace))
            check_owned(api, body, existing)
        else:
            refusal = create_refusal(exc)
            if refusal is None:
                raise  # transient: kopf retries
            report_refused(api, body, f"the API refused {child}: {refusal.message}", refusal.reason, logger)
            record_outcome("rejected")
            return
    record_outcome("applied")
    generation = body.metadata.get("generation")
    conditions = (Cond(ConditionType.VALID, TRUE, Reason.SPEC_VALID),
                  Cond(ConditionType.CREATED, TRUE, Reason.EVALUATION_JOB_CREATED,
                       f"Job {job_name}, {configmap['metadata']['name']}"))
    pending, pending_cond = es.pending_evaluation(job_name, "pretrained")

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        desired = dict(current)
        evaluation = current.get("evaluation") or pending
        desired.update(observedGeneration=generation, configMapName=configmap["metadata"]["name"],
                       nodes=1, gpusPerNode=spec.gpus_per_node, worldSize=1, evaluation=evaluation,
                       phase=es.evaluation_run_phase(evaluation))
        new = list(conditions) if current.get("evaluation") else [*conditions, pending_cond]
        desired["conditions"] = upsert_conditions(current.get("conditions") or [], new,
                                                  now=now(), generation=generation)
        return desired

    write_status(api, namespace, name, uid, compute, parent=body)


def said(current: Mapping[str, Any], cond: Cond, generation: Optional[int]) -> bool:
    """Whether the status already says `cond` about this generation: the situation its Warning
    event was posted for, so an operator restart (resume) or a retry posts none again."""
    before = condition(current, cond.type) or {}
    return (before.get("status"), before.get("reason"), before.get("message"), before.get("observedGeneration")) \
        == (cond.status, cond.reason, cond.message, generation)


def report_invalid(api: kubernetes.client.ApiClient, body: kopf.Body, errors: list[tuple[str, str]],
                   logger: logging.Logger, reason: str = Reason.INVALID_SPEC) -> None:
    """A spec that can never work (InvalidSpec) or may not run here (ForbiddenByPolicy): say which
    field and why, in status and, when the status did not say so already, as a Warning event.

    Not a raised kopf.PermanentError: that would mark the handler failed for good, and the next
    edit that fixes the spec must still be reconciled. A JobSet that already runs keeps running:
    only the edit is refused.
    """
    message = invalid_spec_message(errors)
    logger.warning("%s: %s", "forbidden by policy" if reason == Reason.FORBIDDEN_BY_POLICY else "invalid spec",
                   message)
    generation = body.metadata.get("generation")
    name, namespace = body.metadata["name"], body.metadata["namespace"]
    jobset_name = (body.get("status") or {}).get("jobSetName")
    invalid = Cond(ConditionType.VALID, FALSE, reason, message)
    running = bool(jobset_name) and get_jobset(api, namespace, str(jobset_name)) is not None

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> Decision:
        if running:
            desired = dict(current)
            updates = (invalid, Cond(ConditionType.SPEC_APPLIED, FALSE, reason, message))
        else:
            desired = {**current, "phase": Phase.FAILED, "message": message}
            updates = (invalid, Cond(ConditionType.FAILED, TRUE, reason, message))
        desired["observedGeneration"] = generation
        desired["conditions"] = upsert_conditions(current.get("conditions") or [], updates,
                                                  now=now(), generation=generation)
        news = not said(current, invalid, generation)
        return Decision(desired, (PostEvent(reason, message),) if news else ())

    act(api, write_status(api, namespace, name, body.metadata["uid"], compute, parent=body))


def report_refused(api: kubernetes.client.ApiClient, body: kopf.Body, message: str, reason: str,
                   logger: logging.Logger) -> None:
    """The API refused the ConfigMap or JobSet: Created=False with its message, and a Warning event
    when the condition says something new (a refused quota is retried without a new event each time).
    For good (CreateRejected): phase Failed. For now (QuotaExceeded): phase Pending."""
    logger.warning("%s", message)
    generation = body.metadata.get("generation")
    name, namespace = body.metadata["name"], body.metadata["namespace"]
    created = Cond(ConditionType.CREATED, FALSE, reason, message)
    final = reason != Reason.QUOTA_EXCEEDED

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> Decision:
        updates = [Cond(ConditionType.VALID, TRUE, Reason.SPEC_VALID), created]
        if final:
            updates.append(Cond(ConditionType.FAILED, TRUE, reason, message))
        desired = {**current, "phase": Phase.FAILED if final else Phase.PENDING, "message": message,
                   "observedGeneration": generation}
        desired["conditions"] = upsert_conditions(current.get("conditions") or [], updates,
                                                  now=now(), generation=generation)
        news = not said(current, created, generation)
        return Decision(desired, (PostEvent(reason, message),) if news else ())

    act(api, write_status(api, namespace, name, body.metadata["uid"], compute, parent=body))


# --------------------------------------------------------------------------- JobSet watch


@kopf.on.event(JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL, labels={TRAINING_LABEL: kopf.PRESENT})
@instrumented("jobset_changed")
def jobset_changed(event: Mapping[str, Any], body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """The JobSet controller moved: mirror it. The event's body is the JobSet, so it is not read
    again, not even after a conflict: kopf hands one JobSet's events over in order, so any newer
    state comes as a later event and is written by a later call."""
    owner = owner_ref(body)
    if owner is None or (event.get("type") == "ADDED" and memo.own_creations.claim(body)):
        record_outcome("ignored")
        return
    api = memo.api_client
    jobset_name = body.metadata["name"]
    # A deleted JobSet's last state is not "now": a read says whether it (or a successor) exists.
    jobset = None if event.get("type") == "DELETED" else copy.deepcopy(dict(body))

    evaluation = None
    if jobset is not None and jobset_succeeded(jobset):
        evaluation = start_evaluation(api, namespace, owner, jobset, memo)

    def decide(seen: Seen, parent: Mapping[str, Any], current: Mapping[str, Any]) -> Decision:
        stamp = now()
        decided = decide_status(seen, parent, current, now=stamp)
        if evaluation is None or current.get("evaluation"):
            return decided
        desired = dict(decided.status)
        desired["evaluation"], cond = evaluation
        desired["conditions"] = upsert_conditions(desired.get("conditions") or [], [cond], now=stamp,
                                                  generation=parent["metadata"].get("generation"))
        return Decision(desired, decided.actions)

    act(api, settle_status(api, namespace, owner["name"], owner["uid"],
                           lambda training: gather(api, namespace, jobset_name, training, jobset), decide,
                           gather_again=jobset is None))


# ------------------------------------------------------------------------ phase gauge

@kopf.on.event(GROUP, VERSION, PLURAL, id="count_phases")
async def on_training_event(event: Mapping[str, Any], body: kopf.Body, uid: str, **_: Any) -> None:
    """Async on purpose: it only touches memory, so it runs on kopf's event loop at once instead of
    queueing for a worker thread behind the reconciles (about three events per training)."""
    count_phases(event=event, body=body, uid=uid)


