"""Activation checkpointing in a real run: two processes under torchrun, DDP and DeepSpeed ZeRO-2 and 3.

Recomputing the layers in backward (with the saved RNG state, so dropout draws the same masks)
must log the same losses as keeping their activations.
"""

import pytest

from support.training import TINY, deep_update, logged_losses, torchrun_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 6
LOSS_RTOL = 1e-3  # as in test_deepspeed.py: the same reductions, perhaps in another order

BASE = deep_update(TINY, {"spec": {
    "model": {"architecture": "t5", "size": "tiny", "dModel": 32, "encoderLayers": 2, "decoderLayers": 2,
              "heads": 2, "ffnDim": 64},
    "training": {"maxSteps": STEPS, "logInterval": 1},
    "checkpoint": {"interval": STEPS},
    "evaluation": {"interval": STEPS, "maxSamples": 8, "atEnd": False},
}})
ON = {"spec": {"training": {"activationCheckpointing": True}}}


def assert_same_losses(a: dict, b: dict):
    assert a.keys() == b.keys() and len(a) == STEPS
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=LOSS_RTOL), step


def test_ddp_and_zero_log_the_same_losses_with_it_on(tmp_path):
    off = tmp_path / "off"
    torchrun_training(BASE, off, 2)
    on = tmp_path / "ddp-on"
    summary = torchrun_training(deep_update(BASE, ON), on, 2)
    assert summary["steps"] == STEPS
    assert_same_losses(logged_losses(on), logged_losses(off))

    for name, distributed in (("zero2-on", {"backend": "deepspeed", "zeroStage": 2}),
                              ("zero3-on", {"backend": "deepspeed", "zeroStage": 3})):
        out = tmp_path / name
        torchrun_training(deep_update(BASE, {"spec": {**ON["spec"], "distributed": distributed}}), out, 2)
        assert_same_losses(logged_losses(out), logged_losses(off))
