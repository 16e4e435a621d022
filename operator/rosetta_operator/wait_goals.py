"""What `rosetta wait` and Client.wait wait for: a phase, a condition, or the training gone, as
kubectl wait's `--for` spells them.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

from rosetta_contract.resource import PHASES
from rosetta_operator.client_errors import InvalidArgument


class Goal(Protocol):
    """What `wait` waits for: met by the training as read (None: it is gone)."""

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool: ...


class PhaseGoal:
    def __init__(self, phase: str):
        self.phase = phase

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        return obj is not None and (obj.get("status") or {}).get("phase") == self.phase

    def __str__(self) -> str:
        return f"phase {self.phase}"


class ConditionGoal:
    def __init__(self, type_: str, status: str):
        self.type, self.status = type_, status

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == self.type and str(c.get("status")).lower() == self.status.lower()
                   for c in conditions)

    def __str__(self) -> str:
        return f"condition {self.type}={self.status}"


class Deleted:
    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        return obj is None

    def __str__(self) -> str:
        return "deletion"


def phase_goal(phase: str, what: str = "phase") -> PhaseGoal:
    """The phase as the CRD spells it, whatever the case it was given in."""
    found = next((p for p in PHASES if p.lower() == phase.lower()), None)
    if found is None:
        raise InvalidArgument(f"{what}: the phases are {', '.join(PHASES)}")
    return PhaseGoal(found)


def condition_goal(condition: str, what: str = "condition") -> ConditionGoal:
    """`TYPE` or `TYPE=STATUS` (STATUS True, False or Unknown; default True)."""
    type_, _, status = condition.partition("=")
    if not type_:
        raise InvalidArgument(f"{what}: expected TYPE or TYPE=STATUS")
    if status and status.lower() not in ("true", "false", "unknown"):
        raise InvalidArgument(f"{what}: a condition's status is True, False or Unknown")
    return ConditionGoal(type_, status or "True")


def parse_for(text: str) -> Goal:
    """`--for` as kubectl wait takes it: phase=Succeeded, condition=Running[=False], delete."""
    key, _, value = text.partition("=")
    if key == "delete" and not value:
        return Deleted()
    if key == "phase":
        return phase_goal(value, f"--for {text}")
    if key == "condition" and value:
        return condition_goal(value, f"--for {text}")
    raise InvalidArgument(f"--for {text}: expected phase=PHASE, condition=TYPE[=STATUS] or delete")
