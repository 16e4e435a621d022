"""The operator's own Prometheus metrics: handler calls (outcome, errors, seconds), trainings per
phase, each training's phase, gang restarts, stall and excluded nodes, time to Running, status
patches, progress scrapes, attempts ended by reason and nodes excluded by node.

The names are listed in rosetta_contract.metric_names.OPERATOR_METRICS, which the chart's dashboards
and alerts are checked against; docs/observability.md describes them.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import threading
import time
from collections import Counter
from typing import Any, Callable, Mapping, Optional

import kopf
import prometheus_client

from rosetta_contract.failures import FailureClass
from rosetta_contract.pod_fields import FailurePolicySpec
from rosetta_contract.resource import PHASES
from rosetta_operator.attempts import SUCCEEDED
from rosetta_operator.status import is_stalled

RECONCILES = prometheus_client.Counter(
    "rosetta_operator_reconciles", "Handler calls by handler and outcome", ["handler", "outcome"])
RECONCILE_ERRORS = prometheus_client.Counter(
    "rosetta_operator_reconcile_errors", "Handler calls that raised (kopf retries them)", ["handler"])
RECONCILE_SECONDS = prometheus_client.Histogram(
    "rosetta_operator_reconcile_seconds", "Wall seconds per handler call", ["handler"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
TRAININGS = prometheus_client.Gauge(
    "rosetta_operator_trainings", "TranslationTrainings by status.phase (Unknown: no status yet)", ["phase"])
JOBSETS_CREATED = prometheus_client.Counter(
    "rosetta_operator_jobsets_created", "JobSets created for TranslationTrainings")
TIME_TO_RUNNING = prometheus_client.Histogram(
    "rosetta_operator_time_to_running_seconds",
    "Seconds from a TranslationTraining's creation to its first Running phase",
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400))
STATUS_PATCHES = prometheus_client.Counter(
    "rosetta_operator_status_patches", "TranslationTraining status patches (only sent on change)")
# Per training, for the alert on restarts that use up failurePolicy.maxRestarts faster than the
# training progresses; the labels are the trainer's own (namespace, training), so the two join.
TRAINING_RESTARTS = prometheus_client.Gauge(
    "rosetta_operator_training_restarts", "Gang restarts after a failure (status.restarts), which count "
    "towards failurePolicy.maxRestarts", ["namespace", "training"])
TRAINING_MAX_RESTARTS = prometheus_client.Gauge(
    "rosetta_operator_training_max_restarts", "The training's spec.failurePolicy.maxRestarts",
    ["namespace", "training"])
# Per training, for the stall alert: the operator's own verdict, whatever spec.faultTolerance.stallAction.
TRAINING_STALLED = prometheus_client.Gauge(
    "rosetta_operator_training_stalled", "1 while the training's Stalled condition is True (no heartbeat from "
    "rank 0 for spec.faultTolerance.stallTimeoutSeconds), else 0", ["namespace", "training"])
# Per training, for an alert per failed training that can be routed by its namespace: the count by
# phase above says only how many there are, so a second failure beside a first one changes nothing.
# One series per training, the current phase's; it moves with the phase and goes with the training.
TRAINING_PHASE = prometheus_client.Gauge(
    "rosetta_operator_training_phase", "1 for the training's status.phase (Unknown: no status yet)",
    ["namespace", "training", "phase"])
PROGRESS_SCRAPES = prometheus_client.Counter(
    "rosetta_operator_progress_scrapes", "Scrapes of rank 0's metrics by outcome "
    "(updated, unchanged, no_pod, unreachable, too_large, no_step)", ["outcome"])
# Per training, for the dashboard: how many nodes its next attempts avoid (node_health.py).
TRAINING_EXCLUDED_NODES = prometheus_client.Gauge(
    "rosetta_operator_training_excluded_nodes", "Nodes the training keeps out of its next attempts after a "
    "failed pre-flight check (status.excludedNodes)", ["namespace", "training"])
# Fleet-wide, by reason only: the reasons are a closed set, so the series are as many whatever the
# number of trainings; which training it was, status.attempts says. An attempt is counted under each
# reason it is given: a vaguer one first (Error, from the JobSet's restart count) and a more specific
# one once the pod that caused it reports (OOMKilled) both count, so no specific reason is missed;
# the sum over reasons exceeds the attempts by those corrections.
ATTEMPTS_ENDED = prometheus_client.Counter(
    "rosetta_operator_attempts_ended", "Attempts of a training's gang that ended, by status.attempts[].reason "
    "(a failure class or Succeeded); an attempt whose reason is made more specific later counts under both",
    ["reason"])
# By node only, for an alert the platform team acts on (drain, repair): one series per node that
# failed a pre-flight check since the operator started, bounded by the cluster's nodes.
NODES_EXCLUDED = prometheus_client.Counter(
    "rosetta_operator_nodes_excluded", "Nodes kept out of a training's next attempts after a failed pre-flight "
    "check (status.excludedNodes), by node: once per training that excludes it", ["node"])
REASONS: tuple[str, ...] = (*(v for k, v in vars(FailureClass).items() if k.isupper()), SUCCEEDED)
for _phase in (*PHASES, "Unknown"):
    TRAININGS.labels(_phase)  # every phase is exported, 0 when no training is in it
for _outcome in ("updated", "unchanged", "no_pod", "unreachable", "too_large", "no_step"):
    PROGRESS_SCRAPES.labels(_outcome)
for _reason in REASONS:
    ATTEMPTS_ENDED.labels(_reason)  # at 0 from the start: increase() misses a series' first sample
# A training's own series, removed with it.
_TRAINING_GAUGES = (TRAINING_RESTARTS, TRAINING_MAX_RESTARTS, TRAINING_STALLED, TRAINING_EXCLUDED_NODES)

_handler_state = threading.local()


class Wait(kopf.TemporaryError):
    """A retry that is planned, not a failure (a ResourceQuota that is full): kopf calls the handler
    again after `delay`, and `instrumented` counts the call under `outcome`."""

    def __init__(self, message: str, outcome: str, delay: float):
        super().__init__(message, delay=delay)
        self.outcome = outcome


def record_outcome(outcome: str) -> None:
    """Name how the running handler call ended (default: ok); the `instrumented` wrapper counts it."""
    _handler_state.outcome = outcome


def instrumented(handler: str) -> Callable[..., Any]:
    """Count and time every call of a sync handler: outcome, errors, seconds. Sync handlers run in
    kopf's worker threads, one call per thread at a time, so the outcome is a thread-local. A
    `Wait` is counted under its own outcome, not as an error."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _handler_state.outcome = "ok"
            started = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except Wait as wait:
                RECONCILES.labels(handler, wait.outcome).inc()
                raise
            except Exception:
                RECONCILE_ERRORS.labels(handler).inc()
                RECONCILES.labels(handler, "error").inc()
                raise
            finally:
                RECONCILE_SECONDS.labels(handler).observe(time.perf_counter() - started)
            RECONCILES.labels(handler, _handler_state.outcome).inc()
            return result
        return wrapper
    return decorate


