"""Is a training stalled, and what does its status say about it? Pure: no I/O; the clock is the
caller's (progress_round.py passes time.monotonic() and the status timestamp).

The rule (docs/operator.md, Hangs): a training is stalled when rank 0's heartbeat
(rosetta_heartbeat_timestamp_seconds, which the trainer moves after every optimizer step, evaluation
batch and checkpoint save) has not changed for spec.faultTolerance.stallTimeoutSeconds.

- Time is the operator's: it counts from the first progress round that saw the heartbeat's newest
  value, so a node clock that differs from the operator's changes nothing.
- The clock starts at the first heartbeat of a rank-0 pod: a pod still pulling its image, or a
  trainer still tokenizing before it serves metrics, is never stalled.
- A new rank-0 pod (the gang restarted) starts a new clock; no rank-0 pod stops it.
- A scrape that gets no answer brings no heartbeat: a trainer too wedged to serve its metrics
  stalls like one that serves the same heartbeat.
- An operator restart forgets the clock: the first heartbeat seen afterwards starts it again, so a
  stall is found at most one timeout late, never early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from rosetta_operator import progress as pr
from rosetta_operator.conditions import FALSE, TRUE, Cond, ConditionType, Reason, upsert_conditions
from rosetta_operator.status import is_stalled, merge_status, observe_stall_failure, stopped_for_good


@dataclass(frozen=True)
class Beat:
    """What one scrape of rank 0 said about its liveness."""

    heartbeat: float
    step: Optional[int] = None
    activity: Optional[str] = None


@dataclass(frozen=True)
class Watch:
    """The progress daemon's memory of one training between its rounds."""

    pod: str                  # rank 0's pod uid
    heartbeat: float          # the newest heartbeat seen from it
    since: float              # the caller's clock at the round that first saw that value
    step: Optional[int] = None
    activity: Optional[str] = None
    moved: bool = False       # the heartbeat changed while watched: the trainer beats now


@dataclass(frozen=True)
class Stall:
    seconds: float
    step: Optional[int]
    activity: Optional[str]


def beat_from(metrics: Mapping[str, Any]) -> Optional[Beat]:
    """The liveness figures of parsed trainer metrics (progress.parse_metrics); None when the
    trainer reports no heartbeat (one older than the heartbeat, or not a trainer)."""
    heartbeat = metrics.get("rosetta_heartbeat_timestamp_seconds")
    if not isinstance(heartbeat, (int, float)) or not math.isfinite(heartbeat):
        return None
    step = metrics.get("rosetta_step")
    return Beat(float(heartbeat), int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None,
                pr.activity(metrics))


def follow(watch: Optional[Watch], pod: Optional[str], beat: Optional[Beat], now: float) -> Optional[Watch]:
    """The memory after a round that found rank 0's pod `pod` (None: none) and scraped `beat` from it
    (None: no answer, or no heartbeat in it)."""
    if pod is None:
        return None
    if watch is None or watch.pod != pod:
        return None if beat is None else Watch(pod, beat.heartbeat, now, beat.step, beat.activity)
    if beat is None:
        return watch
    if beat.heartbeat == watch.heartbeat:
        return replace(watch, step=beat.step, activity=beat.activity)
    return Watch(pod, beat.heartbeat, now, beat.step, beat.activity, moved=True)


def stalled(watch: Optional[Watch], now: float, timeout: float) -> Optional[Stall]:
    if watch is None or now - watch.since < timeout:
        return None
    return Stall(now - watch.since, watch.step, watch.activity)


# --------------------------------------------------------------------------------- status

ACTIONS = {
    "restart": "the gang is restarted from the last checkpoint (stallAction: restart)",
    "fail": "the gang is stopped and the training failed (stallAction: fail)",
    "report": "nothing else is done (stallAction: report)",
}


def stall_message(stall: Stall, timeout: int, action: str) -> str:
    """`no heartbeat from rank 0 for 3600 s (faultTolerance.stallTimeoutSeconds); last logged step 420,
    rank 0 evaluating: the gang is restarted ...`. The timeout, not the time measured: the condition
    then says the same from round to round, and costs one status write."""
    facts = [f"last logged step {stall.step}" if stall.step is not None else "no step logged"]
    if stall.activity:
        facts.append(f"rank 0 {stall.activity}")
    return (f"no heartbeat from rank 0 for {timeout} s (faultTolerance.stallTimeoutSeconds); {', '.join(facts)}: "
            f"{ACTIONS[action]}")


@dataclass(frozen=True)
class Verdict:
    """What a round found: `stalled` says a Stall's message (Stalled=True), `recovered` that a
    stalled training beats again (Stalled=False); neither: nothing to write."""

    stalled: Optional[str] = None
    recovered: Optional[str] = None


def verdict(status: Mapping[str, Any], watch: Optional[Watch], now: float, timeout: int, action: str) -> Verdict:
    """The round's verdict for a training whose status is `status`."""
    stall = stalled(watch, now, timeout)
    if stall is not None:
        return Verdict(stalled=stall_message(stall, timeout, action))
    if watch is not None and watch.moved and is_stalled(status):
        step = f" (last logged step {watch.step})" if watch.step is not None else ""
        return Verdict(recovered=f"rank 0 beats again{step}")
    return Verdict()


def stall_status(current: Mapping[str, Any], found: Verdict, *, action: str, now: str,
                 generation: Optional[int] = None) -> dict[str, Any]:
    """The status after a round's verdict: the Stalled condition, status.stalls (one per stall, counted
    when the condition turns True) and, under stallAction: fail, the failed phase."""
    desired = dict(current)
    if found.stalled:
        message = found.stalled
        if not is_stalled(current):
            desired["stalls"] = int(current.get("stalls") or 0) + 1
        desired["conditions"] = upsert_conditions(
            current.get("conditions") or [], [Cond(ConditionType.STALLED, TRUE, Reason.NO_HEARTBEAT, message)],
            now=now, generation=generation)
        if action == "fail" and not stopped_for_good(current):
            failed = observe_stall_failure(message, start_time=current.get("startTime"), now=now)
            desired = merge_status(desired, failed, now=now, generation=generation)
    elif found.recovered and is_stalled(current):
        desired["conditions"] = upsert_conditions(
            current.get("conditions") or [], [Cond(ConditionType.STALLED, FALSE, Reason.HEARTBEAT,
                                                   found.recovered)], now=now, generation=generation)
    return desired
