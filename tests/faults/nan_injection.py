"""`python nan_injection.py STEPS -- rosetta ARGS`: the real trainer, with the loss of rank 0
turned into NaN at the given optimizer steps (comma-separated), as a diverging run or a bad
batch would. Runs under torchrun like `-m rosetta_trainer`."""

import os
import sys

from rosetta_cli.main import main
from rosetta_trainer.engine.loop import Trainer

POISONED = {int(s) for s in sys.argv[1].split(",")}
_micro_step = Trainer._micro_step


def _poisoned_micro_step(self, batch, boundary, accumulation):
    if self.pos.step + 1 not in POISONED or int(os.environ.get("RANK", "0")) != 0:
        return _micro_step(self, batch, boundary, accumulation)
    backward = self.backend.backward
    self.backend.backward = lambda loss, *args: backward(loss * float("nan"), *args)
    try:
        return _micro_step(self, batch, boundary, accumulation)
    finally:
        self.backend.backward = backward


Trainer._micro_step = _poisoned_micro_step

if __name__ == "__main__":
    assert sys.argv[2] == "--", "usage: nan_injection.py STEPS -- rosetta ARGS"
    sys.exit(main(sys.argv[3:]))
