"""What a status decision asks the operator to do once the status it goes with is written: plain
values, so the decision stays pure (decide.py) and a status write retried after a conflict repeats
no side effect. act.py carries them out; api_calls.write_status hands over the ones of the decision
it settled on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Union

WARNING = "Warning"
NORMAL = "Normal"


@dataclass(frozen=True)
class Suspend:
    """Suspend the training's JobSet `jobset` (same namespace): the operator stops the gang for good."""

    jobset: str


@dataclass(frozen=True)
class PostEvent:
    """An event on the training."""

    reason: str
    message: str
    event_type: str = WARNING


Action = Union[Suspend, PostEvent]


@dataclass(frozen=True)
class Decision:
    """The whole desired status and what to do once it is written (or already is)."""

    status: dict[str, Any]
    actions: tuple[Action, ...] = ()


class Settled(NamedTuple):
    """The outcome of a status write: the training as the accepted write knew it (events go on it),
    the status decided and the actions that go with it."""

    training: Mapping[str, Any]
    status: Mapping[str, Any]
    actions: tuple[Action, ...]
