"""What the Python client's calls return (client.py): a list of trainings that knows where a watch
of it starts, one change seen by a watch, and a training's status as `rosetta status` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from rosetta_contract.resource import Phase


class TrainingList(list[dict[str, Any]]):
    """Trainings as the API lists them, with the list's resourceVersion (where `watch` starts)."""

    def __init__(self, items: Iterable[dict[str, Any]], resource_version: str = ""):
        super().__init__(items)
        self.resource_version = resource_version


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED or DELETED
    training: dict[str, Any]


@dataclass(frozen=True)
class TrainingStatus:
    """What `rosetta status NAME` shows. `events`: the training's, its JobSet's and its pods' recent
    events, oldest first, as describe.event_summary() gives them."""

    name: str
    namespace: str
    phase: Optional[str]
    message: Optional[str]
    progress: dict[str, Any]
    eta_seconds: Optional[float]
    restarts: int
    preemptions: int
    last_checkpoint: Optional[str]
    last_checkpoint_step: Optional[int]
    conditions: list[dict[str, Any]]
    events: list[dict[str, Any]]
    training: dict[str, Any] = field(repr=False)  # the object as the API returned it

    @property
    def finished(self) -> bool:
        return self.phase in Phase.TERMINAL
