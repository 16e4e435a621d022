"""Preemption: SIGTERM/SIGINT ask the run to stop at the next step boundary and checkpoint.

Kubernetes sends SIGTERM and waits terminationGracePeriodSeconds before SIGKILL;
the loop checks the flag between steps, so the checkpoint it then writes is a
consistent one. The pod tells the trainer its grace period (GRACE_ENV, rendered
from the same spec field), so that the trainer can say how much of it the last
checkpoint used, and warn before a slower storage or a bigger model makes the
kubelet kill it mid-write.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from types import FrameType
from typing import Any, Callable, Mapping, Optional

log = logging.getLogger(__name__)

GRACE_ENV = "ROSETTA_GRACE_PERIOD_S"
# Warn once a stop checkpoint uses this share of the grace period: the next one may be slower.
WARN_FRACTION = 0.8


def grace_period_from_env(environ: Mapping[str, str] = os.environ) -> Optional[float]:
    """Seconds between SIGTERM and SIGKILL, as the pod says; None when not under a launcher that sets it."""
    raw = environ.get(GRACE_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected the pod's grace period in seconds (a number)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected a non-negative number of seconds")
    return value


class StopRequested:
    """SIGTERM/SIGINT set a flag; the loop stops at the next step boundary and checkpoints."""

    def __init__(self, grace_seconds: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        self.flag = False
        self.grace = grace_seconds if grace_seconds is not None else grace_period_from_env()
        self.signal_name: Optional[str] = None
        self.signalled_at: Optional[float] = None  # clock() at the first signal
        self._clock = clock
        self._previous: dict[int, Any] = {}  # signal.signal's answer: a handler, SIG_DFL or None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test harness thread)
                pass

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signalled_at is None:  # the grace period runs from the first one
            self.signalled_at = self._clock()
            self.signal_name = signal.Signals(signum).name
        grace = "" if self.grace is None else f" (grace period {self.grace:g} s)"
        log.warning("received %s: stopping at the next step boundary%s", signal.Signals(signum).name, grace)
        self.flag = True

    def seconds_since_signal(self) -> Optional[float]:
        return None if self.signalled_at is None else self._clock() - self.signalled_at

    def remaining_grace(self, margin: float = 5.0) -> Optional[float]:
        """Seconds left before the kubelet's SIGKILL, less `margin` for writing the summary; None
        when no signal came or the grace is unknown (then there is no deadline to keep)."""
        elapsed = self.seconds_since_signal()
        if elapsed is None or self.grace is None:
            return None
        return max(0.0, self.grace - elapsed - margin)

    def checkpoint_written(self, step: int) -> Optional[float]:
        """Call once the stop checkpoint is complete: logs how long after the signal it was,
        warns when that came near or past the grace period, and returns the seconds
        (None when no signal arrived)."""
        elapsed = self.seconds_since_signal()
        if elapsed is None:
            return None
        what = f"checkpoint at step {step} written {elapsed:.1f} s after {self.signal_name}"
        if self.grace is None:
            log.info("%s (grace period unknown: %s not set)", what, GRACE_ENV)
        elif elapsed > self.grace:
            log.warning("%s, %.1f s past the grace period of %g s: on a cluster the pod would have been "
                        "killed before this checkpoint completed; set spec.terminationGracePeriodSeconds "
                        "to at least %d", what, elapsed - self.grace, self.grace, self.suggested_grace(elapsed))
        elif elapsed >= WARN_FRACTION * self.grace:
            log.warning("%s: %.0f%% of the grace period of %g s; a slower save would be killed mid-write, "
                        "set spec.terminationGracePeriodSeconds to at least %d", what,
                        100 * elapsed / self.grace if self.grace else 100, self.grace,
                        self.suggested_grace(elapsed))
        else:
            log.info("%s (grace period %g s)", what, self.grace)
        return elapsed

    @staticmethod
    def suggested_grace(elapsed: float) -> int:
        """A grace period that this stop would have used less than WARN_FRACTION of."""
        return math.floor(elapsed / WARN_FRACTION) + 1

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
