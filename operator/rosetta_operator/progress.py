"""Trainer metrics → status.progress. Pure: no I/O, no clock (callers pass `now`).

The operator's progress daemon (handlers.report_progress) finds rank 0's pod with `rank0_pod`,
scrapes `http://<pod IP>:<spec.metrics.port>/metrics`, and turns the text into the
`status.progress` object with `parse_metrics` and `progress_from`. It patches only when
`changed` says a figure moved, so an idle or finished trainer costs no writes.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

from prometheus_client.parser import text_string_to_metric_families

from rosetta_contract.final_result import parse as parse_result
from rosetta_operator.names import COMPLETION_INDEX, REPLICATED_JOB, REPLICATED_JOB_LABEL

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
# The progress fields that carry no measurement: a new timestamp alone is not a change.
VOLATILE = frozenset({"updatedAt"})
# status.progress.activity for the trainer's rosetta_phase{phase}.
ACTIVITIES = {"train": "training", "evaluate": "evaluating", "checkpoint": "checkpointing"}


def parse_metrics(text: str, prefix: str = "rosetta_") -> dict[str, Any]:
    """`{name: value}` for the trainer's run-wide gauges; labelled series keep their labels.

    Plain gauges (one sample per name) map to a float; `rosetta_eval_bleu` and the like map to
    `{lang: value}`; the checkpoint info metric maps to its `path` label. NaN is dropped.
    """
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix):
                continue
            value = sample.value
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if sample.name.endswith("_info"):
                out[sample.name] = sample.labels.get("path")
                continue
            extra = {k: v for k, v in sample.labels.items() if k not in ("training", "namespace")}
            if extra:
                key = next(iter(extra.values())) if len(extra) == 1 else tuple(sorted(extra.items()))
                out.setdefault(sample.name, {})[key] = value
            else:
                out[sample.name] = value
    return out


def _num(metrics: Mapping[str, Any], name: str) -> Optional[float]:
    value = metrics.get(name)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _round(value: Optional[float], digits: int) -> Optional[float]:
    return None if value is None else round(value, digits)


def activity(metrics: Mapping[str, Any]) -> Optional[str]:
    """What rank 0 says it is doing (rosetta_phase): training, evaluating or checkpointing."""
    phases = metrics.get("rosetta_phase")
    current = [p for p, v in phases.items() if v == 1] if isinstance(phases, Mapping) else []
    return ACTIVITIES.get(current[0]) if len(current) == 1 and isinstance(current[0], str) else None


def progress_from(metrics: Mapping[str, Any], *, now: str) -> Optional[dict[str, Any]]:
    """The `status.progress` object for what rank 0 reported, or None when it reported no step yet.

    Fields the trainer has not reported (no evaluation yet, no checkpoint, MFU on CPU) are left
    out rather than written as 0.
    """
    step = _num(metrics, "rosetta_step")
    total = _num(metrics, "rosetta_total_steps")
    if step is None:
        return None
    progress: dict[str, Any] = {"step": int(step)}
    if total:
        percent = min(100.0, 100.0 * step / total)
        progress.update(totalSteps=int(total), percent=round(percent, 1),
                        display=f"{percent:.0f}% {int(step)}/{int(total)}")
        seconds = _num(metrics, "rosetta_step_seconds")
        if seconds is not None:
            progress["etaSeconds"] = round(max(0.0, total - step) * seconds, 1)
    else:
        progress["display"] = f"step {int(step)}"
    bleu = _num(metrics, "rosetta_bleu")
    if bleu is None and isinstance(metrics.get("rosetta_eval_bleu"), Mapping) and metrics["rosetta_eval_bleu"]:
        per_lang = list(metrics["rosetta_eval_bleu"].values())
        bleu = sum(per_lang) / len(per_lang)
    for field, value in (("epoch", _round(_num(metrics, "rosetta_epoch"), 4)),
                         ("loss", _round(_num(metrics, "rosetta_loss"), 4)),
                         ("learningRate", _num(metrics, "rosetta_learning_rate")),
                         ("tokensPerSecond", _round(_num(metrics, "rosetta_tokens_per_second"), 1)),
                         ("mfu", _round(_num(metrics, "rosetta_mfu"), 4)),
                         ("bleu", _round(bleu, 2)),
                         ("bestBleu", _round(_num(metrics, "rosetta_best_bleu"), 2)),
                         ("validationLoss", _round(_num(metrics, "rosetta_validation_loss"), 4))):
        if value is not None:
            progress[field] = value
    gender = gender_progress(metrics)
    if gender:
        progress["gender"] = gender
        gaps = [g["gapBleu"] for g in gender.values() if "gapBleu" in g]
        if gaps:
            progress["genderGapBleu"] = round(sum(gaps) / len(gaps), 2)
    checkpoint_step = _num(metrics, "rosetta_last_checkpoint_step")
    if checkpoint_step:
        progress["lastCheckpointStep"] = int(checkpoint_step)
    if metrics.get("rosetta_last_checkpoint_info"):
        progress["lastCheckpoint"] = str(metrics["rosetta_last_checkpoint_info"])
    doing = activity(metrics)
    if doing:
        progress["activity"] = doing
    progress["updatedAt"] = now
    return progress


def gender_progress(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per target language, MT-GenEval's figures: {lang: {gapBleu, gapAccuracy, accuracy, bleuMasculine,
    bleuFeminine, accuracyMasculine, accuracyFeminine}}, whichever the trainer reported."""
    out: dict[str, dict[str, float]] = {}

    def put(lang: Any, field: str, value: Any) -> None:
        if isinstance(lang, str) and isinstance(value, (int, float)) and math.isfinite(value):
            out.setdefault(lang, {})[field] = round(float(value), 2)

    for name, field in (("rosetta_eval_gender_gap_bleu", "gapBleu"), ("rosetta_eval_gender_gap_accuracy", "gapAccuracy"),
                        ("rosetta_eval_gender_accuracy", "accuracy")):
        for lang, value in (metrics.get(name) or {}).items() if isinstance(metrics.get(name), Mapping) else ():
            put(lang, field, value)
    for name, field in (("rosetta_eval_gender_bleu", "bleu"), ("rosetta_eval_gender_accuracy_by_gender", "accuracy")):
        for key, value in (metrics.get(name) or {}).items() if isinstance(metrics.get(name), Mapping) else ():
            labels = dict(key) if isinstance(key, tuple) else {}
            gender = labels.get("gender", "")
            if gender in ("masculine", "feminine"):
                put(labels.get("lang"), field + gender.capitalize(), value)
    return out


