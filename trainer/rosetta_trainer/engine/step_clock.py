"""Where an optimizer step's time goes: forward+backward ("compute") and the optimizer step.

On a GPU the host runs ahead of the device, so host clocks around a kernel launch measure the
launch, not the work. CUDA events recorded on the current stream time the device's work instead,
and are read once per log interval, where the loop synchronises anyway: no extra host sync per
step. On a CPU the work is synchronous and the host clock is the truth.
"""

from __future__ import annotations

import time
from typing import Any

import torch

PHASES = ("compute", "optimizer")


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        # (phase, start mark, end mark); marks are CUDA events on a GPU, perf_counter() on a CPU.
        self._spans: list[tuple[str, Any, Any]] = []

    def mark(self) -> torch.cuda.Event | float:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
            event.record()
            return event
        return time.perf_counter()

    def add(self, phase: str, started: torch.cuda.Event | float) -> None:
        """`phase` ran from `started` (a mark) until now."""
        self._spans.append((phase, started, self.mark()))

    def take(self) -> list[float]:
        """Seconds per phase (in PHASES order) since the last take, then start afresh."""
        seconds = dict.fromkeys(PHASES, 0.0)
        for phase, start, end in self._spans:
            if self.cuda:
                end.synchronize()
                seconds[phase] += start.elapsed_time(end) / 1000.0
            else:
                seconds[phase] += end - start
        self._spans.clear()
        return [seconds[p] for p in PHASES]
