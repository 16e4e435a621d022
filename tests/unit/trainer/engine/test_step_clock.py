"""StepClock: seconds per phase of an optimizer step, summed until taken (CPU: the host clock)."""

import time

import torch

from rosetta_trainer.engine.step_clock import PHASES, StepClock


def test_phases_are_summed_until_taken_then_start_afresh():
    clock = StepClock(torch.device("cpu"))
    for _ in range(2):
        started = clock.mark()
        time.sleep(0.02)
        clock.add("compute", started)
    started = clock.mark()
    time.sleep(0.01)
    clock.add("optimizer", started)
    compute, optimizer = clock.take()
    assert PHASES == ("compute", "optimizer")
    assert 0.04 <= compute < 0.5 and 0.01 <= optimizer < 0.25
    assert clock.take() == [0.0, 0.0]
