"""TranslationTraining objects as `rosetta get` and `rosetta status` print them. Pure: no I/O, no
clock (callers pass `now`).

`get` prints one table row per training (`rows`, `table`); `status` prints one training in full
(`summary`, `describe`); `-o json|yaml` prints the objects as the API returns them (`get`) or the
summary (`status`), so scripts read the same figures a person sees.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional, Sequence

# While the trainer runs, its ETA counts down from the last scrape; in any other phase there is none.
COUNTING_DOWN = frozenset({"Running", "Restarting"})
FORMATS = ("table", "json", "yaml")


def parse_time(value: Any) -> Optional[datetime]:
    """An RFC 3339 timestamp as the API writes it (`2024-05-01T12:00:00Z`), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def duration(seconds: Optional[float]) -> str:
    """kubectl's short durations: `45s`, `3m20s`, `47m`, `5h30m`, `3d4h`; `-` when unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 10:
        return f"{m}m{s}s" if s else f"{m}m"
    if m < 180:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def age(timestamp: Any, now: datetime) -> str:
    when = parse_time(timestamp)
    return duration((now - when).total_seconds()) if when else "-"


def eta_seconds(status: Mapping[str, Any], now: datetime) -> Optional[float]:
    """Seconds left by rank 0's last report, less the time since: None unless the training runs."""
    progress = status.get("progress") or {}
    eta = progress.get("etaSeconds")
    if status.get("phase") not in COUNTING_DOWN or not isinstance(eta, (int, float)):
        return None
    updated = parse_time(progress.get("updatedAt"))
    elapsed = (now - updated).total_seconds() if updated else 0.0
    return max(0.0, float(eta) - max(0.0, elapsed))


def _number(value: Any, digits: int) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


# ------------------------------------------------------------------------------- get


COLUMNS = ("NAME", "PHASE", "PROGRESS", "ETA", "BLEU", "RESTARTS", "PREEMPTIONS", "AGE")


def row(obj: Mapping[str, Any], now: datetime) -> list[str]:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    progress = status.get("progress") or {}
    return [meta.get("name", ""), status.get("phase") or "-", progress.get("display") or "-",
            duration(eta_seconds(status, now)),
            _number(progress.get("bleu"), 1), str(status.get("restarts", 0)), str(status.get("preemptions", 0)),
            age(meta.get("creationTimestamp"), now)]


def table(objects: Iterable[Mapping[str, Any]], now: datetime, *, namespaces: bool = False) -> str:
    """`kubectl get`'s layout: upper-case headers, columns three spaces apart, no trailing blanks."""
    header = (["NAMESPACE"] if namespaces else []) + list(COLUMNS)
    lines = [header]
    for obj in objects:
        ns = [(obj.get("metadata") or {}).get("namespace", "")] if namespaces else []
        lines.append(ns + row(obj, now))
    return _columns(lines)


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines) + "\n"


# ----------------------------------------------------------------------------- status


