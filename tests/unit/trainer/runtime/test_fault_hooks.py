"""The trainer's test hooks (trainer/rosetta_trainer/runtime/fault_hooks.py): off unless asked, and only in
the attempt and on the rank asked."""

from __future__ import annotations

import pytest

from rosetta_trainer.runtime.fault_hooks import FaultHooks


@pytest.mark.parametrize("env, rank, hang", [
    ({}, 0, None),
    ({"FAULT_HANG_AFTER_STEP": "5"}, 0, 5),
    ({"FAULT_HANG_AFTER_STEP": "5"}, 3, 5),                                    # every rank
    ({"FAULT_HANG_AFTER_STEP": "5", "FAULT_HANG_RANK": "1"}, 0, None),
    ({"FAULT_HANG_AFTER_STEP": "5", "FAULT_HANG_RANK": "1"}, 1, 5),
    ({"FAULT_HANG_AFTER_STEP": "5", "ROSETTA_RESTART_ATTEMPT": "0"}, 0, 5),
    ({"FAULT_HANG_AFTER_STEP": "5", "ROSETTA_RESTART_ATTEMPT": "1"}, 0, None),  # the restarted gang runs through
    ({"FAULT_HANG_AFTER_STEP": " "}, 0, None),
])
def test_hang_hook(env, rank, hang):
    hooks = FaultHooks.from_env(rank, env)
    assert hooks.hang_after_step == hang
    hooks.after_step(4)  # any other step returns at once
