"""Every Prometheus metric Rosetta exposes, by its full name as scraped.

One list per endpoint: the trainer's rank 0 (`spec.metrics.port`) and the operator
(`rosetta operator --metrics-port`). Dashboards and alerts are checked against these lists, and
tests/integration/test_progress.py checks that the live endpoints expose every name. Counters are
listed with their `_total` suffix, histograms by their base name (`_bucket`, `_sum`, `_count`
follow), info metrics with their `_info` suffix. docs/observability.md describes each one.
"""

from __future__ import annotations

TRAINER_METRICS: tuple[str, ...] = (
    # labels: training, namespace
    "rosetta_step",
    "rosetta_total_steps",
    "rosetta_epoch",
    "rosetta_loss",
    "rosetta_learning_rate",
    "rosetta_tokens_per_second",
    "rosetta_samples_per_second",
    "rosetta_grad_norm",
    "rosetta_mfu",
    "rosetta_flops_per_second",
    "rosetta_step_seconds",
    "rosetta_dataloader_wait_seconds",
    "rosetta_step_compute_seconds",
    "rosetta_step_optimizer_seconds",
    "rosetta_last_checkpoint_step",
    "rosetta_last_checkpoint_info",      # + path
    "rosetta_checkpoint_save_seconds",
    "rosetta_checkpoint_bytes",
    "rosetta_world_size",
    "rosetta_restarts",
    "rosetta_resumed_from_step",
    "rosetta_bleu",
    "rosetta_best_bleu",
    "rosetta_validation_loss",
    "rosetta_heartbeat_timestamp_seconds",   # the operator's stall clock (docs/operator.md, Hangs)
    # + lang
    "rosetta_eval_bleu",
    "rosetta_eval_chrf",
    "rosetta_eval_gender_gap_bleu",
    "rosetta_eval_gender_gap_accuracy",
    "rosetta_eval_gender_accuracy",
    # + lang, gender (masculine, feminine)
    "rosetta_eval_gender_bleu",
    "rosetta_eval_gender_accuracy_by_gender",
    # + node
    "rosetta_node_tokens_per_second",
    # + rank
    "rosetta_gpu_memory_bytes",
    # + phase (train, evaluate, checkpoint): 1 for the current one
    "rosetta_phase",
)

OPERATOR_METRICS: tuple[str, ...] = (
    "rosetta_operator_reconciles_total",          # handler, outcome
    "rosetta_operator_reconcile_errors_total",    # handler
    "rosetta_operator_reconcile_seconds",         # handler (histogram)
    "rosetta_operator_trainings",                 # phase
    "rosetta_operator_training_phase",            # namespace, training, phase: 1 for the current status.phase
    "rosetta_operator_jobsets_created_total",
    "rosetta_operator_time_to_running_seconds",   # histogram
    "rosetta_operator_status_patches_total",
    "rosetta_operator_progress_scrapes_total",    # outcome
    "rosetta_operator_training_restarts",         # namespace, training: status.restarts
    "rosetta_operator_training_max_restarts",     # namespace, training: spec.failurePolicy.maxRestarts
    "rosetta_operator_training_stalled",          # namespace, training: 1 while the Stalled condition is True
    "rosetta_operator_training_excluded_nodes",   # namespace, training: len(status.excludedNodes)
    "rosetta_operator_attempts_ended_total",      # reason: a FailureClass or Succeeded
    "rosetta_operator_nodes_excluded_total",      # node: excluded after a failed pre-flight check
)

# Metric families whose samples carry a suffix after the name above.
HISTOGRAMS = frozenset({"rosetta_operator_reconcile_seconds", "rosetta_operator_time_to_running_seconds"})
