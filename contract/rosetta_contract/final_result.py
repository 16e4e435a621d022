"""A finished run's figures in rank 0's termination message, for the TranslationTraining's status.

While a training runs, the operator scrapes rank 0's metrics endpoint every few seconds into
status.progress. The last steps and the final evaluation usually land between the last scrape and
the pod's exit, so the status of a finished training would show a step and a BLEU from before
its end. Kubernetes keeps a container's termination message after it exits: rank 0 leaves the
final figures there (one line, `Result: {json}`), and the operator folds them into status.progress
when the JobSet succeeds. No torch here: the operator imports this module.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Mapping, Optional

from rosetta_contract import exits
from rosetta_contract.exits import MAX_TERMINATION_MESSAGE

RESULT_PREFIX = "Result: "
# summary.json key -> status.progress field
_FIELDS = (("steps", "step"), ("total_steps", "totalSteps"), ("final_loss", "loss"),
           ("final_score", "bleu"), ("best_score", "bestBleu"))

log = logging.getLogger(__name__)


def result_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The status.progress fields a run's summary gives (finite numbers only)."""
    out: dict[str, Any] = {}
    for key, field in _FIELDS:
        value = summary.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[field] = int(value) if field in ("step", "totalSteps") else round(float(value), 4)
    return out


def report(summary: Mapping[str, Any]) -> None:
    """Write the final figures as the termination message: only in a pod (the kubelet creates the
    file) or where $ROSETTA_TERMINATION_LOG names one."""
    path = exits.termination_log()
    if path is None:
        return
    text = RESULT_PREFIX + json.dumps(result_of(summary), separators=(",", ":"))
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:MAX_TERMINATION_MESSAGE])
    except OSError as exc:  # the summary file and the log still have the figures
        log.warning("cannot write the final result to %s: %s", path, exc)


def _write(text: str) -> None:
    path = exits.termination_log()
    if path is None:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:MAX_TERMINATION_MESSAGE])
    except OSError as exc:  # the scores file and the log still have the figures
        log.warning("cannot write the result to %s: %s", path, exc)


# `rosetta evaluate` (the after-training evaluation Job): the scores, for status.evaluation.
EVALUATION_PREFIX = "Evaluation: "
_SCORES = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")


def evaluation_of(scores: Mapping[str, Any], checkpoint: Optional[str] = None, step: Optional[int] = None) -> dict[str, Any]:
    """The status.evaluation figures of `rosetta evaluate`'s scores (finite numbers only)."""
    out: dict[str, Any] = {}
    for key in _SCORES:
        value = scores.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = round(float(value), 4)
    samples = scores.get("samples")
    if isinstance(samples, int) and not isinstance(samples, bool):
        out["samples"] = samples
    if isinstance(step, int) and not isinstance(step, bool):
        out["step"] = step
    if isinstance(checkpoint, str) and checkpoint:
        out["checkpoint"] = checkpoint[:253]
    return out


def report_evaluation(scores: Mapping[str, Any], checkpoint: Optional[str] = None, step: Optional[int] = None) -> None:
    """Write the evaluation's scores as the termination message (in a pod, as report does)."""
    _write(EVALUATION_PREFIX + json.dumps(evaluation_of(scores, checkpoint, step), separators=(",", ":")))


def parse_evaluation(message: str) -> Optional[dict[str, Any]]:
    """The figures of an `Evaluation: {json}` termination message; None for anything else."""
    figures = _figures(message, EVALUATION_PREFIX)
    return None if figures is None else evaluation_of(figures, figures.get("checkpoint"), figures.get("step"))


def parse(message: str) -> Optional[dict[str, Any]]:
    """The figures of a `Result: {json}` termination message; None for anything else."""
    figures = _figures(message, RESULT_PREFIX)
    return None if figures is None else result_of({key: figures.get(field) for key, field in _FIELDS})


def _figures(message: str, prefix: str) -> Optional[dict[str, Any]]:
    """The JSON object after `prefix` in a termination message; None when it is not one."""
    if not message.startswith(prefix):
        return None
    try:
        figures = json.loads(message[len(prefix):])
    except ValueError:
        return None
    return figures if isinstance(figures, dict) else None
