"""Operator start-up: the settings kopf and the CLI flags give (memo), the API client, the
in-memory bookkeeping the other handlers share; and the client's close at exit."""

from __future__ import annotations

import logging
import os
import random
import sys
from typing import Any

import kopf
import kubernetes
import prometheus_client

from rosetta_contract.resource import Phase
from rosetta_operator import policy as pol
from rosetta_operator.api_calls import (
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSION,
    WORKLOAD_PLURAL,
)
from rosetta_operator.event_memory import Decisions, OwnCreations
from rosetta_operator.names import TRAINING_LABEL
from rosetta_operator.operator_metrics import (
    reset_phase_gauges,
)
from rosetta_operator.scheduling_status import UnschedulablePods

# The apiserver stores JSON nested up to 10,000 levels (its decoder's limit) in the schemaless fields
# (affinity, deepspeedConfig). kopf decodes every watch event with json.loads, and at Python's default
# recursion limit of 1,000 one such object made the watch, and so the operator, exit. Decoded, the spec
# is refused with its field by spec.plain, which bounds the depth at strict_yaml.MAX_DEPTH.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 25_000))

# Env knobs: the CLI flags --allow-host-path, --policy, --progress-interval and --quota-retry reach kopf through memo,
# `kopf run` through these.
ALLOW_HOST_PATH_ENV = "ROSETTA_ALLOW_HOST_PATH"
POLICY_ENV = "ROSETTA_POLICY"
PROGRESS_INTERVAL_ENV = "ROSETTA_PROGRESS_INTERVAL"
QUOTA_RETRY_ENV = "ROSETTA_QUOTA_RETRY"
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
    memo.quota_retry = float(memo.get("quota_retry") or os.environ.get(QUOTA_RETRY_ENV) or QUOTA_RETRY_DELAY)
    memo.default_image = memo.get("default_image") or os.environ.get(DEFAULT_IMAGE_ENV) or None
    # The phase gauge is rebuilt from the watch's initial listing: forget an earlier run's view.
    reset_phase_gauges()
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    memo.api_client = kubernetes.client.ApiClient()
    memo.own_creations = OwnCreations()
    memo.unschedulable_pods = UnschedulablePods()
    memo.failed_pods = Decisions()
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


