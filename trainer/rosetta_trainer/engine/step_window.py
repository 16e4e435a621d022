"""What a logging window sums, by name: one float64 tensor, so that every rank's sums travel in a
single all-reduce at each log line instead of one collective per figure."""

from __future__ import annotations

from enum import IntEnum

import torch


class Stat(IntEnum):
    LOSS = 0  # loss × steps, filled in from the device-side sum at the log line
    STEPS = 1
    TOKENS = 2  # the batch's counts, in this order (batching's "counts")
    TARGET_TOKENS = 3
    SENTENCES = 4
    FLOPS = 5
    DATA_WAIT_S = 6  # seconds waiting for batches
    COMPUTE_S = 7  # seconds in forward and backward
    OPTIMIZER_S = 8  # seconds in the optimizer step


BATCH_COUNTS = slice(Stat.TOKENS, Stat.FLOPS + 1)
STEP_CLOCK = slice(Stat.COMPUTE_S, Stat.OPTIMIZER_S + 1)


def new_window() -> torch.Tensor:
    return torch.zeros(len(Stat), dtype=torch.float64)
