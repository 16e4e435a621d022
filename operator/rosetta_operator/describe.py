"""TranslationTraining objects as `rosetta get` and `rosetta status` print them. Pure: no I/O, no
clock (callers pass `now`).

`get` prints one table row per training (`rows`, `table`); `status` prints one training in full
(`summary`, `describe`) with its recent events (`events_table`); `-o json|yaml|jsonpath=…` prints
the objects as the API returns them (`get`) or the summary (`status`), so scripts read the same
figures a person sees. `-o wide` adds columns, `-o name` prints `translationtraining.rosetta.dev/NAME`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

from rosetta_contract.resource import GROUP, KIND

# While the trainer runs, its ETA counts down from the last scrape; in any other phase there is none.
COUNTING_DOWN = frozenset({"Running", "Restarting"})
FORMATS = ("table", "wide", "name", "json", "yaml", "jsonpath=TEMPLATE")


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


# -o wide: what a first look at a stuck or slow training asks next (its size, its JobSet, how far the
# checkpoints got, the operator's message).
WIDE_COLUMNS = ("NODES", "GPUS/NODE", "JOBSET", "CHECKPOINT", "MESSAGE")


def wide_row(obj: Mapping[str, Any], now: datetime) -> list[str]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    step = (status.get("progress") or {}).get("lastCheckpointStep")
    return row(obj, now) + [str(spec.get("nodes", "-")), str(spec.get("gpusPerNode", "-")),
                            status.get("jobSetName") or "-", f"step {step}" if step is not None else "-",
                            " ".join(str(status.get("message") or "-").split())]


def header(*, namespaces: bool = False, wide: bool = False) -> list[str]:
    return (["NAMESPACE"] if namespaces else []) + list(COLUMNS) + (list(WIDE_COLUMNS) if wide else [])


def cells(obj: Mapping[str, Any], now: datetime, *, namespaces: bool = False, wide: bool = False) -> list[str]:
    ns = [(obj.get("metadata") or {}).get("namespace", "")] if namespaces else []
    return ns + (wide_row(obj, now) if wide else row(obj, now))


def table(objects: Iterable[Mapping[str, Any]], now: datetime, *, namespaces: bool = False, wide: bool = False) -> str:
    """`kubectl get`'s layout: upper-case headers, columns three spaces apart, no trailing blanks."""
    lines = [header(namespaces=namespaces, wide=wide)]
    lines += [cells(obj, now, namespaces=namespaces, wide=wide) for obj in objects]
    return _columns(lines)


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(_line(line, widths) for line in lines) + "\n"


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "   ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()


class WatchTable:
    """`get -w`'s rows: the first batch laid out as one table, each later row printed as it comes in
    columns no narrower than before (a row wider than the header widens its own columns only)."""

    def __init__(self, header: list[str]):
        self.widths = [len(h) for h in header]
        self.header: list[str] | None = header

    def lines(self, rows: Sequence[list[str]]) -> str:
        for r in rows:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, r)]
        head, self.header = ([self.header] if self.header else []), None
        return "".join(_line(r, [max(w, len(c)) for w, c in zip(self.widths, r)]) + "\n" for r in head + list(rows))


def resource_name(obj: Mapping[str, Any]) -> str:
    """`-o name`: kubectl's `translationtraining.rosetta.dev/NAME`."""
    return f"{KIND.lower()}.{GROUP}/{(obj.get('metadata') or {}).get('name', '')}"


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


def describe(obj: Mapping[str, Any], now: datetime, events: Optional[Sequence[Mapping[str, Any]]] = None) -> str:
    """`rosetta status NAME`: one training, a field a line, then its conditions as a table, then, as
    `kubectl describe` ends, its recent `events` (recent_events(); None: no such section)."""
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
    lines += attempts_table((obj.get("status") or {}).get("attempts") or [], now)
    lines += excluded_table((obj.get("status") or {}).get("excludedNodes") or [], now)
    if events is not None:
        lines += events_table(events, now)
    return "\n".join(lines) + "\n"