# ------------------------------------------------------------------------ phase gauge

_PHASES: dict[str, str] = {}   # uid → phase of every TranslationTraining the watch has seen
_NAMES: dict[str, tuple[str, str]] = {}   # uid → (namespace, name): the restart gauges' labels
_PHASE_LABELS: dict[str, tuple[str, str, str]] = {}   # uid → (namespace, name, phase) of its phase series
_PHASES_LOCK = threading.Lock()



def reset_phase_gauges() -> None:
    """Forget an earlier run's view: the phase gauges are rebuilt from the watch's initial listing."""
    with _PHASES_LOCK:
        _PHASES.clear()
        _publish_phases()
        for labels in _NAMES.values():
            for gauge in _TRAINING_GAUGES:
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        _NAMES.clear()
        for phase_labels in _PHASE_LABELS.values():
            with contextlib.suppress(KeyError):
                TRAINING_PHASE.remove(*phase_labels)
        _PHASE_LABELS.clear()


def count_phases(event: Mapping[str, Any], body: Mapping[str, Any], uid: str, **_: Any) -> None:
    """Keep rosetta_operator_trainings{phase}, and each training's phase and restart gauges, equal to
    what the API holds, deletions included.
    Called on the event loop; the lock is for the startup hook's reset, which runs in a worker thread
    before any watch starts, and costs nothing uncontended."""
    with _PHASES_LOCK:
        if event.get("type") == "DELETED":
            _PHASES.pop(uid, None)
        else:
            _PHASES[uid] = (body.get("status") or {}).get("phase") or "Unknown"
        _publish_phases()
        _publish_restarts(event, body, uid)
        _publish_training_phase(event, body, uid)


