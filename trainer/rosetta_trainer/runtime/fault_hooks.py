"""Test hooks: faults that tests ask of the real trainer through its environment, where a wrapper
script cannot reach (a pod of the trainer image). Nothing here runs unless the variable is set.

    FAULT_HANG_AFTER_STEP=N   after optimizer step N, stop for good: no step, no heartbeat, SIGTERM
                              ignored, as a process stuck in a collective or a dead filesystem is.
                              Only in the first attempt (ROSETTA_RESTART_ATTEMPT unset or 0), so that
                              the restarted gang, resuming from a checkpoint before step N, runs through.
    FAULT_HANG_RANK=R         only rank R hangs (default: every rank); the others then wait for it in
                              the next collective.
    FAULT_PREFLIGHT_FAIL_ON_NODE=NODE
                              with spec.faultTolerance.preflight enabled, the pre-flight fails on the
                              node of that name (ROSETTA_NODE_NAME, else the host name) as if its GPU
                              check had failed: its ranks exit NodeUnhealthy (81). In every attempt:
                              the operator keeping the next attempts off that node is what ends it.

The names lack the ROSETTA_ prefix on purpose: that prefix is the launcher's, and spec.env refuses
it, while a cluster test must be able to set these through spec.env.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Mapping, Optional

HANG_AFTER_STEP_ENV = "FAULT_HANG_AFTER_STEP"
HANG_RANK_ENV = "FAULT_HANG_RANK"
RESTART_ATTEMPT_ENV = "ROSETTA_RESTART_ATTEMPT"
PREFLIGHT_FAIL_ON_NODE_ENV = "FAULT_PREFLIGHT_FAIL_ON_NODE"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaultHooks:
    hang_after_step: Optional[int] = None

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] = os.environ) -> "FaultHooks":
        step = environ.get(HANG_AFTER_STEP_ENV, "").strip()
        if not step or int(environ.get(RESTART_ATTEMPT_ENV) or 0) > 0:
            return cls()
        only = environ.get(HANG_RANK_ENV, "").strip()
        if only and int(only) != rank:
            return cls()
        return cls(hang_after_step=int(step))

    def after_step(self, step: int) -> None:
        if step == self.hang_after_step:
            log.warning("%s=%d: hanging after step %d (a test hook)", HANG_AFTER_STEP_ENV, step, step)
            while True:
                time.sleep(3600)


def preflight_fails_on(node: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether FAULT_PREFLIGHT_FAIL_ON_NODE names `node` (preflight.py)."""
    return bool(node) and environ.get(PREFLIGHT_FAIL_ON_NODE_ENV, "").strip() == node