def attempts_table(attempts: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    """The `Attempts:` section: why each run of the gang ended (status.attempts), newest last."""
    if not attempts:
        return []
    rows = [["ATTEMPT", "REASON", "ENDED", "STEP", "POD", "NODE", "EXIT", "MESSAGE"]] + [
        [str(a.get("attempt", "")), a.get("reason") or "running", age(a["endTime"], now) + " ago" if a.get("endTime") else "-",
         str(a.get("lastStep", "-")), a.get("pod") or "-", a.get("node") or "-", str(a.get("exitCode", "-")),
         " ".join(str(a.get("message") or "").split())] for a in attempts]
    return ["Attempts:"] + ["  " + line for line in _columns(rows).splitlines()]


def excluded_table(excluded: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    """The `Excluded nodes:` section: nodes kept out of the next attempts, and why (status.excludedNodes)."""
    if not excluded:
        return []
    rows = [["NODE", "REASON", "ATTEMPT", "AGE", "MESSAGE"]] + [
        [e.get("node", ""), e.get("reason", ""), str(e.get("attempt", "-")), age(e.get("time"), now),
         " ".join(str(e.get("message") or "").split())] for e in excluded]
    return ["Excluded nodes:"] + ["  " + line for line in _columns(rows).splitlines()]


# ------------------------------------------------------------------------------ events

# As kubectl describe: enough to see what went wrong last without the namespace's whole history.
EVENTS_SHOWN = 20


def _event_time(event: Mapping[str, Any], *keys: str) -> Any:
    """The first of `keys` the event has; events.k8s.io writers fill eventTime and series, core/v1
    writers (kopf, the kubelet) first/lastTimestamp."""
    for key in keys:
        value: Any = event
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value:
            return value
    return None


def event_summary(event: Mapping[str, Any]) -> dict[str, Any]:
    """One core/v1 Event as data (`status -o json`): what happened to which object, how often, when."""
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return {
        "type": event.get("type") or "Normal", "reason": event.get("reason") or "",
        "object": f"{str(involved.get('kind') or '').lower()}/{involved.get('name') or ''}",
        "from": source.get("component") or event.get("reportingComponent") or "",
        "count": int((event.get("series") or {}).get("count") or event.get("count") or 1),
        "firstSeen": _event_time(event, "firstTimestamp", "eventTime", "metadata.creationTimestamp"),
        "lastSeen": _event_time(event, "series.lastObservedTime", "lastTimestamp", "eventTime",
                                "metadata.creationTimestamp"),
        "message": " ".join(str(event.get("message") or "").split()),
    }


def recent_events(events: Iterable[Mapping[str, Any]], limit: int = EVENTS_SHOWN) -> list[dict[str, Any]]:
    """The last `limit` events as event_summary()s, oldest first (kubectl describe's order)."""
    summaries = [event_summary(e) for e in events]
    summaries.sort(key=lambda e: parse_time(e["lastSeen"]) or datetime.min.replace(tzinfo=timezone.utc))
    return summaries[-limit:]


def _event_age(event: Mapping[str, Any], now: datetime) -> str:
    """kubectl's `3m (x5 over 10m)` for a repeated event."""
    last = age(event["lastSeen"], now)
    if event["count"] > 1:
        return f"{last} (x{event['count']} over {age(event['firstSeen'], now)})"
    return last


def events_table(events: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    """The `Events:` section: recent_events() as a table, `<none>` as kubectl says it."""
    if not events:
        return ["Events:         <none>"]
    rows = [["TYPE", "REASON", "AGE", "OBJECT", "FROM", "MESSAGE"]] + [
        [e["type"], e["reason"], _event_age(e, now), e["object"], e["from"], e["message"]] for e in events]
    return ["Events:"] + ["  " + line for line in _columns(rows).splitlines()]


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


# ---------------------------------------------------------------------------- jsonpath


JsonPathNode = tuple[str, Any, list["JsonPathNode"]]  # ("text", str, []), ("path", expr, []), ("range", expr, body)


def parse_jsonpath(template: str) -> list[JsonPathNode]:
    """kubectl's `-o jsonpath=` template: text, `{.path}` (JSONPath, jsonpath-ng's extended syntax:
    filters, slices), `{"literal\\n"}`, `{range .path}…{end}`. ValueError says what is wrong."""
    from jsonpath_ng.ext import parse

    root: list[JsonPathNode] = []
    stack: list[list[JsonPathNode]] = [root]
    for is_action, text in _actions(template):
        body = stack[-1]
        action = text.strip()
        if not is_action:
            body.append(("text", text, []))
        elif action == "end":
            if len(stack) == 1:
                raise ValueError("{end} without {range …}")
            stack.pop()
        elif action.startswith('"'):
            try:
                body.append(("text", str(json.loads(action, strict=False)), []))
            except ValueError:
                raise ValueError(f"{{{action}}} is not a quoted string") from None
        else:
            is_range = action.startswith("range ")
            path = action[len("range "):].strip() if is_range else action
            if path.startswith("@"):
                path = path[1:]
            expression = path if path.startswith("$") else "$" + ("" if path.startswith(("[", ".")) else ".") + path
            try:
                compiled = parse(expression)
            except Exception as exc:  # the lexer and parser raise several kinds
                raise ValueError(f"{{{action}}}: {exc}") from None
            node: JsonPathNode = ("range" if is_range else "path", (path.startswith("$"), compiled), [])
            body.append(node)
            if is_range:
                stack.append(node[2])
    if len(stack) > 1:
        raise ValueError("{range …} without {end}")
    return root


def _actions(template: str) -> Iterator[tuple[bool, str]]:
    """(False, text) and (True, what is between braces); a brace inside a quoted string is text."""
    i = 0
    while i < len(template):
        start = template.find("{", i)
        if start < 0:
            yield False, template[i:]
            return
        if start > i:
            yield False, template[i:start]
        j, quoted = start + 1, False
        while j < len(template) and (quoted or template[j] != "}"):
            if template[j] == "\\" and quoted:
                j += 1
            elif template[j] == '"':
                quoted = not quoted
            j += 1
        if j >= len(template):
            raise ValueError(f"unclosed action in {template!r}")
        yield True, template[start + 1:j]
        i = j + 1


def jsonpath(template: str, data: Any) -> str:
    """The template applied to `data`; several matches of one path are joined by spaces, a missing
    key prints nothing (kubectl's --allow-missing-template-keys)."""
    return _render(parse_jsonpath(template), data, data)


def _render(nodes: list[JsonPathNode], current: Any, root: Any) -> str:
    out = []
    for kind, value, body in nodes:
        if kind == "text":
            out.append(value)
            continue
        absolute, compiled = value
        matches = [m.value for m in compiled.find(root if absolute else current)]
        if kind == "range":
            items = matches[0] if len(matches) == 1 and isinstance(matches[0], list) else matches
            out.extend(_render(body, item, root) for item in items)
        else:
            out.append(" ".join(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in matches))
    return "".join(out)
