"""One round of the progress daemon (handlers.report_progress): read the training, find rank 0's
pod, scrape its /metrics (scrape.py), patch status.progress when it moved (progress.py reads
the figures), then judge whether the training is stalled (stall.py) and act as
spec.faultTolerance says. Returns the round's outcome, which the operator counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, cast

import kopf
import kubernetes

from rosetta_contract.evaluation_fields import MetricsSpec
from rosetta_contract.fault_tolerance_fields import FaultToleranceSpec
from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator import scrape
from rosetta_operator import stall as sl
from rosetta_operator.api_calls import end_attempt, get_training, now, set_jobset_suspend, write_status
from rosetta_operator.conditions import Reason, truncate
from rosetta_operator.status import is_stalled, stopped_for_good

# A trainer that does not answer this fast is busy or gone; the next round tries again. The whole
# exchange, not each read (scrape.py); nor is more than SCRAPE_MAX_BYTES of an answer read.
SCRAPE_TIMEOUT = scrape.TIMEOUT
SCRAPE_MAX_BYTES = scrape.MAX_BYTES
DEFAULT_METRICS_PORT = MetricsSpec.model_fields["port"].default
DEFAULT_FAULT_TOLERANCE = FaultToleranceSpec()

log = logging.getLogger(__name__)


def metrics_port(spec: Mapping[str, Any]) -> int:
    return int((spec.get("metrics") or {}).get("port", DEFAULT_METRICS_PORT) or 0)


def stall_settings(spec: Mapping[str, Any]) -> tuple[int, str]:
    """(stallTimeoutSeconds, stallAction) of a spec the operator accepted, defaults filled in."""
    given = spec.get("faultTolerance") or {}
    return (int(given.get("stallTimeoutSeconds", DEFAULT_FAULT_TOLERANCE.stall_timeout_seconds)),
            str(given.get("stallAction", DEFAULT_FAULT_TOLERANCE.stall_action)))


@dataclass
class StallWatch:
    """What the daemon of one training remembers between rounds (stall.Watch); an operator
    restart forgets it, which only delays a verdict."""

    watch: Optional[sl.Watch] = None


def update_progress(api: kubernetes.client.ApiClient, namespace: str, name: str, uid: str,
                    stalls: Optional[StallWatch] = None) -> str:
    """One round: read the training, find rank 0, scrape it, patch status.progress if it moved;
    with `stalls`, the daemon's memory, also watch its heartbeat."""
    training = get_training(api, namespace, name)
    if training is None:
        return "no_pod"
    port = metrics_port(training.get("spec") or {})
    jobset_name = (training.get("status") or {}).get("jobSetName")
    if not port or not jobset_name:
        return "no_pod"
    pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{pr.JOBSET_NAME_LABEL}={jobset_name}")
    pod = pr.rank0_pod([api.sanitize_for_serialization(p) for p in pods.items], jobset_name)
    if pod is None:
        if stalls is not None:
            stalls.watch = None
        return "no_pod"
    outcome, metrics = _scrape(pod, port, namespace, name)
    if metrics is not None:
        outcome = _report(api, training, metrics, namespace, name, uid)
    if stalls is not None:
        watch_heartbeat(api, training, pod, metrics, stalls)
    return outcome


def _scrape(pod: Mapping[str, Any], port: int, namespace: str, name: str) -> tuple[str, Optional[dict[str, Any]]]:
    """(outcome, parsed metrics); the metrics are None when rank 0 gave none."""
    try:
        text = scrape.get(pr.metrics_url(pod, port), timeout=SCRAPE_TIMEOUT, max_bytes=SCRAPE_MAX_BYTES)
    except scrape.ScrapeFailed as exc:  # starting, busy or gone (keep the last progress), or not a trainer
        if exc.notable:
            log.warning("progress of %s/%s: %s", namespace, name, exc.reason)
        return exc.outcome, None
    try:
        return "", pr.parse_metrics(text)
    except Exception:  # whatever the parser makes of a hostile reply; its message would quote the reply
        log.warning("progress of %s/%s: rank 0's answer is not Prometheus text", namespace, name)
        return "unreachable", None


def _report(api: kubernetes.client.ApiClient, training: Mapping[str, Any], metrics: Mapping[str, Any],
            namespace: str, name: str, uid: str) -> str:
    progress = pr.progress_from(metrics, now=now())
    if progress is None:
        return "no_step"
    outcome = "unchanged"

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        nonlocal outcome
        if current.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
            return dict(current)  # a scrape from before the end must not undo the final figures
        if not pr.changed(current.get("progress"), progress):
            return dict(current)
        outcome = "updated"
        return {**current, "progress": {**(current.get("progress") or {}), **progress}}

    # The training read above is at most a scrape old; a conflict re-reads it.
    write_status(api, namespace, name, uid, compute, parent=training)
    return outcome


def watch_heartbeat(api: kubernetes.client.ApiClient, training: Mapping[str, Any], pod: Mapping[str, Any],
                    metrics: Optional[Mapping[str, Any]], stalls: StallWatch) -> None:
    """Follow rank 0's heartbeat; on a stall, say so (the Stalled condition, one Warning event) and
    act as spec.faultTolerance.stallAction says. A round that finds the same stall again acts again
    (the last round's action may have failed) but says nothing new."""
    clock = time.monotonic()
    beat = sl.beat_from(metrics) if metrics is not None else None
    stalls.watch = sl.follow(stalls.watch, (pod.get("metadata") or {}).get("uid"), beat, clock)
    timeout, action = stall_settings(training.get("spec") or {})
    found = sl.verdict(training.get("status") or {}, stalls.watch, clock, timeout, action)
    if not (found.stalled or found.recovered):
        return
    meta = training["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    turned: list[Mapping[str, Any]] = []  # the training, when this write turned Stalled True

    def compute(parent: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        if stopped_for_good(current) or current.get("phase") in Phase.TERMINAL:
            return dict(current)
        turned[:] = [parent] if found.stalled and not is_stalled(current) else []
        return sl.stall_status(current, found, action=action, now=now(),
                               generation=parent["metadata"].get("generation"))

    # A round's earlier progress write makes this one conflict and read the training again.
    write_status(api, namespace, name, meta["uid"], compute, parent=training)
    if not found.stalled:
        return
    if turned:
        log.warning("%s/%s stalled: %s", namespace, name, found.stalled)
        kopf.warn(cast(kopf.Body, turned[0]), reason=Reason.STALLED, message=truncate(found.stalled))
    if action == "restart":
        end_attempt(api, namespace, pod)
    elif action == "fail":
        jobset_name = (training.get("status") or {}).get("jobSetName")
        if jobset_name:
            set_jobset_suspend(api, namespace, jobset_name, True)