def summary(obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """What `rosetta status` shows, as data: the status' figures with the ETA as of `now`."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    progress = dict(status.get("progress") or {})
    out: dict[str, Any] = {
        "name": meta.get("name"), "namespace": meta.get("namespace"),
        "phase": status.get("phase"), "message": status.get("message"),
        "progress": progress or None, "etaSeconds": eta_seconds(status, now),
        "restarts": status.get("restarts", 0), "preemptions": status.get("preemptions", 0),
        "lastCheckpoint": progress.get("lastCheckpoint"), "lastCheckpointStep": progress.get("lastCheckpointStep"),
        "jobSetName": status.get("jobSetName"), "startTime": status.get("startTime"),
        "completionTime": status.get("completionTime"), "conditions": list(status.get("conditions") or []),
    }
    if out["etaSeconds"] is not None:
        out["etaSeconds"] = round(out["etaSeconds"], 1)
    if status.get("evaluation"):  # evaluation.afterTraining
        out["evaluation"] = dict(status["evaluation"])
    return out


_EVALUATION_SCORES = (("bleu", "BLEU"), ("chrf", "chrF"), ("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"),
                      ("rougeL", "ROUGE-L"), ("rougeLsum", "ROUGE-Lsum"))


def _evaluation_line(evaluation: Mapping[str, Any]) -> str:
    """`Succeeded (best: step-00004000): ROUGE-1 41.20, ROUGE-L 38.10 on 11490 test pairs`."""
    which = ": ".join(str(evaluation[k]) for k in ("checkpoint", "checkpointPath") if evaluation.get(k))
    text = (evaluation.get("phase") or "-") + (f" ({which})" if which else "")
    scores = [f"{label} {evaluation[key]:.2f}" for key, label in _EVALUATION_SCORES
              if isinstance(evaluation.get(key), (int, float))]
    if scores:
        text += ": " + ", ".join(scores)
        if evaluation.get("samples"):
            text += f" on {evaluation['samples']} test pairs"
    if evaluation.get("message"):
        text += f": {evaluation['message']}"
    return text + (f", Job {evaluation['jobName']}" if evaluation.get("jobName") else "")


def _progress_line(progress: Mapping[str, Any]) -> str:
    if not progress:
        return "-"
    extras = []
    if isinstance(progress.get("epoch"), (int, float)):
        extras.append(f"epoch {progress['epoch']:.2f}")
    if isinstance(progress.get("loss"), (int, float)):
        extras.append(f"loss {progress['loss']:.4f}")
    if isinstance(progress.get("validationLoss"), (int, float)):  # beside the training loss: overfitting shows
        extras.append(f"validation loss {progress['validationLoss']:.4f}")
    if isinstance(progress.get("tokensPerSecond"), (int, float)):
        extras.append(f"{progress['tokensPerSecond']:.0f} tokens/s")
    if isinstance(progress.get("mfu"), (int, float)):
        extras.append(f"MFU {100 * progress['mfu']:.1f}%")
    text = progress.get("display") or (f"step {progress['step']}" if "step" in progress else "-")
    return f"{text} ({', '.join(extras)})" if extras else text


def _bleu_line(progress: Mapping[str, Any]) -> str:
    bleu, best = progress.get("bleu"), progress.get("bestBleu")
    if not isinstance(bleu, (int, float)):
        return "-"
    return f"{bleu:.2f}" + (f" (best {best:.2f})" if isinstance(best, (int, float)) else "")


def _checkpoint_line(progress: Mapping[str, Any]) -> str:
    step, path = progress.get("lastCheckpointStep"), progress.get("lastCheckpoint")
    if step is None and not path:
        return "-"
    return " ".join(p for p in (f"step {step}" if step is not None else "", path or "") if p)


def _when(timestamp: Any, now: datetime) -> str:
    return f"{timestamp} ({age(timestamp, now)} ago)" if parse_time(timestamp) else "-"


def describe(obj: Mapping[str, Any], now: datetime) -> str:
    """`rosetta status NAME`: one training, a field a line, then its conditions as a table."""
    s = summary(obj, now)
    progress = s["progress"] or {}
    updated = progress.get("updatedAt")
    fields = [
        ("Name", s["name"]), ("Namespace", s["namespace"]), ("Phase", s["phase"] or "-"),
        ("Message", s["message"] or "-"),
        ("Progress", _progress_line(progress) + (f", reported {age(updated, now)} ago" if parse_time(updated) else "")),
        ("ETA", duration(s["etaSeconds"]) if s["etaSeconds"] is not None else "-"),
        ("BLEU", _bleu_line(progress)),
        ("Restarts", f"{s['restarts']} (preemptions {s['preemptions']})"),
        ("Last checkpoint", _checkpoint_line(progress)),
        ("JobSet", s["jobSetName"] or "-"),
        ("Started", _when(s["startTime"], now)), ("Completed", _when(s["completionTime"], now)),
    ]
    if s.get("evaluation"):
        fields.append(("Evaluation", _evaluation_line(s["evaluation"])))
    width = max(len(k) for k, _ in fields) + 2
    lines = [f"{(k + ':').ljust(width)}{v}" for k, v in fields]
    conditions = s["conditions"]
    if conditions:
        lines.append("Conditions:")
        cells = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]] + [
            [c.get("type", ""), c.get("status", ""), c.get("reason", ""), age(c.get("lastTransitionTime"), now),
             " ".join(str(c.get("message") or "").split())] for c in conditions]
        lines += ["  " + line for line in _columns(cells).splitlines()]
    else:
        lines.append("Conditions:     -")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- output


def dump(data: Any, fmt: str) -> str:
    """`-o json` (indented, as kubectl prints) or `-o yaml`."""
    if fmt == "json":
        return json.dumps(data, indent=4) + "\n"
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False, width=120))


def as_list(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several objects as `kubectl get -o json` prints them: one List."""
    return {"apiVersion": "v1", "kind": "List", "items": list(objects), "metadata": {"resourceVersion": ""}}