def changed(current: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """Whether `new` says anything `current` does not (timestamps aside)."""
    current = current or {}
    return any(current.get(k) != v for k, v in new.items() if k not in VOLATILE)


def _index(pod: Mapping[str, Any]) -> Optional[str]:
    meta = pod.get("metadata") or {}
    return (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)


def _is_rank0(pod: Mapping[str, Any], jobset_name: str) -> bool:
    """Completion index 0 of the JobSet's (single) job."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (labels.get(JOBSET_NAME_LABEL) == jobset_name and _index(pod) == "0"
            and labels.get(JOB_INDEX_LABEL, "0") == "0"
            and labels.get(REPLICATED_JOB_LABEL, REPLICATED_JOB) == REPLICATED_JOB)  # not the stage job's pod


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def rank0_pod(pods: Iterable[Mapping[str, Any]], jobset_name: str) -> Optional[Mapping[str, Any]]:
    """Rank 0's pod of a JobSet: completion index 0 of its (single) job, with an IP, not leaving.

    After a gang restart the old pods may linger while the new ones start: the newest wins.
    """
    candidates = []
    for pod in pods:
        if not _is_rank0(pod, jobset_name) or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        if not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        candidates.append(pod)
    return max(candidates, key=_created) if candidates else None


def final_result(pods: Iterable[Mapping[str, Any]], jobset_name: str) -> Optional[dict[str, Any]]:
    """The figures rank 0 left in its termination message when the run completed (final_result.py),
    from the newest rank-0 pod of the JobSet that has them; None when none did."""
    found = []
    for pod in pods:
        if not _is_rank0(pod, jobset_name):
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            figures = parse_result(((container.get("state") or {}).get("terminated") or {}).get("message") or "")
            if figures:
                found.append((_created(pod), figures))
    return max(found, key=lambda f: f[0])[1] if found else None


def final_progress(current: Optional[Mapping[str, Any]], figures: Mapping[str, Any], now: str) -> dict[str, Any]:
    """status.progress with a finished run's figures folded in."""
    progress = {**(current or {}), **figures, "updatedAt": now}
    progress.pop("etaSeconds", None)
    step, total = progress.get("step"), progress.get("totalSteps")
    if step is not None and total:
        percent = min(100.0, 100.0 * step / total)
        progress.update(percent=round(percent, 1), display=f"{percent:.0f}% {int(step)}/{int(total)}")
    return progress


def metrics_url(pod: Mapping[str, Any], port: int) -> str:
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"
