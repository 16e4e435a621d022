"""The scheduler's verdicts on a training's pods → its Scheduled condition. Pure: no I/O.

`pod_scheduling` reads one pod; `UnschedulablePods` remembers which pods of a gang still wait, so
the pod watch (handlers/pods.py) writes the condition only when it says something new.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from rosetta_operator.conditions import FALSE, TRUE, Cond, ConditionType, Reason, truncate


def pod_scheduling(pod: Mapping[str, Any]) -> Optional[Cond]:
    """The scheduler's verdict on one pod as a Scheduled condition: False with its message
    (`0/4 nodes are available: 4 Insufficient nvidia.com/gpu.`) while no node fits, True once the
    pod is bound, None before a verdict or while a scheduling gate (Kueue's) holds it back."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") != "PodScheduled":
            continue
        if cond.get("status") == TRUE:
            return Cond(ConditionType.SCHEDULED, TRUE, Reason.SCHEDULED, "every pod is scheduled")
        if cond.get("reason") == "Unschedulable":
            return Cond(ConditionType.SCHEDULED, FALSE, Reason.UNSCHEDULABLE,
                        truncate(cond.get("message") or "no node fits the pod"))
    return None


class UnschedulablePods:
    """Pods last seen unschedulable, by uid, with their gang (namespace, JobSet) and the
    scheduler's message: what makes a pod event news, and which pods of a gang still wait.

    Only waiting pods are kept, so a gang that is scheduled at once costs nothing. Bounded, the
    oldest forgotten first: a forgotten pod's next verdict is news again. Not thread-safe: one
    event loop calls it.
    """

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._pods: dict[str, tuple[tuple[str, str], str]] = {}

    def update(self, uid: str, gang: tuple[str, str], verdict: Optional[Cond]) -> Optional[Cond]:
        """The gang's Scheduled condition after this pod's verdict; None: nothing new to write."""
        if verdict is None:
            return None
        last = self._pods.pop(uid, None)
        if verdict.status == FALSE:
            self._pods[uid] = (gang, verdict.message)  # (re)inserted last: the newest
            while len(self._pods) > self.limit:
                del self._pods[next(iter(self._pods))]
            if last == (gang, verdict.message):
                return None
            others = [m for u, (g, m) in self._pods.items() if g == gang and u != uid]
            # The gang's other pods wait for the same reason: the training says so already.
            return None if verdict.message in others else verdict
        if last is None:
            return None  # bound, and never seen waiting: nothing to take back
        return self.waiting(gang) or verdict

    def waiting(self, gang: tuple[str, str]) -> Optional[Cond]:
        """Why a pod of this gang still waits for a node, if one does."""
        for known, message in self._pods.values():
            if known == gang:
                return Cond(ConditionType.SCHEDULED, FALSE, Reason.UNSCHEDULABLE, message)
        return None

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)

