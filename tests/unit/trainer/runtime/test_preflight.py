"""The pre-flight check's pure parts (trainer/rosetta_trainer/runtime/preflight.py): nccl-tests' bus bandwidth,
the gang's verdict and its words, the exit it maps to, the test hook, and a run alone on a CPU."""

from __future__ import annotations

import pytest
import torch

from rosetta_contract.exits import NODE_UNHEALTHY_EXIT, exit_status
from rosetta_contract.fault_tolerance_fields import PreflightSpec
from rosetta_trainer.runtime.distributed import World
from rosetta_trainer.runtime.fault_hooks import preflight_fails_on
from rosetta_trainer.runtime.preflight import (
    CPU_COLLECTIVE_MIB,
    MIB,
    NodeUnhealthy,
    PeerUnhealthy,
    RankReport,
    bus_bandwidth_gbps,
    check_device,
    collective_bytes,
    judge,
    node_name,
    rank_line,
    run_preflight,
)

ALONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))


@pytest.mark.parametrize("nbytes, seconds, ranks, busbw", [
    (1_000_000_000, 1.0, 2, 1.0),      # 2 ranks: busbw = algbw
    (1_000_000_000, 1.0, 8, 1.75),     # algbw 1 GB/s * 2*7/8
    (256 * MIB, 0.01, 16, 50.33164800),  # 26.8435456 GB/s * 30/16
    (1_000_000_000, 2.0, 1, 0.0),      # one rank moves nothing over a link
])
def test_bus_bandwidth_is_nccl_tests_all_reduce_busbw(nbytes, seconds, ranks, busbw):
    # nccl-tests (src/all_reduce.cu, doc/PERFORMANCE.md): algBw = count*typesize / 1e9 / sec;
    # busBw = algBw * 2*(nranks-1)/nranks
    assert bus_bandwidth_gbps(nbytes, seconds, ranks) == pytest.approx(busbw)


def test_cpu_collective_is_small_and_gpu_one_is_as_asked():
    assert collective_bytes(256, torch.device("cpu")) == CPU_COLLECTIVE_MIB * MIB
    assert collective_bytes(2, torch.device("cpu")) == 2 * MIB
    assert collective_bytes(256, torch.device("cuda", 0)) == 256 * MIB


def _report(rank, node, seconds=None, problem=None, device="cuda:0"):
    return RankReport(rank=rank, node=node, local_rank=rank % 2, device=device, problem=problem, seconds=seconds)


def test_a_slow_gang_blames_the_node_of_the_slowest_rank_and_says_the_figures():
    reports = [_report(0, "a", 0.010), _report(1, "a", 0.011), _report(2, "b", 0.020), _report(3, "b", 0.012)]
    verdict = judge(reports, 256 * MIB, floor_gbps=100)
    assert verdict.slowest == reports[2]
    assert verdict.bus_bandwidth_gbps == pytest.approx(bus_bandwidth_gbps(256 * MIB, 0.020, 4))
    assert list(verdict.unhealthy) == ["b"]
    assert verdict.unhealthy["b"] == (
        "pre-flight on node b: all-reduce bus bandwidth 20.1 GB/s below the floor 100 GB/s "
        "(spec.faultTolerance.preflight.minBusBandwidthGbps): 256 MiB across 4 ranks took 20.0 ms on this node's "
        "rank 2 (cuda:0), the slowest")


def test_a_gang_above_the_floor_or_without_one_passes():
    reports = [_report(0, "a", 0.010), _report(1, "b", 0.010)]
    assert judge(reports, 256 * MIB, floor_gbps=10).unhealthy == {}
    verdict = judge(reports, 256 * MIB, floor_gbps=None)
    assert verdict.unhealthy == {} and verdict.bus_bandwidth_gbps == pytest.approx(26.8435456)


def test_a_device_problem_names_node_rank_local_rank_and_device_and_skips_the_bandwidth():
    reports = [_report(0, "a", problem=None), _report(1, "b", problem="could not multiply matrices on the GPU: boom",
                                                            device="cuda:1"),
               _report(3, "b", problem="second problem on b")]
    verdict = judge(reports, 256 * MIB, floor_gbps=100)
    assert verdict.unhealthy == {"b": "pre-flight on node b, rank 1 (local rank 1, cuda:1): could not multiply "
                                      "matrices on the GPU: boom"}
    assert verdict.bus_bandwidth_gbps is None


def test_the_rank_line_says_what_was_checked_and_the_figures():
    line = rank_line(_report(3, "gpu-7", 0.010), 256 * MIB, 2, 100)
    assert line == ("preflight: node gpu-7 rank 3 (cuda:0): gpu ok, all-reduce 256 MiB in 10.0 ms busbw 26.8 GB/s "
                    "(floor 100)")
    assert rank_line(_report(0, "n", device="cpu"), 0, 1, None) == "preflight: node n rank 0 (cpu): no gpu"
    assert rank_line(_report(0, "n", problem="GPU 3 is not visible (2 visible)"), 0, 1, None) == \
        "preflight: node n rank 0 (cuda:0): FAILED: GPU 3 is not visible (2 visible)"


