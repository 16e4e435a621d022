"""The kopf handlers: what the operator does on each event (spec.py → render.py → status.py).

Only the kopf registrations and what they decide live here; beside it: api_calls.py (the API calls:
status, JobSet, ConfigMap, refusals, Kueue Workloads), observation.py (the status a JobSet's state
means), applied_spec.py (the spec a JobSet was built from, which edits are measured against),
operator_metrics.py (the operator's Prometheus metrics and the instrumented wrapper),
event_memory.py (what repeats cost nothing), progress_round.py with progress.py and scrape.py
(rank 0's metrics → status.progress).

    TranslationTraining created / resumed / spec changed  →  reconcile()
        invalid spec       → status Failed + condition Valid=False (InvalidSpec) + Warning event; nothing created
        not allowed by the admin's policy (--policy)  →  the same, with reason ForbiddenByPolicy
        no JobSet yet      → create ConfigMap, then JobSet (owned by the training: deletion is plain GC)
        API refuses either → for good (422, 400, 413, an admission denial): status Failed, condition
                             Created=False (CreateRejected), Warning event, no retry until the spec changes;
                             for now (a ResourceQuota): Created=False (QuotaExceeded), retried every 30 s
        JobSet exists      → an edit of spec.suspend is applied to it (rosetta.dev/applied-suspend says
                             which value was applied last); any other change is refused (SpecChangeRefused)
    JobSet event (labelled rosetta.dev/training)  →  jobset_changed()  →  status phase and conditions
    Kueue Workload event (owned by a JobSet)  →  workload_changed()  →  phase Queued / condition Admitted
    training pod event, PodScheduled changed  →  scheduling_changed()  →  condition Scheduled (+ Warning)
    TranslationTraining Running or Restarting  →  report_progress() daemon, every --progress-interval s:
        rank 0's pod IP → GET :spec.metrics.port/metrics → progress.py → status.progress (on change)
        no heartbeat for spec.faultTolerance.stallTimeoutSeconds → stall.py → condition Stalled
                           + Warning event; stallAction restart: the attempt's Job fails (the JobSet
                           restarts the gang), fail: the gang stops and the training fails
    any TranslationTraining event  →  count_phases()  →  the rosetta_operator_trainings{phase} gauge

Status is written by one helper, api_calls.write_status, so the reconcile handler and the JobSet
watch never overwrite each other's view (its docstring says how). Every JobSet change arrives as a watch
event handled after it, so the last writer still saw the newest JobSet. It patches only when something
changed.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import logging
import os
import random
import sys
import time
from typing import Any, Mapping, Optional, cast

import kopf
import kubernetes
import prometheus_client
from kubernetes.client.exceptions import ApiException

from rosetta_contract.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION, Phase
from rosetta_contract.spec import TranslationTrainingSpec, parse_spec, parse_training
from rosetta_contract.strict_model import ConfigError
from rosetta_operator import evaluation_status as es
from rosetta_operator import node_health
from rosetta_operator import policy as pol
from rosetta_operator import progress as pr
from rosetta_operator import status as st
from rosetta_operator.api_calls import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSION,
    WORKLOAD_PLURAL,
    check_owned,
    create_jobset,
    create_refusal,
    ensure_configmap,
    first_attempt_only,
    get_jobset,
    get_training,
    hold_in_queue,
    jobset_and_training,
    now,
    owner_ref,
    patch_jobset,
    write_status,
)
from rosetta_operator.applied_spec import (
    APPLIED_SPEC,
    applied_spec_of,
    parsed_spec,
    with_default_image,
    without_mutable,
)
from rosetta_operator.attempts import FailedPods, Failure, pod_failure
from rosetta_operator.evaluation_job import EVALUATION_LABEL, evaluation_job_name, required_evaluation_job
from rosetta_operator.event_memory import Decisions, OwnCreations
from rosetta_operator.observation import jobset_finished, observe, record_pod_failure
from rosetta_operator.operator_metrics import (
    PROGRESS_SCRAPES,
    RECONCILE_ERRORS,
    RECONCILE_SECONDS,
    RECONCILES,
    Wait,
    count_phases,
    instrumented,
    record_outcome,
    reset_phase_gauges,
)
from rosetta_operator.progress_round import StallWatch, metrics_port, update_progress
from rosetta_operator.render import TRAINING_LABEL, render, suspend_patch

# The apiserver stores JSON nested up to 10,000 levels (its decoder's limit) in the schemaless fields
# (affinity, deepspeedConfig). kopf decodes every watch event with json.loads, and at Python's default
# recursion limit of 1,000 one such object made the watch, and so the operator, exit. Decoded, the spec
# is refused with its field by spec.plain, which bounds the depth at strict_yaml.MAX_DEPTH.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 25_000))

# Env knobs: the CLI flags --allow-host-path, --policy and --progress-interval reach kopf through memo,
# `kopf run` through these.
ALLOW_HOST_PATH_ENV = "ROSETTA_ALLOW_HOST_PATH"
POLICY_ENV = "ROSETTA_POLICY"
PROGRESS_INTERVAL_ENV = "ROSETTA_PROGRESS_INTERVAL"
# The trainer image of a spec without spec.image (the chart's trainer.image); unset: the spec's own
# default, DEFAULT_IMAGE.
DEFAULT_IMAGE_ENV = "ROSETTA_DEFAULT_IMAGE"
# How soon a create that a ResourceQuota refused is tried again: quota frees up as other work ends.
QUOTA_RETRY_DELAY = 30.0
DEFAULT_PROGRESS_INTERVAL = 15.0
# Phases whose JobSet may have a live rank 0 to scrape. Not Pending: that is "not every node's job
# is ready", and no rank logs a step before the whole gang has joined, so a scrape could only say
# no_pod or no_step; skipping it also spares a queued training kopf's finalizer patch. Restarting
# stays so that a gang restart does not stop and restart the daemon (and its finalizer) each time.
ACTIVE_PHASES = frozenset({Phase.RUNNING, Phase.RESTARTING})

# ------------------------------------------------------------------------------ startup


@kopf.on.startup()  # type: ignore[arg-type]  # kopf's protocol types are narrower than its calls
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """All operator tuning, in one place."""
    # Events are posted explicitly, one per situation (the Warnings below, when a condition says
    # something new); log lines stay in the log. kopf before 1.44 also posted every per-object log
    # line as an event (reason Logging): one per retry of a quota-blocked create, one per failed
    # progress scrape, and a second Warning beside each InvalidSpec.
    settings.posting.loggers = False
    settings.posting.level = logging.WARNING
    # The CRD schema is structural: kopf's default status.kopf bookkeeping would be silently pruned,
    # and its "touch" patches (to wake itself up) would then never arrive. Annotations are kept.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rosetta.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="rosetta.dev", key="last-handled-configuration")
    # Put on a training only while its progress daemon runs (kopf stops daemons before deletion).
    settings.persistence.finalizer = "rosetta.dev/finalizer"
    # One replica is the default deployment (no KopfPeering CRD to install). With --peering,
    # kopf pauses every peer when two share a priority, so each replica draws its own: the
    # highest acts, the others stand by until it disappears.
    if not settings.peering.mandatory:
        settings.peering.standalone = True
    elif settings.peering.priority == 0:
        settings.peering.priority = random.SystemRandom().randint(1, 2**31 - 1)
    # Reconnect watches well before proxies and load balancers cut idle connections.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Error backoff for handlers that raise (API hiccups): quick first retries, capped at a minute.
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    # When the watch stream lags (a burst of new trainings), kopf waits this long for its own
    # last patch to come back before treating an event as news. The default of 5 s made a
    # create handler run again for a training it had just handled: harmless (create is
    # idempotent) but it doubled the backlog under load.
    settings.persistence.consistency_timeout = 60.0
    # Server-side filters: the cluster's other pods and Workloads never reach this process.
    settings.watching.label_selectors["v1", "pods"] = TRAINING_LABEL
    settings.watching.label_selectors[KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL] = KUEUE_JOB_UID_LABEL
    # Handlers are synchronous (kubernetes client); threads bound the concurrent API calls.
    settings.execution.max_workers = 8

    if "policy" not in memo:  # `kopf run`; `rosetta operator --policy` loads it before kopf starts
        memo.policy = pol.load_policy(os.environ[POLICY_ENV]) if os.environ.get(POLICY_ENV) else None
    memo.allow_host_path = bool(memo.get("allow_host_path", os.environ.get(ALLOW_HOST_PATH_ENV) == "1")) \
        or bool(memo.policy and memo.policy.allows_host_path)
    # How often the progress daemon scrapes each active training's rank 0.
    memo.progress_interval = float(memo.get("progress_interval")
                                   or os.environ.get(PROGRESS_INTERVAL_ENV) or DEFAULT_PROGRESS_INTERVAL)
    memo.default_image = memo.get("default_image") or os.environ.get(DEFAULT_IMAGE_ENV) or None
    # The phase gauge is rebuilt from the watch's initial listing: forget an earlier run's view.
    reset_phase_gauges()
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    memo.api_client = kubernetes.client.ApiClient()
    memo.own_creations = OwnCreations()
    memo.unschedulable_pods = st.UnschedulablePods()
    memo.failed_pods = FailedPods()
    memo.workload_decisions = Decisions()
    if memo.get("metrics_port"):
        prometheus_client.start_http_server(memo.metrics_port)
    logger.info("rosetta operator configured (allow_host_path=%s, progress_interval=%ss, policy: %s)",
                memo.allow_host_path, memo.progress_interval,
                # No --policy still limits: the defaults apply (policy.py).
                ", ".join((memo.policy or pol.Policy()).limits()) or "no limits")


@kopf.on.cleanup()
def close_client(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("api_client") is not None:
        memo.api_client.close()


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
            report_invalid(api, body, forbidden, logger, reason=st.Reason.FORBIDDEN_BY_POLICY)
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
            if refusal.reason == st.Reason.QUOTA_EXCEEDED:
                raise Wait(f"{child}: {refusal.message}", "quota", delay=QUOTA_RETRY_DELAY) from None
            record_outcome("rejected")
            return  # for good: the next reconcile is the next edit of the spec (or an operator restart)
        logger.info("created JobSet %s and ConfigMap %s", jobset_name, rendered.names.configmap)
    else:
        check_owned(api, body, jobset)

    applied = applied_spec_of(jobset, applied_spec)
    refused = st.changed_fields(applied, applied_spec, prefix="spec")
    record_outcome("refused" if refused else "applied")
    # Status describes the gang that runs: after a refused change, that is the applied spec's.
    running = parsed_spec(applied) if refused else training.spec
    if refused:
        spec_applied = st.Cond(st.ConditionType.SPEC_APPLIED, st.FALSE, st.Reason.SPEC_CHANGE_REFUSED,
                               st.refused_message(refused))
    else:
        spec_applied = st.Cond(st.ConditionType.SPEC_APPLIED, st.TRUE, st.Reason.SPEC_IN_SYNC)
    suspend = suspend_patch(jobset, training.spec.suspend)
    if suspend is not None and not jobset_finished(jobset) \
            and not st.stopped_for_good(body.get("status") or {}):  # stopped for good (observe)
        # Suspend is the one change a JobSet takes while it exists: the JobSet controller stops the
        # gang's Jobs and recreates them on resume (from the last checkpoint). Only the user's edit
        # is applied, never the same value again: Kueue may have unsuspended it since.
        if "spec" in suspend and st.queue_of(jobset):
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
    conditions = (st.Cond(st.ConditionType.VALID, st.TRUE, st.Reason.SPEC_VALID),
                  st.Cond(st.ConditionType.CREATED, st.TRUE, st.Reason.JOBSET_CREATED,
                          f"JobSet {jobset_name}, ConfigMap {rendered.names.configmap}"),
                  spec_applied)
    known = first_attempt_only(jobset)
    news = False  # a refusal that the status does not say yet

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        nonlocal news
        news = bool(refused) and not said(current, spec_applied, generation)
        desired = observe(api, namespace, jobset_name, parent, current, known())
        desired.update(fixed)
        desired["conditions"] = st.upsert_conditions(desired.get("conditions") or [], conditions,
                                                     now=now(), generation=generation)
        return desired

    write_status(api, namespace, name, uid, compute, parent=body)
    if news:
        kopf.warn(body, reason=st.Reason.SPEC_CHANGE_REFUSED, message=spec_applied.message)


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
    conditions = (st.Cond(st.ConditionType.VALID, st.TRUE, st.Reason.SPEC_VALID),
                  st.Cond(st.ConditionType.CREATED, st.TRUE, st.Reason.EVALUATION_JOB_CREATED,
                          f"Job {job_name}, {configmap['metadata']['name']}"))
    pending, pending_cond = es.pending_evaluation(job_name, "pretrained")

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        desired = dict(current)
        evaluation = current.get("evaluation") or pending
        desired.update(observedGeneration=generation, configMapName=configmap["metadata"]["name"],
                       nodes=1, gpusPerNode=spec.gpus_per_node, worldSize=1, evaluation=evaluation,
                       phase=es.evaluation_run_phase(evaluation))
        new = list(conditions) if current.get("evaluation") else [*conditions, pending_cond]
        desired["conditions"] = st.upsert_conditions(current.get("conditions") or [], new,
                                                     now=now(), generation=generation)
        return desired

    write_status(api, namespace, name, uid, compute, parent=body)


def said(current: Mapping[str, Any], cond: st.Cond, generation: Optional[int]) -> bool:
    """Whether the status already says `cond` about this generation: the situation its Warning
    event was posted for, so an operator restart (resume) or a retry posts none again."""
    before = st.condition(current, cond.type) or {}
    return (before.get("status"), before.get("reason"), before.get("message"), before.get("observedGeneration")) \
        == (cond.status, cond.reason, cond.message, generation)


def report_invalid(api: kubernetes.client.ApiClient, body: kopf.Body, errors: list[tuple[str, str]],
                   logger: logging.Logger, reason: str = st.Reason.INVALID_SPEC) -> None:
    """A spec that can never work (InvalidSpec) or may not run here (ForbiddenByPolicy): say which
    field and why, in status and, when the status did not say so already, as a Warning event.

    Not a raised kopf.PermanentError: that would mark the handler failed for good, and the next
    edit that fixes the spec must still be reconciled. A JobSet that already runs keeps running:
    only the edit is refused.
    """
    message = st.invalid_spec_message(errors)
    logger.warning("%s: %s", "forbidden by policy" if reason == st.Reason.FORBIDDEN_BY_POLICY else "invalid spec",
                   message)
    generation = body.metadata.get("generation")
    name, namespace = body.metadata["name"], body.metadata["namespace"]
    jobset_name = (body.get("status") or {}).get("jobSetName")
    invalid = st.Cond(st.ConditionType.VALID, st.FALSE, reason, message)
    news = False

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        nonlocal news
        news = not said(current, invalid, generation)
        if jobset_name and get_jobset(api, namespace, jobset_name) is not None:
            desired = dict(current)
            updates = (invalid, st.Cond(st.ConditionType.SPEC_APPLIED, st.FALSE, reason, message))
        else:
            desired = {**current, "phase": Phase.FAILED, "message": message}
            updates = (invalid, st.Cond(st.ConditionType.FAILED, st.TRUE, reason, message))
        desired["observedGeneration"] = generation
        desired["conditions"] = st.upsert_conditions(current.get("conditions") or [], updates,
                                                     now=now(), generation=generation)
        return desired

    write_status(api, namespace, name, body.metadata["uid"], compute, parent=body)
    if news:
        kopf.warn(body, reason=reason, message=message)


def report_refused(api: kubernetes.client.ApiClient, body: kopf.Body, message: str, reason: str,
                   logger: logging.Logger) -> None:
    """The API refused the ConfigMap or JobSet: Created=False with its message, and a Warning event
    when the condition says something new (a refused quota is retried without a new event each time).
    For good (CreateRejected): phase Failed. For now (QuotaExceeded): phase Pending."""
    logger.warning("%s", message)
    generation = body.metadata.get("generation")
    name, namespace = body.metadata["name"], body.metadata["namespace"]
    created = st.Cond(st.ConditionType.CREATED, st.FALSE, reason, message)
    news = False
    final = reason != st.Reason.QUOTA_EXCEEDED

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        nonlocal news
        news = not said(current, created, generation)
        updates = [st.Cond(st.ConditionType.VALID, st.TRUE, st.Reason.SPEC_VALID), created]
        if final:
            updates.append(st.Cond(st.ConditionType.FAILED, st.TRUE, reason, message))
        desired = {**current, "phase": Phase.FAILED if final else Phase.PENDING, "message": message,
                   "observedGeneration": generation}
        desired["conditions"] = st.upsert_conditions(current.get("conditions") or [], updates,
                                                     now=now(), generation=generation)
        return desired

    write_status(api, namespace, name, body.metadata["uid"], compute, parent=body)
    if news:
        kopf.warn(body, reason=reason, message=message)


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
    if jobset is not None and st.jobset_succeeded(jobset):
        evaluation = start_evaluation(api, namespace, owner, jobset, memo)

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        desired = observe(api, namespace, jobset_name, parent, current, jobset)
        if evaluation is not None and not current.get("evaluation"):
            desired["evaluation"], cond = evaluation
            desired["conditions"] = st.upsert_conditions(desired.get("conditions") or [], [cond], now=now(),
                                                         generation=parent["metadata"].get("generation"))
        return desired

    write_status(api, namespace, owner["name"], owner["uid"], compute)


# ------------------------------------------------------------------ the after-training evaluation


def start_evaluation(api: kubernetes.client.ApiClient, namespace: str, owner: Mapping[str, Any],
                     jobset: Mapping[str, Any], memo: kopf.Memo) -> Optional[tuple[dict[str, Any], st.Cond]]:
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
        message = st.invalid_spec_message(problems)
        kopf.warn(cast(kopf.Body, training), reason=reason,
                  message=st.truncate(f"no evaluation Job {evaluation_job_name(owner['name'])}: {message}"))
        return ({"phase": es.EvaluationPhase.FAILED, "jobName": evaluation_job_name(owner["name"]),
                 "checkpoint": checkpoint, "message": message},
                st.Cond(st.ConditionType.EVALUATED, st.FALSE, reason, message))
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
            kopf.warn(cast(kopf.Body, training), reason=st.Reason.EVALUATION_FAILED,
                      message=st.truncate(f"the API refused Job {job['metadata']['name']}: {refusal.message}"))
            return ({"phase": es.EvaluationPhase.FAILED, "jobName": job["metadata"]["name"],
                     "checkpoint": checkpoint, "message": refusal.message},
                    st.Cond(st.ConditionType.EVALUATED, st.FALSE, st.Reason.EVALUATION_FAILED, refusal.message))
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
        return None, exc.errors, st.Reason.INVALID_SPEC
    return spec, pol.violations(spec, policy, namespace), st.Reason.FORBIDDEN_BY_POLICY


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
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == st.TRUE for c in conditions):
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
        desired = {**current, "evaluation": evaluation, "conditions": st.upsert_conditions(
            current.get("conditions") or [], [cond], now=now(), generation=parent["metadata"].get("generation"))}
        if (parent.get("spec") or {}).get("mode") == "evaluate":  # the Job is the whole run
            desired["phase"] = es.evaluation_run_phase(evaluation)
        return desired

    write_status(api, namespace, owner["name"], owner["uid"], compute)


# ------------------------------------------------------------------ Kueue and the scheduler


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL, labels={KUEUE_JOB_UID_LABEL: kopf.PRESENT})
@instrumented("workload_changed")
def workload_changed(event: Mapping[str, Any], body: kopf.Body, namespace: str, uid: str, memo: kopf.Memo,
                     **_: Any) -> None:
    """Kueue admitted, queued or evicted a JobSet: say so now, not at the JobSet's next event
    (a queued JobSet has none while it waits)."""
    decisions = memo.workload_decisions
    ref = next((r for r in body.metadata.get("ownerReferences") or []
                if r.get("kind") == "JobSet" and r.get("apiVersion", "").startswith(f"{JOBSET_GROUP}/")), None)
    if event.get("type") == "DELETED" or ref is None:
        decisions.forget(uid)
        record_outcome("ignored")
        return
    workload = copy.deepcopy(dict(body))
    if not decisions.changed(uid, st.workload_admission(workload, dict(body.spec or {}).get("queueName") or "")):
        record_outcome("ignored")  # Kueue's bookkeeping, not a new decision
        return
    api = memo.api_client
    try:
        jobset, owner = jobset_and_training(api, namespace, ref["name"], ref.get("uid"))
        if owner is None:
            record_outcome("ignored")
            return
        known = first_attempt_only(jobset)
        write_status(api, namespace, owner["name"], owner["uid"], lambda parent, current: observe(
            api, namespace, ref["name"], parent, current, known(), workload))
    except Exception:
        decisions.forget(uid)  # the next event of this Workload tries again
        raise


@kopf.on.event("v1", "pods", labels={TRAINING_LABEL: kopf.PRESENT}, id="pod_scheduling")  # type: ignore[arg-type]
async def on_pod_event(event: Mapping[str, Any], body: kopf.Body, namespace: str, uid: str, memo: kopf.Memo,
                       **_: Any) -> None:
    """Async on purpose: nearly every pod event is no news about scheduling (UnschedulablePods says
    which are), and those should not queue for a worker thread behind the reconciles."""
    waiting = memo.unschedulable_pods
    jobset_name = (body.metadata.get("labels") or {}).get(pr.JOBSET_NAME_LABEL)
    if jobset_name and event.get("type") != "DELETED" and node_health.gated(body):
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, lift_gate, memo.api_client, namespace, copy.deepcopy(dict(body)))
    failure = memo.failed_pods.news(uid, pod_failure(body)) if jobset_name else None
    if failure is not None:
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, contextvars.copy_context().run, pod_failed, memo.api_client, namespace, jobset_name, failure)
        except Exception:
            memo.failed_pods.forget(uid)  # the pod's next event tries again
            raise
    if event.get("type") == "DELETED" or not jobset_name:
        waiting.forget(uid)
        memo.failed_pods.forget(uid)
        return
    scheduled = waiting.update(uid, (namespace, jobset_name), st.pod_scheduling(body))
    if scheduled is None:
        return
    try:
        # The worker thread needs this context: kopf.warn finds kopf's event poster in it.
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, scheduling_changed, memo.api_client, namespace, jobset_name,
            scheduled)
    except Exception:
        waiting.forget(uid)  # the pod's next event tries again
        raise


@instrumented("pod_scheduling")
def scheduling_changed(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str,
                       scheduled: st.Cond) -> None:
    """Fold a gang's Scheduled condition into its training's status; one Warning event when it
    turns False."""
    jobset, owner = jobset_and_training(api, namespace, jobset_name)
    if owner is None:
        record_outcome("ignored")
        return
    known = first_attempt_only(jobset)
    turned: list[Mapping[str, Any]] = []  # the training, when this write turned the condition False

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        generation = parent["metadata"].get("generation")
        conditions = st.upsert_conditions(current.get("conditions") or [], [scheduled], now=now(),
                                          generation=generation)
        desired = observe(api, namespace, jobset_name, parent, {**current, "conditions": conditions}, known())
        before = st.condition(current, st.ConditionType.SCHEDULED) or {}
        after = st.condition(desired, st.ConditionType.SCHEDULED) or {}
        turned[:] = [parent] if after.get("status") == st.FALSE != before.get("status") else []
        return desired

    write_status(api, namespace, owner["name"], owner["uid"], compute)
    if turned:
        kopf.warn(cast(kopf.Body, turned[0]), reason=st.Reason.UNSCHEDULABLE, message=scheduled.message)


@instrumented("pod_failed")
def pod_failed(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, failure: Failure) -> None:
    """Fold why a pod stopped into its training's status.attempts (observation.record_pod_failure);
    one Warning event, with the class as its reason, when that changed what the attempt ended with."""
    jobset, owner = jobset_and_training(api, namespace, jobset_name)
    if owner is None:
        record_outcome("ignored")
        return
    known = first_attempt_only(jobset)
    told: list[Mapping[str, Any]] = []  # the training, when this write gave the attempt a new reason
    excluded: list[bool] = []  # True when this write kept the pod's node out of the next attempts

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        desired = record_pod_failure(api, parent, current, known() or jobset, jobset_name, failure)
        before = {a.get("attempt"): a.get("reason") for a in current.get("attempts") or []}
        after = {a.get("attempt"): a.get("reason") for a in desired.get("attempts") or []}
        told[:] = [parent] if any(before.get(k) != v for k, v in after.items()) \
            and not st.stopped_for_good(desired) else []
        excluded[:] = [desired.get("excludedNodes") != current.get("excludedNodes")]
        return desired

    write_status(api, namespace, owner["name"], owner["uid"], compute)
    if told:
        kopf.warn(cast(kopf.Body, told[0]), reason=failure.failure_class, message=failure.message)
        if excluded and excluded[0]:
            kopf.warn(cast(kopf.Body, told[0]), reason=st.Reason.NODE_EXCLUDED,
                      message=f"node {failure.node} is kept out of the next attempts: {failure.message}")


@instrumented("lift_gate")
def lift_gate(api: kubernetes.client.ApiClient, namespace: str, pod: Mapping[str, Any]) -> None:
    """A gang pod behind the node-health gate: keep it off the excluded nodes and let it schedule."""
    nodes = node_health.release(api, namespace, pod)
    if nodes is None:
        record_outcome("ignored")
    elif nodes:
        logging.getLogger(__name__).info("pod %s/%s kept off %s", namespace, pod["metadata"]["name"], ", ".join(nodes))


# ------------------------------------------------------------------------ phase gauge

@kopf.on.event(GROUP, VERSION, PLURAL, id="count_phases")
async def on_training_event(event: Mapping[str, Any], body: kopf.Body, uid: str, **_: Any) -> None:
    """Async on purpose: it only touches memory, so it runs on kopf's event loop at once instead of
    queueing for a worker thread behind the reconciles (about three events per training)."""
    count_phases(event=event, body=body, uid=uid)


# ----------------------------------------------------------------------------- progress


def _progress_active(status: Mapping[str, Any], spec: Mapping[str, Any], **_: Any) -> bool:
    return bool(status.get("jobSetName")) and status.get("phase") in ACTIVE_PHASES \
        and metrics_port(spec) > 0


@kopf.daemon(GROUP, VERSION, PLURAL, when=_progress_active, cancellation_timeout=5.0)  # type: ignore[arg-type]
async def report_progress(stopped: kopf.DaemonStopped, name: str, namespace: str, uid: str, memo: kopf.Memo,
                          logger: logging.Logger, **_: Any) -> None:
    """While the JobSet is live: scrape rank 0 every memo.progress_interval seconds into
    status.progress. A daemon rather than a timer so that the interval is set at startup; async so
    that it holds no worker thread while it waits. kopf stops it when the phase leaves ACTIVE_PHASES
    (and, like any daemon, keeps a finalizer on the training meanwhile). It also keeps the heartbeat
    clock of stall.py between rounds."""
    loop = asyncio.get_running_loop()
    stalls = StallWatch()
    while not stopped:
        started = time.perf_counter()
        try:
            # The worker thread needs this context: kopf.warn finds kopf's event poster in it.
            outcome = await loop.run_in_executor(None, contextvars.copy_context().run, update_progress,
                                                 memo.api_client, namespace, name, uid, stalls)
        except Exception as exc:  # never let a scrape kill the daemon: the next round retries
            logger.warning("progress: %s", exc)
            outcome = "error"
        RECONCILE_SECONDS.labels("progress").observe(time.perf_counter() - started)
        RECONCILES.labels("progress", outcome).inc()
        if outcome == "error":
            RECONCILE_ERRORS.labels("progress").inc()
        else:
            PROGRESS_SCRAPES.labels(outcome).inc()
        await stopped.wait(memo.progress_interval)
