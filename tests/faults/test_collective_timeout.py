"""A rank that stops answering in a two-rank gang (DDP over gloo, CPU): its peer's next collective
gives up after spec.faultTolerance.collectiveTimeoutSeconds, and the trainer exits with its own
status for it, CollectiveTimeout (75), and a line that says so, instead of a traceback or a hang.
The hung rank is the real trainer stopped by the FAULT_HANG_AFTER_STEP test hook."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import yaml

from rosetta_contract.exits import COLLECTIVE_TIMEOUT_EXIT
from support.trainer_processes import kill_gang, start_training
from support.training import TINY, deep_update

pytestmark = pytest.mark.slow

TIMEOUT_S = 10
CONFIG = deep_update(TINY, {"spec": {
    "training": {"maxSteps": 50, "logInterval": 1},
    "evaluation": {"interval": 100000, "atEnd": False},
    "metrics": {"port": 0, "tensorboard": False},
    "faultTolerance": {"collectiveTimeoutSeconds": TIMEOUT_S},
}})


ERROR = "error: a collective operation timed out (spec.faultTolerance.collectiveTimeoutSeconds)"


def wait_in_log(log, text: str, proc: subprocess.Popen, timeout: float) -> float:
    """When `text` appeared in the log (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} after {timeout:.0f} s:\n" + log.read_text()[-3000:]
        assert proc.poll() is None or text in log.read_text(), log.read_text()[-3000:]
        time.sleep(0.1)
    return time.monotonic()


def test_a_peer_that_hangs_ends_the_gang_with_collective_timeout_after_the_specs_seconds(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    log = tmp_path / "gang.log"
    proc = start_training(cfg, tmp_path / "out", 2, log, {"FAULT_HANG_AFTER_STEP": "3", "FAULT_HANG_RANK": "1"})
    try:
        hung = wait_in_log(log, "hanging after step 3", proc, 300)
        waited = wait_in_log(log, ERROR, proc, 120) - hung
        # torchrun then SIGTERMs the hung rank, which ignores it, and SIGKILLs it 30 s later (its
        # failure path's fixed wait).
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            kill_gang(proc)
    text = log.read_text()
    assert code != 0, text[-3000:]
    # The worker's status in torchrun's report (torchrun itself exits 1).
    assert re.search(rf"exitcode\s*:\s*{COLLECTIVE_TIMEOUT_EXIT}\b", text), text[-3000:]
    assert "the collective that timed out was called here:" in text  # the traceback, in the log
    # The spec's seconds, not torch's default half hour.
    assert TIMEOUT_S - 1 <= waited <= TIMEOUT_S + 15, (waited, text[-3000:])
    print(f"\ncollective timeout: rank 0 gave up {waited:.1f} s after rank 1 hung (timeout {TIMEOUT_S} s)")
