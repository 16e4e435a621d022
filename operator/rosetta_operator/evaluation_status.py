"""The after-training evaluation Job → status.evaluation and the Evaluated condition. Pure, like
status.py.

spec.evaluation.afterTraining: once the JobSet succeeded, one batch/v1 Job evaluates a checkpoint
on CPU. The training's phase stays Succeeded (the model is trained and saved whatever the
evaluation does); status.evaluation and the Evaluated condition follow the Job. In mode evaluate
the Job is the whole run, and its phase is the training's (evaluation_run_phase).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, cast

from rosetta_contract.final_result import parse_evaluation
from rosetta_contract.resource import Phase
from rosetta_operator.conditions import FALSE, TRUE, Cond, ConditionType, Reason, truncate
from rosetta_operator.evaluation_job import EVALUATION_CHECKPOINT
from rosetta_operator.status import data_invalid_message


class EvaluationPhase:
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    TERMINAL = frozenset({SUCCEEDED, FAILED})


def _job_condition(job: Mapping[str, Any], type_: str) -> Optional[Mapping[str, Any]]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == TRUE:
            return cast(Mapping[str, Any], cond)
    return None


def evaluation_scores(pods: Iterable[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The figures `rosetta evaluate` left in a pod's termination message (Evaluation: {json})."""
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            message = (((container.get("state") or {}).get("terminated") or {}).get("message") or "").strip()
            figures = parse_evaluation(message)
            if figures is not None:
                return figures
    return None


def pending_evaluation(job_name: str, checkpoint: str) -> tuple[dict[str, Any], Cond]:
    """status.evaluation and the condition right after the Job was created."""
    return ({"phase": EvaluationPhase.PENDING, "jobName": job_name, "checkpoint": checkpoint},
            Cond(ConditionType.EVALUATED, FALSE, Reason.EVALUATION_PENDING, f"Job {job_name} created"))


def evaluation_run_phase(evaluation: Mapping[str, Any]) -> str:
    """The training's phase in mode evaluate, where the evaluation Job is the whole run."""
    return {EvaluationPhase.RUNNING: Phase.RUNNING, EvaluationPhase.SUCCEEDED: Phase.SUCCEEDED,
            EvaluationPhase.FAILED: Phase.FAILED}.get(str(evaluation.get("phase")), Phase.PENDING)


def observe_evaluation(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], previous: Optional[Mapping[str, Any]]) -> tuple[dict[str, Any], Cond]:
    """What the evaluation Job (and, once it finished, its pods) says: status.evaluation and the
    Evaluated condition. Scores, once read, stay."""
    name = (job.get("metadata") or {}).get("name") or ""
    status = job.get("status") or {}
    evaluation = {k: v for k, v in (previous or {}).items() if k not in ("phase", "message")}
    evaluation["jobName"] = name
    checkpoint = ((job.get("metadata") or {}).get("annotations") or {}).get(EVALUATION_CHECKPOINT)
    if checkpoint:  # its first event may come before the status write that says so
        evaluation["checkpoint"] = checkpoint
    if status.get("startTime"):
        evaluation["startTime"] = status["startTime"]
    failed = _job_condition(job, "Failed")
    if _job_condition(job, "Complete") is not None:
        evaluation["phase"] = EvaluationPhase.SUCCEEDED
        if status.get("completionTime"):
            evaluation["completionTime"] = status["completionTime"]
        figures = evaluation_scores(pods) or {}
        evaluation.update({k: v for k, v in figures.items() if k != "checkpoint"})
        if figures.get("checkpoint"):
            evaluation["checkpointPath"] = figures["checkpoint"]
        scores = ", ".join(f"{k} {figures[k]}" for k in ("bleu", "chrf", "rouge1", "rouge2", "rougeL") if k in figures)
        message = (f"{figures.get('checkpoint', 'the checkpoint')} on {figures.get('samples', '?')} test pairs: "
                   f"{scores or 'no scores in its termination message'}")
        return evaluation, Cond(ConditionType.EVALUATED, TRUE, Reason.EVALUATION_SUCCEEDED, truncate(message))
    if failed is not None:
        evaluation["phase"] = EvaluationPhase.FAILED
        evaluation["message"] = truncate(data_invalid_message(pods) or failed.get("message") or failed.get("reason")
                                         or "the Job failed")
        return evaluation, Cond(ConditionType.EVALUATED, FALSE, Reason.EVALUATION_FAILED,
                                f"Job {name}: {evaluation['message']} (kubectl logs job/{name})")
    running = bool(status.get("active"))
    evaluation["phase"] = EvaluationPhase.RUNNING if running else EvaluationPhase.PENDING
    return evaluation, Cond(ConditionType.EVALUATED, FALSE,
                            Reason.EVALUATION_RUNNING if running else Reason.EVALUATION_PENDING, f"Job {name}")
