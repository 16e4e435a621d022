"""The CRD's status schema, written out by hand: a structural schema silently prunes the status
fields it does not declare, so every field the operator writes is declared here.
"""

from __future__ import annotations

from typing import Any

from rosetta_contract.resource import PHASES
from rosetta_operator.attempts import MAX_ATTEMPTS


def _obj(description: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": properties, **extra}


def _t(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def _time(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description + " (RFC 3339)."}


def status_schema() -> dict[str, Any]:
    progress = _obj("What the trainer last reported (rank 0).", {
        "step": _t("integer", "Optimizer steps done."),
        "totalSteps": _t("integer", "Steps the run will take."),
        "percent": _t("number", "step / totalSteps × 100."),
        "display": _t("string", 'Human summary for kubectl, e.g. "45% 450/1000".'),
        "epoch": _t("number", "Fractional epoch."),
        "loss": _t("number", "Latest training loss."),
        "learningRate": _t("number", "Current learning rate."),
        "tokensPerSecond": _t("number", "Training throughput over all ranks."),
        "mfu": _t("number", "Model FLOPs utilisation, 0-1."),
        "etaSeconds": _t("number", "Estimated seconds to the last step."),
        "bleu": _t("number", "Latest validation BLEU; the final figure is the primary metric's (ROUGE-L for summarization)."),
        "bestBleu": _t("number", "Best validation score so far of the primary metric: BLEU, or ROUGE-L for summarization."),
        "validationLoss": _t("number", "Latest validation loss, beside loss to show overfitting."),
        "genderGapBleu": _t("number", "MT-GenEval masculine minus feminine BLEU, mean over target languages "
                                      "(positive: the model favours the masculine)."),
        "gender": {"type": "object", "description": "MT-GenEval per target language.",
                   "additionalProperties": _obj("One target language's MT-GenEval figures.", {
                       "gapBleu": _t("number", "Masculine minus feminine BLEU."),
                       "gapAccuracy": _t("number", "Masculine minus feminine accuracy, percentage points."),
                       "accuracy": _t("number", "Percent of translations with no word of the wrong gender."),
                       "bleuMasculine": _t("number", "BLEU of the masculine half."),
                       "bleuFeminine": _t("number", "BLEU of the feminine half."),
                       "accuracyMasculine": _t("number", "Accuracy of the masculine half, percent."),
                       "accuracyFeminine": _t("number", "Accuracy of the feminine half, percent."),
                   })},
        "lastCheckpoint": _t("string", "Path of the newest checkpoint."),
        "lastCheckpointStep": _t("integer", "Step of the newest checkpoint."),
        "activity": _t("string", "What rank 0 is doing: training, evaluating or checkpointing.",
                       enum=["training", "evaluating", "checkpointing"]),
        "updatedAt": _time("When the trainer reported this"),
    })
    condition = _obj("One aspect of the training's state.", {
        "type": _t("string", "Condition type, e.g. Running, Succeeded, Failed, Suspended, Admitted, Scheduled, Stalled."),
        "status": _t("string", "True, False or Unknown.", enum=["True", "False", "Unknown"]),
        "reason": _t("string", "CamelCase machine-readable reason."),
        "message": _t("string", "Human-readable detail."),
        "lastTransitionTime": _time("When status last changed"),
        "observedGeneration": _t("integer", "metadata.generation the condition was computed from."),
    }, required=["type", "status"])
    return _obj("Observed state, written by the operator.", {
        "phase": _t("string", "Where the training is in its life.", enum=list(PHASES)),
        "message": _t("string", "Why it is in this phase."),
        "observedGeneration": _t("integer", "metadata.generation the status reflects."),
        "jobSetName": _t("string", "The JobSet that runs the training."),
        "configMapName": _t("string", "The ConfigMap with the trainer config."),
        "nodes": _t("integer", "Pods in the running JobSet."),
        "gpusPerNode": _t("integer", "GPUs per pod in the running JobSet."),
        "worldSize": _t("integer", "Trainer processes in all."),
        "restarts": _t("integer", "Gang restarts after a failure; these count towards failurePolicy.maxRestarts."),
        "preemptions": _t("integer", "Gang restarts after a pod was preempted, evicted or drained "
                                     "(DisruptionTarget); these do not count towards maxRestarts."),
        "stalls": _t("integer", "Times rank 0's heartbeat stopped for spec.faultTolerance.stallTimeoutSeconds "
                                "(condition Stalled); under stallAction restart each one is also a restart."),
        "startTime": _time("When the pods first ran"),
        "completionTime": _time("When the training succeeded or failed"),
        "excludedNodes": {"type": "array", "maxItems": 256,
                          "description": "Nodes kept out of the next attempts because a pod failed the pre-flight "
                                         "check on them (spec.faultTolerance.preflight), at most maxExcludedNodes.",
                          "items": _obj("One excluded node.", {
                              "node": _t("string", "The node's name."),
                              "reason": _t("string", "Why: NodeUnhealthy."),
                              "message": _t("string", "What the pre-flight check said."),
                              "attempt": _t("integer", "The attempt in which it failed."),
                              "time": _time("When it was excluded"),
                          }, required=["node"])},
        "attempts": {"type": "array", "maxItems": MAX_ATTEMPTS,
                     "description": f"The newest {MAX_ATTEMPTS} attempts (the first run and every gang restart), oldest "
                                    "first; `rosetta logs NAME --attempt N` reads an ended one's logs.",
                     "items": _obj("One attempt of the gang.", {
                         "attempt": _t("integer", "0 for the first run, then one more per gang restart."),
                         "startTime": _time("When the operator first saw it running (or its end)"),
                         "endTime": _time("When it ended"),
                         "reason": _t("string", "Why it ended: Succeeded, or a failure class (DataInvalid, ConfigError, "
                                                "NonFinite, CudaOutOfMemory, CollectiveTimeout, OOMKilled, "
                                                "ImagePullFailed, NodeLost, Preempted, Stalled, Error)."),
                         "message": _t("string", "What the failing pod said, its pod and node first."),
                         "exitCode": _t("integer", "The failing container's exit code."),
                         "pod": _t("string", "The pod that failed first, by the most specific reason."),
                         "node": _t("string", "The node it ran on."),
                         "nodeRank": _t("integer", "Its node rank (completion index)."),
                         "lastStep": _t("integer", "The last optimizer step the operator saw in the attempt."),
                     }, required=["attempt"])},
        "conditions": {"type": "array", "description": "Latest observations, one per type.",
                       "items": condition, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]},
        "progress": progress,
        "evaluation": _obj("The after-training evaluation (spec.evaluation.afterTraining): a CPU Job that "
                           "evaluates one checkpoint on the test sets once the training succeeded.", {
            "phase": _t("string", "Where the evaluation Job is.", enum=["Pending", "Running", "Succeeded", "Failed"]),
            "jobName": _t("string", "The evaluation Job."),
            "checkpoint": _t("string", "Which checkpoint was asked for: final, best or averaged."),
            "checkpointPath": _t("string", "The checkpoint directory it evaluated, e.g. step-00010000."),
            "step": _t("integer", "The training step of that checkpoint."),
            "samples": _t("integer", "Test pairs evaluated."),
            "bleu": _t("number", "Test BLEU (mean over target languages)."),
            "chrf": _t("number", "Test chrF."),
            "rouge1": _t("number", "Test ROUGE-1 (summarization)."),
            "rouge2": _t("number", "Test ROUGE-2."),
            "rougeL": _t("number", "Test ROUGE-L."),
            "rougeLsum": _t("number", "Test ROUGE-Lsum."),
            "message": _t("string", "Why it failed."),
            "startTime": _time("When the Job started"),
            "completionTime": _time("When the Job succeeded"),
        }),
        # kopf keeps handler progress here as a fallback to annotations; pruning it
        # would make kopf retry handlers that already finished.
        "kopf": {"type": "object", "description": "kopf's own bookkeeping.",
                 "x-kubernetes-preserve-unknown-fields": True},
    })