def _publish_training_phase(event: Mapping[str, Any], body: Mapping[str, Any], uid: str) -> None:
    """rosetta_operator_training_phase of one training: its current phase's series only."""
    meta = body.get("metadata") or {}
    old = _PHASE_LABELS.pop(uid, None)
    new = None
    if event.get("type") != "DELETED" and meta.get("name"):
        new = (meta.get("namespace") or "", meta["name"], _PHASES[uid])
        _PHASE_LABELS[uid] = new
    if old and old != new:
        with contextlib.suppress(KeyError):
            TRAINING_PHASE.remove(*old)
    if new:
        TRAINING_PHASE.labels(*new).set(1)


def _publish_restarts(event: Mapping[str, Any], body: Mapping[str, Any], uid: str) -> None:
    """rosetta_operator_training_(max_)restarts, _stalled and _excluded_nodes of one training; its series
    go with it."""
    meta = body.get("metadata") or {}
    if event.get("type") == "DELETED" or not meta.get("name"):
        labels = _NAMES.pop(uid, None)
        if labels:
            for gauge in _TRAINING_GAUGES:
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        return
    labels = _NAMES[uid] = (meta.get("namespace") or "", meta["name"])
    policy = (body.get("spec") or {}).get("failurePolicy") or {}
    max_restarts = policy.get("maxRestarts")
    if max_restarts is None:
        max_restarts = FailurePolicySpec().max_restarts
    TRAINING_RESTARTS.labels(*labels).set(int((body.get("status") or {}).get("restarts") or 0))
    TRAINING_MAX_RESTARTS.labels(*labels).set(int(max_restarts))
    TRAINING_STALLED.labels(*labels).set(1 if is_stalled(body.get("status") or {}) else 0)
    TRAINING_EXCLUDED_NODES.labels(*labels).set(len((body.get("status") or {}).get("excludedNodes") or []))


def _publish_phases() -> None:
    counts = Counter(_PHASES.values())
    for phase in {*PHASES, "Unknown", *counts}:
        TRAININGS.labels(phase).set(counts.get(phase, 0))


def record_status_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Count what a status write told for the first time: each reason an attempt was given
    (rosetta_operator_attempts_ended_total) and each node newly excluded
    (rosetta_operator_nodes_excluded_total). Over the status before and after one write the API
    accepted (api_calls.write_status), so a retried write counts once, and an operator restart,
    which finds the status already written, recounts nothing."""
    given = {(a.get("attempt"), a.get("reason")) for a in before.get("attempts") or []}
    for entry in after.get("attempts") or []:
        reason = entry.get("reason")
        if reason and (entry.get("attempt"), reason) not in given:
            ATTEMPTS_ENDED.labels(reason).inc()
    excluded = {e.get("node") for e in before.get("excludedNodes") or []}
    for entry in after.get("excludedNodes") or []:
        node = entry.get("node")
        if node and node not in excluded:
            NODES_EXCLUDED.labels(node).inc()
            excluded.add(node)


def observe_time_to_running(created: Optional[str], started: str) -> None:
    try:
        seconds = (_parse_time(started) - _parse_time(created)).total_seconds()
    except (TypeError, ValueError):
        return
    TIME_TO_RUNNING.observe(max(0.0, seconds))


def _parse_time(stamp: Optional[str]) -> datetime.datetime:
    return datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
