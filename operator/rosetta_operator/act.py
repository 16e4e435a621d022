"""Act: carry out what a status decision asked for (actions.py), after the status write that decided it.

Each action is safe to repeat: a suspend of a suspended JobSet changes nothing, and an event is
decided only by the write that turned the status, which a training's resourceVersion lets one
writer win. The actions run in order, each even when one before it failed; the first failure is
raised after them, so kopf reports it.
"""

from __future__ import annotations

from typing import Optional, cast

import kopf
import kubernetes

from rosetta_operator.actions import WARNING, PostEvent, Settled, Suspend
from rosetta_operator.api_calls import set_jobset_suspend


def act(api: kubernetes.client.ApiClient, settled: Optional[Settled]) -> None:
    """Carry out `settled`'s actions on its training (None: the training is gone, nothing to do)."""
    if settled is None:
        return
    training = cast(kopf.Body, settled.training)
    failed: Optional[Exception] = None
    for action in settled.actions:
        try:
            if isinstance(action, Suspend):
                set_jobset_suspend(api, training["metadata"]["namespace"], action.jobset, True)
            elif isinstance(action, PostEvent):
                post = kopf.warn if action.event_type == WARNING else kopf.info
                post(training, reason=action.reason, message=action.message)
        except Exception as exc:  # the others still run; the first failure is kopf's to report
            failed = failed or exc
    if failed is not None:
        raise failed
