"""The after-training evaluation Job: created once a training succeeded (judged again by the
policy), and its state mirrored into status.evaluation."""

from __future__ import annotations

import copy
import logging
from typing import Any, Mapping, Optional, cast

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.spec import TranslationTrainingSpec, parse_spec
from rosetta_contract.strict_model import ConfigError
from rosetta_operator import evaluation_status as es
from rosetta_operator import policy as pol
from rosetta_operator.api_calls import (
    create_refusal,
    get_training,
    now,
    owner_ref,
    write_status,
)
from rosetta_operator.applied_spec import (
    applied_spec_of,
    parsed_spec,
    with_default_image,
)
from rosetta_operator.conditions import (
    FALSE,
    TRUE,
    Cond,
    ConditionType,
    Reason,
    invalid_spec_message,
    truncate,
    upsert_conditions,
)
from rosetta_operator.evaluation_job import EVALUATION_LABEL, evaluation_job_name, required_evaluation_job
from rosetta_operator.operator_metrics import (
    instrumented,
)

# ------------------------------------------------------------------ the after-training evaluation


def start_evaluation(api: kubernetes.client.ApiClient, namespace: str, owner: Mapping[str, Any],
                     jobset: Mapping[str, Any], memo: kopf.Memo) -> Optional[tuple[dict[str, Any], Cond]]:
    """Create the evaluation Job of a succeeded training with spec.evaluation.afterTraining, once:
    its name is fixed, so a second call (another JobSet event, an operator restart) finds it (409).
    A training whose evaluation already finished gets none again, even if its Job was deleted.
    Returns status.evaluation and its condition for a Job just created or refused, else None."""
    applied = applied_spec_of(jobset, {})  # what the training ran with
    spec = parsed_spec(applied)
    if spec is None or spec.evaluation.after_training is None:
        return None
    training = get_training(api, namespace, owner["name"])
    if training is None or training["metadata"]["uid"] != owner["uid"] or (training.get("status") or {}).get("evaluation"):
        return None
    checkpoint = spec.evaluation.after_training.checkpoint
    judged, problems, reason = judged_again(applied, namespace, memo)
    if judged is None or problems:
        message = invalid_spec_message(problems)
        kopf.warn(cast(kopf.Body, training), reason=reason,
                  message=truncate(f"no evaluation Job {evaluation_job_name(owner['name'])}: {message}"))
        return ({"phase": es.EvaluationPhase.FAILED, "jobName": evaluation_job_name(owner["name"]),
                 "checkpoint": checkpoint, "message": message},
                Cond(ConditionType.EVALUATED, FALSE, reason, message))
    job = required_evaluation_job(owner["name"], namespace, judged, owner=dict(owner))
    batch = kubernetes.client.BatchV1Api(api)
    try:
        batch.create_namespaced_job(namespace, job)  # type: ignore[arg-type]  # a dict body is sent as is
        logging.getLogger(__name__).info("created evaluation Job %s/%s", namespace, job["metadata"]["name"])
    except ApiException as exc:
        if exc.status == 409:
            # Ours from an attempt whose status write was lost, or a previous training's of the same
            # name still being garbage-collected: that one is never adopted (a later JobSet event, or
            # the replay of every JobSet at an operator restart, tries again).
            existing = api.sanitize_for_serialization(batch.read_namespaced_job(job["metadata"]["name"], namespace))
            refs = (existing.get("metadata") or {}).get("ownerReferences") or []
            if not any(ref.get("uid") == owner["uid"] for ref in refs):
                raise kopf.TemporaryError(f"Job {job['metadata']['name']} exists and is not this training's",
                                          delay=30) from None
        else:
            refusal = create_refusal(exc)
            if refusal is None:
                raise  # transient: kopf calls us again with the next attempt
            kopf.warn(cast(kopf.Body, training), reason=Reason.EVALUATION_FAILED,
                      message=truncate(f"the API refused Job {job['metadata']['name']}: {refusal.message}"))
            return ({"phase": es.EvaluationPhase.FAILED, "jobName": job["metadata"]["name"],
                     "checkpoint": checkpoint, "message": refusal.message},
                    Cond(ConditionType.EVALUATED, FALSE, Reason.EVALUATION_FAILED, refusal.message))
    return es.pending_evaluation(job["metadata"]["name"], checkpoint)


def judged_again(applied: Mapping[str, Any], namespace: str,
                 memo: kopf.Memo) -> tuple[Optional[TranslationTrainingSpec], list[tuple[str, str]], str]:
    """The spec a finished training ran with, judged as a new training's is, before anything more is
    created from it: (the spec or None, what is wrong, the reason to report). Its record on the JobSet
    is as trustworthy as whoever may patch JobSets, and the policy may have changed since it started."""
    policy = memo.get("policy")
    allow_host_path = memo.allow_host_path or pol.rules_for(policy, namespace).allows_host_path
    try:
        spec = parse_spec(with_default_image(applied, memo.get("default_image")), allow_host_path=allow_host_path)
    except ConfigError as exc:
        return None, exc.errors, Reason.INVALID_SPEC
    return spec, pol.violations(spec, policy, namespace), Reason.FORBIDDEN_BY_POLICY


@kopf.on.event("batch", "v1", "jobs", labels={EVALUATION_LABEL: kopf.PRESENT})
@instrumented("evaluation_changed")
def evaluation_changed(event: Mapping[str, Any], body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """The evaluation Job moved: status.evaluation and the Evaluated condition follow it; once it
    finished, its pod's termination message gives the scores."""
    owner = owner_ref(body)
    if owner is None or event.get("type") == "DELETED":
        return  # a deleted Job leaves the last status it wrote
    api = memo.api_client
    job = copy.deepcopy(dict(body))
    name = job["metadata"]["name"]
    pods: list[dict[str, Any]] = []
    conditions = (job.get("status") or {}).get("conditions") or []
    # Finished: its pods' termination messages hold the scores, or why it failed (a source not there).
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == TRUE for c in conditions):
        try:
            listed = kubernetes.client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"job-name={name}")
            pods = [api.sanitize_for_serialization(p) for p in listed.items]
        except ApiException as exc:
            logging.getLogger(__name__).warning("cannot list the pods of Job %s/%s: %s", namespace, name, exc.reason)

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        previous = current.get("evaluation") or {}
        if previous.get("phase") in es.EvaluationPhase.TERMINAL:
            return dict(current)  # finished: a later event (the Job's pods being cleaned up) changes nothing
        evaluation, cond = es.observe_evaluation(job, pods, previous)
        desired = {**current, "evaluation": evaluation, "conditions": upsert_conditions(
            current.get("conditions") or [], [cond], now=now(), generation=parent["metadata"].get("generation"))}
        if (parent.get("spec") or {}).get("mode") == "evaluate":  # the Job is the whole run
            desired["phase"] = es.evaluation_run_phase(evaluation)
        return desired

    write_status(api, namespace, owner["name"], owner["uid"], compute)


