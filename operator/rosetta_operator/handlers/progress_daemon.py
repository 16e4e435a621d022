"""While the JobSet is live, rank 0's metrics into status.progress (and the stall clock)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any, Mapping

import kopf

from rosetta_contract.resource import GROUP, PLURAL, VERSION
from rosetta_operator.handlers.startup import ACTIVE_PHASES
from rosetta_operator.operator_metrics import (
    PROGRESS_SCRAPES,
    RECONCILE_ERRORS,
    RECONCILE_SECONDS,
    RECONCILES,
)
from rosetta_operator.progress_round import StallWatch, metrics_port, update_progress

# ----------------------------------------------------------------------------- progress


def progress_active(status: Mapping[str, Any], spec: Mapping[str, Any], **_: Any) -> bool:
    return bool(status.get("jobSetName")) and status.get("phase") in ACTIVE_PHASES \
        and metrics_port(spec) > 0


@kopf.daemon(GROUP, VERSION, PLURAL, when=progress_active, cancellation_timeout=5.0)  # type: ignore[arg-type]
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
