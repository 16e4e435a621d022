"""Learning-rate schedules as multipliers of the configured peak learning rate."""

from __future__ import annotations

import math
from typing import Callable


def lr_multiplier(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """step -> factor in [0, 1]; the peak (factor 1) is reached at the end of warmup.

    `step` counts optimizer steps already taken, so the first update uses step 0.
    """
    warmup = max(0, warmup)

    def warm(step: int) -> float | None:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return None

    def noam(step: int) -> float:
        # Vaswani et al.: linear warmup then inverse square root decay, scaled so
        # that the configured learning rate is the peak rather than d_model-based.
        s = step + 1
        return min(s / warmup, math.sqrt(warmup / s)) if warmup else 1 / math.sqrt(s)

    def linear(step: int) -> float:
        w = warm(step)
        if w is not None:
            return w
        return max(0.0, (total - step) / max(1, total - warmup))

    def cosine(step: int) -> float:
        w = warm(step)
        if w is not None:
            return w
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress))

    def constant(step: int) -> float:
        w = warm(step)
        return 1.0 if w is None else w

    table = {"noam": noam, "linear": linear, "cosine": cosine, "constant": constant}
    if schedule not in table:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {sorted(table)}")
    return table[schedule]