def test_node_unhealthy_exits_81():
    assert exit_status(NodeUnhealthy("x")) == NODE_UNHEALTHY_EXIT == 81
    assert exit_status(PeerUnhealthy("error: x")) is None  # a SystemExit: exit 1, no traceback
    assert PeerUnhealthy("error: x").code == "error: x"


def test_the_node_is_rosetta_node_name_else_the_host_name():
    import socket

    assert node_name({"ROSETTA_NODE_NAME": "gpu-7"}) == "gpu-7"
    assert node_name({"ROSETTA_NODE_NAME": " "}) == node_name({}) == socket.gethostname()


@pytest.mark.parametrize("env, node, fails", [
    ({}, "gpu-7", False),
    ({"FAULT_PREFLIGHT_FAIL_ON_NODE": "gpu-7"}, "gpu-7", True),
    ({"FAULT_PREFLIGHT_FAIL_ON_NODE": "gpu-7"}, "gpu-8", False),
    ({"FAULT_PREFLIGHT_FAIL_ON_NODE": " gpu-7 ", "ROSETTA_RESTART_ATTEMPT": "2"}, "gpu-7", True),  # every attempt
    ({"FAULT_PREFLIGHT_FAIL_ON_NODE": ""}, "", False),
])
def test_fail_on_node_hook(env, node, fails):
    assert preflight_fails_on(node, env) is fails


def test_alone_on_a_cpu_it_passes_and_measures_nothing():
    result = run_preflight(PreflightSpec(enabled=True, min_bus_bandwidth_gbps=100), ALONE,
                           environ={"ROSETTA_NODE_NAME": "laptop"})
    assert result.as_dict() == {"node": "laptop", "ranks": 1, "nodes": 1, "collective_mib": None,
                                "bus_bandwidth_gbps": None, "min_bus_bandwidth_gbps": 100}


def test_the_hook_fails_the_named_node_with_node_unhealthy():
    env = {"ROSETTA_NODE_NAME": "gpu-7", "FAULT_PREFLIGHT_FAIL_ON_NODE": "gpu-7"}
    with pytest.raises(NodeUnhealthy) as raised:
        run_preflight(PreflightSpec(enabled=True), World(rank=0, local_rank=1, size=1, device=torch.device("cpu")),
                      environ=env)
    assert str(raised.value) == ("pre-flight on node gpu-7, rank 0 (local rank 1, cpu): FAULT_PREFLIGHT_FAIL_ON_NODE="
                                 "gpu-7: the GPU check fails on this node (a test hook)")


def test_the_cpu_check_allocates_the_buffer_of_ones():
    problem, buffer = check_device(torch.device("cpu"), 1 * MIB)
    assert problem is None and buffer.numel() == MIB // 4 and bool((buffer == 1).all())


@pytest.mark.parametrize("enabled, calls", [(True, ["preflight", "check_shared"]), (False, ["check_shared"])])
def test_train_runs_it_before_any_other_work_and_only_when_enabled(monkeypatch, tmp_path, enabled, calls):
    from rosetta_contract.spec import parse_for_trainer
    from rosetta_trainer.checkpoints import checkpoint
    from rosetta_trainer.commands import train as trainer_main
    from rosetta_trainer.runtime import preflight
    from support.training import TINY, deep_update

    seen = []

    class Stop(Exception):
        pass

    def check_shared(*_args, **_kwargs):
        seen.append("check_shared")  # the first work of a start: then the data, the model
        raise Stop

    monkeypatch.setattr(preflight, "run_preflight", lambda spec, world: seen.append("preflight"))
    monkeypatch.setattr(checkpoint, "check_shared", check_shared)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    raw = deep_update(TINY, {"spec": {"training": {"device": "cpu"},
                                      "faultTolerance": {"preflight": {"enabled": enabled}}}})
    with pytest.raises(Stop):
        trainer_main.train(parse_for_trainer(raw, "test"), tmp_path / "out", progress=False)
    assert seen == calls
    assert PreflightSpec().enabled is False  # off unless asked


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failures of a GPU that is not there")


@no_gpu
def test_a_gpu_that_is_not_visible_is_the_problem():
    problem, buffer = check_device(torch.device("cuda", 0), MIB)
    assert problem == "GPU 0 is not visible (0 visible)" and buffer is None


@no_gpu
def test_a_cuda_error_is_the_problem_named_with_its_step(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: None)
    problem, buffer = check_device(torch.device("cuda", 0), MIB)  # copying to a GPU with no driver raises
    assert problem.startswith("could not multiply matrices on the GPU: ") and buffer is None, problem
