"""The kopf handlers: what the operator does on each event (spec.py → render.py → status.py).

Only the kopf registrations and what they decide live here; beside it: api_calls.py (the API calls:
status, JobSet, ConfigMap, refusals, Kueue Workloads), observation.py, decide.py and act.py (the status
a JobSet's state means, in three steps: below), applied_spec.py (the spec a JobSet was built from, which edits are measured against),
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

Status is written by one helper, api_calls.settle_status (write_status for a status that needs no
look at the cluster), so the reconcile handler and the JobSet watch never overwrite each other's view
(its docstring says how). Every JobSet change arrives as a watch event handled after it, so the last
writer still saw the newest JobSet. It patches only when something changed. A handler that mirrors the
JobSet goes gather, decide, act: observation.gather reads the JobSet (and, when they have something
to say, its pods and Kueue's Workload) into a `Seen`; decide.py turns it, with the training's status,
into the desired status and the actions (suspend the JobSet, post an event), purely, so a 409 runs only
that again on the training read afresh; act.py carries the actions out once the write landed.
"""

from __future__ import annotations

# Importing a module registers its handlers with kopf (`kopf run -m rosetta_operator.handlers`).
from rosetta_operator.handlers import evaluation, kueue, lifecycle, pods, progress_daemon, startup
from rosetta_operator.handlers.evaluation import evaluation_changed, start_evaluation
from rosetta_operator.handlers.kueue import workload_changed
from rosetta_operator.handlers.lifecycle import jobset_changed, reconcile
from rosetta_operator.handlers.pods import on_pod_event
from rosetta_operator.handlers.progress_daemon import progress_active, report_progress
from rosetta_operator.handlers.startup import (
    ACTIVE_PHASES,
    DEFAULT_IMAGE_ENV,
    POLICY_ENV,
    PROGRESS_INTERVAL_ENV,
    QUOTA_RETRY_DELAY,
    configure,
)

__all__ = ["ACTIVE_PHASES", "DEFAULT_IMAGE_ENV", "POLICY_ENV", "PROGRESS_INTERVAL_ENV", "QUOTA_RETRY_DELAY",
           "progress_active", "configure", "evaluation", "evaluation_changed", "jobset_changed", "kueue",
           "lifecycle", "on_pod_event", "pods", "progress_daemon", "reconcile", "report_progress",
           "start_evaluation", "startup", "workload_changed"]
