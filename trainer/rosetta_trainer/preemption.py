"""Preemption: SIGTERM/SIGINT ask the run to stop at the next step boundary and checkpoint.

Kubernetes sends SIGTERM and waits terminationGracePeriodSeconds before SIGKILL;
the loop checks the flag between steps, so the checkpoint it then writes is a
consistent one.
"""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)


class StopRequested:
    """SIGTERM/SIGINT set a flag; the loop stops at the next step boundary and checkpoints."""

    def __init__(self):
        self.flag = False
        self._previous = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test harness thread)
                pass

    def _handle(self, signum, _frame) -> None:
        log.warning("received signal %d: stopping at the next step boundary", signum)
        self.flag = True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
