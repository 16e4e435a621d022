"""The pre-flight check for real (trainer/rosetta_trainer/runtime/preflight.py): two ranks, each on a 'node' of
its own (ROSETTA_NODE_NAME), over gloo, through the commands' own error handling (command_dispatch), so that
the exit status and the termination message are the ones a pod leaves; and the trainer itself, which
runs it before any other work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from rosetta_contract.failures import FailureClass, parse_termination_message
from support.training import TINY, deep_update

pytestmark = pytest.mark.slow

# One rank: the trainer's error handling around run_preflight, with a short grace for the healthy rank.
RANK = """
import argparse, logging, sys
from rosetta_contract.fault_tolerance_fields import PreflightSpec
from rosetta_contract.command_dispatch import dispatch
from rosetta_trainer.runtime.distributed import close, init_world
from rosetta_trainer.runtime.preflight import run_preflight

floor = None if sys.argv[1] == "none" else float(sys.argv[1])
spec = PreflightSpec(enabled=True, min_bus_bandwidth_gbps=floor, collective_mib=64)

def run(_args):
    world = init_world("cpu", timeout_s=30)
    logging.basicConfig(level=logging.INFO if world.is_main else logging.WARNING, format="%(message)s")
    try:
        result = run_preflight(spec, world, peer_grace_s=0.5)
        print("passed", result.as_dict(), flush=True)
    finally:
        close(world)

sys.exit(dispatch(argparse.Namespace(func=run)))
"""


def run_gang(tmp_path, floor: str, env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    """(exit status, output, termination message) of each of two ranks, rank R on node-R."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, logs = [], []
    for rank in range(2):
        log = tmp_path / f"rank-{rank}.log"
        message = tmp_path / f"termination-{rank}"
        message.write_text("")
        rank_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RANK": str(rank),
                    "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "ROSETTA_NODE_NAME": f"node-{rank}",
                    "ROSETTA_TERMINATION_LOG": str(message), **(env or {})}
        with open(log, "w") as fh:
            procs.append(subprocess.Popen([sys.executable, str(script), floor], stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=rank_env))
        logs.append(log)
    try:
        codes = [proc.wait(timeout=90) for proc in procs]  # no rank hangs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(code, log.read_text(), (tmp_path / f"termination-{rank}").read_text())
            for rank, (code, log) in enumerate(zip(codes, logs))]


def test_a_gang_without_a_floor_passes_and_measures_its_all_reduce(tmp_path):
    results = run_gang(tmp_path, "none")
    assert [code for code, _, _ in results] == [0, 0], results
    assert "preflight: node node-0 rank 0 (cpu): no gpu, all-reduce 8 MiB in " in results[0][1]
    assert "preflight: node node-1 rank 1 (cpu): no gpu, all-reduce 8 MiB in " in results[0][1]  # rank 0 logs both
    assert "'bus_bandwidth_gbps': " in results[1][1] and "'nodes': 2" in results[1][1]
    assert [message for _, _, message in results] == ["", ""]


def test_below_the_floor_the_slowest_node_exits_node_unhealthy_and_the_other_exits_1(tmp_path):
    results = run_gang(tmp_path, "10000")  # 1e4 GB/s: no gloo reaches it
    by_code = {code: (rank, log, message) for rank, (code, log, message) in enumerate(results)}
    assert sorted(by_code) == [1, 81], results
    rank, log, message = by_code[81]
    failure_class, text = parse_termination_message(message)
    assert failure_class == FailureClass.NODE_UNHEALTHY
    assert message.startswith(f"NodeUnhealthy: pre-flight on node node-{rank}: all-reduce bus bandwidth ")
    assert "below the floor 10000 GB/s" in text and f"on this node's rank {rank} (cpu), the slowest" in text
    assert f"error: {text}" in log
    other, log, message = by_code[1]
    assert message == "", "the healthy node says nothing about itself"
    assert f"this rank's node node-{other} passed and stops with the gang" in log
    assert "Traceback" not in log


def test_the_hook_fails_the_named_node_and_only_it(tmp_path):
    results = run_gang(tmp_path, "none", {"FAULT_PREFLIGHT_FAIL_ON_NODE": "node-1"})
    assert [code for code, _, _ in results] == [1, 81], results
    assert results[1][2] == ("NodeUnhealthy: pre-flight on node node-1, rank 1 (local rank 0, cpu): "
                             "FAULT_PREFLIGHT_FAIL_ON_NODE=node-1: the GPU check fails on this node (a test hook)")
    assert results[0][2] == ""
    assert "preflight: node node-1 rank 1 (cpu): FAILED: FAULT_PREFLIGHT_FAIL_ON_NODE=node-1" in results[0][1]


def test_the_trainer_runs_it_before_any_work_and_exits_81(tmp_path):
    cfg = tmp_path / "training.yaml"
    cfg.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"faultTolerance": {"preflight": {"enabled": True}}}})))
    message, out = tmp_path / "termination", tmp_path / "out"
    env = {**os.environ, "ROSETTA_NODE_NAME": "bad-node", "FAULT_PREFLIGHT_FAIL_ON_NODE": "bad-node",
           "ROSETTA_TERMINATION_LOG": str(message), "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "rosetta_trainer", "train", "-f", str(cfg), "--output", str(out),
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 81, proc.stderr[-3000:]
    assert message.read_text().startswith("NodeUnhealthy: pre-flight on node bad-node, rank 0 (local rank 0, ")
    assert not out.exists(), "nothing was prepared on the bad node"
