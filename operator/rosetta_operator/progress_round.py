"""One round of the progress daemon (handlers.report_progress): read the training, find rank 0's
pod, scrape its /metrics (scrape.py), and patch status.progress when it moved (progress.py reads
the figures). Returns the round's outcome, which the operator counts.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import kubernetes

from rosetta_contract.config import MetricsSpec
from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator import scrape
from rosetta_operator.api_calls import get_training, now, write_status

# A trainer that does not answer this fast is busy or gone; the next round tries again. The whole
# exchange, not each read (scrape.py); nor is more than SCRAPE_MAX_BYTES of an answer read.
SCRAPE_TIMEOUT = scrape.TIMEOUT
SCRAPE_MAX_BYTES = scrape.MAX_BYTES
DEFAULT_METRICS_PORT = MetricsSpec.model_fields["port"].default


def metrics_port(spec: Mapping[str, Any]) -> int:
    return int((spec.get("metrics") or {}).get("port", DEFAULT_METRICS_PORT) or 0)


def update_progress(api: kubernetes.client.ApiClient, namespace: str, name: str, uid: str) -> str:
    """One round: read the training, find rank 0, scrape it, patch status.progress if it moved."""
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
        return "no_pod"
    try:
        text = scrape.get(pr.metrics_url(pod, port), timeout=SCRAPE_TIMEOUT, max_bytes=SCRAPE_MAX_BYTES)
    except scrape.ScrapeFailed as exc:  # starting, busy or gone (keep the last progress), or not a trainer
        if exc.notable:
            logging.getLogger(__name__).warning("progress of %s/%s: %s", namespace, name, exc.reason)
        return exc.outcome
    try:
        metrics = pr.parse_metrics(text)
    except Exception:  # whatever the parser makes of a hostile reply; its message would quote the reply
        logging.getLogger(__name__).warning("progress of %s/%s: rank 0's answer is not Prometheus text",
                                            namespace, name)
        return "unreachable"
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
