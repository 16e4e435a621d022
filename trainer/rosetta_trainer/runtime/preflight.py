"""The pre-flight check (spec.faultTolerance.preflight): before a training spends anything on its
nodes (the data, the model), every rank checks its own GPU and the gang runs one timed all-reduce.
A node that fails makes its pod exit with NodeUnhealthy (81, rosetta_contract.exits), and on a
cluster the operator keeps the next attempts off the node that pod ran on (docs/operator.md, Bad
nodes). A bad node costs seconds, not a model load.

1. **This rank's device** (with CUDA only): the local rank's GPU is visible, a matmul on it agrees
   with the CPU's (within TF32's error), and the all-reduce's buffer can be allocated and written.
   Any CUDA error, exception or mismatch is a problem of this rank's node. The test hook
   FAULT_PREFLIGHT_FAIL_ON_NODE (fault_hooks.py) makes this step fail on the node it names.
2. **The gang agrees** (more than one rank): every rank's (node, rank, problem) is gathered over a
   gloo group, which works whatever state the GPUs are in, so every rank knows the same verdict and
   none is left waiting in a collective a failed rank will never join.
3. **The collective** (more than one rank, every device fine): one all-reduce of collectiveMib
   (at most CPU_COLLECTIVE_MIB on CPUs: gloo over loopback measures nothing a floor could use),
   timed after one warm-up whose result is checked, then gathered as in step 2. The bus bandwidth is
   nccl-tests' for all-reduce: algbw = bytes / seconds, busbw = algbw * 2 (n-1) / n, in 1e9 bytes/s,
   from the slowest rank's time. Below minBusBandwidthGbps, the node of the slowest rank is unhealthy.
   That is a best guess: a ring is as slow as its slowest link, every rank waits for it, and the rank
   behind that link finishes last; with two nodes and one slow link between them no measurement could
   say which end is at fault. A wrong guess costs one exclusion (at most maxExcludedNodes of them) and
   the next attempt measures again.

Who fails, and how: the aim is that the pod whose termination message the operator reads is the one
on the bad node, and that no rank hangs.
  - Every rank on an unhealthy node raises NodeUnhealthy, naming the node, the rank, its device and
    what failed: its pod exits 81 with `NodeUnhealthy: <that>` as its termination message.
  - Every other rank logs which node failed, waits PEER_GRACE_SECONDS (the bad pod fails first, and
    the JobSet usually tears this pod down meanwhile), then exits 1 without a traceback
    (PeerUnhealthy, a SystemExit): a plain error, which says nothing about its own node, and which
    the operator ranks below NodeUnhealthy when it picks why the attempt ended (attempts.py).
A GPU or a link that hangs rather than fails is not caught here: the other ranks' collective times
out after collectiveTimeoutSeconds (CollectiveTimeout, 75), as any hang does.

Rank 0 logs one line per rank with what was checked and the figures. Needs a process group when the
world has more than one rank (distributed.init_world).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, cast

import torch
import torch.distributed as dist

from rosetta_contract.failures import NODE_NAME_ENV
from rosetta_contract.fault_tolerance_fields import PreflightSpec
from rosetta_trainer.runtime.distributed import World, control_group
from rosetta_trainer.runtime.fault_hooks import PREFLIGHT_FAIL_ON_NODE_ENV, preflight_fails_on

# gloo over loopback or a CPU's network: enough to see the collective work, not to measure links.
CPU_COLLECTIVE_MIB = 8
MATMUL_SIZE = 512
# A matmul's relative error (Frobenius norm) against the CPU's: TF32 (10-bit mantissa) stays near
# 1e-3; a broken GPU gives garbage, NaN or an error.
MATMUL_TOLERANCE = 1e-2
# How long a rank on a healthy node waits for the gang's teardown before it exits 1 itself.
PEER_GRACE_SECONDS = 15.0
MIB = 2**20

log = logging.getLogger(__name__)


class NodeUnhealthy(RuntimeError):
    """This rank's node failed the pre-flight (rosetta_contract.exits.NODE_UNHEALTHY_EXIT)."""


class PeerUnhealthy(SystemExit):
    """Another node failed the pre-flight: this rank stops, exit 1 and no traceback, without
    saying anything about its own node (the module's docstring says why)."""


@dataclass(frozen=True)
class RankReport:
    """What one rank found: its node, its device, a problem (None: fine), its all-reduce time."""

    rank: int
    node: str
    local_rank: int
    device: str
    problem: Optional[str] = None
    seconds: Optional[float] = None

    def where(self) -> str:
        return f"node {self.node}, rank {self.rank} (local rank {self.local_rank}, {self.device})"


@dataclass(frozen=True)
class Verdict:
    """The gang's result, the same on every rank: each unhealthy node with why, and the figures."""

    unhealthy: dict[str, str] = field(default_factory=dict)
    bus_bandwidth_gbps: Optional[float] = None
    slowest: Optional[RankReport] = None


@dataclass(frozen=True)
class Preflight:
    """What run_preflight found on a gang that passed (summary.json's `preflight`)."""

    node: str
    ranks: int
    nodes: int
    collective_mib: Optional[float] = None
    bus_bandwidth_gbps: Optional[float] = None
    floor_gbps: Optional[float] = None

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": self.ranks, "nodes": self.nodes, "collective_mib": self.collective_mib,
                "bus_bandwidth_gbps": self.bus_bandwidth_gbps, "min_bus_bandwidth_gbps": self.floor_gbps}


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    return (environ.get(NODE_NAME_ENV) or "").strip() or socket.gethostname()


def bus_bandwidth_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (GB/s, 1e9 bytes/s) of `nbytes` per rank in `seconds`:
    algbw = nbytes / seconds, busbw = algbw * 2 (n-1) / n, what each link carried, comparable to a
    link's peak whatever the rank count."""
    return nbytes / seconds / 1e9 * (2 * (ranks - 1) / ranks)


def collective_bytes(spec_mib: int, device: torch.device) -> int:
    mib = spec_mib if device.type == "cuda" else min(spec_mib, CPU_COLLECTIVE_MIB)
    return mib * MIB


def check_device(device: torch.device, nbytes: int) -> tuple[Optional[str], Optional[torch.Tensor]]:
    """(problem or None, the all-reduce's buffer, float32 ones of `nbytes`). On a GPU, also its
    visibility and a matmul against the CPU's; any error is the problem, named with its step."""
    step = "allocate the all-reduce's buffer"
    try:
        if device.type == "cuda":
            step = "see the GPU"
            count = torch.cuda.device_count()
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index >= count:
                return f"GPU {index} is not visible ({count} visible)", None
            torch.cuda.get_device_properties(index)
            step = "multiply matrices on the GPU"
            generator = torch.Generator().manual_seed(0)
            a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator) for _ in range(2))
            expected = a @ b
            got = (a.to(device) @ b.to(device)).cpu()
            error = float(torch.linalg.norm(got - expected) / torch.linalg.norm(expected))
            if not error <= MATMUL_TOLERANCE:  # NaN included
                return (f"a {MATMUL_SIZE}x{MATMUL_SIZE} matmul on the GPU differs from the CPU's: relative "
                        f"error {error:.3g} (tolerance {MATMUL_TOLERANCE:g})"), None
            step = f"allocate and write {nbytes / MIB:g} MiB on the GPU"
        buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return None, buffer
    except Exception as exc:  # a CUDA error, an OOM (another process holds the memory): the node's fault
        return f"could not {step}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}", None


def time_all_reduce(world: World, buffer: torch.Tensor) -> tuple[Optional[str], float]:
    """(problem or None, seconds of one all-reduce of `buffer` on this rank's clock), after a warm-up
    (NCCL builds its communicators there) whose sum of ones must be the world size everywhere."""
    device = buffer.device

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.all_reduce(buffer)
    synchronize()
    wrong = int((buffer != world.size).sum())
    problem = (f"the warm-up all-reduce returned wrong values in {wrong} of {buffer.numel()} elements"
               if wrong else None)
    dist.all_reduce(torch.zeros(1, device=device))  # start together
    synchronize()
    start = time.perf_counter()
    dist.all_reduce(buffer)
    synchronize()
    return problem, time.perf_counter() - start


def judge(reports: list[RankReport], nbytes: int, floor_gbps: Optional[float]) -> Verdict:
    """The gang's verdict from every rank's report (pure). A node with a problem is unhealthy (the
    first problem on it is named); otherwise, with times, the bus bandwidth of the slowest rank, and
    below the floor that rank's node."""
    unhealthy: dict[str, str] = {}
    for report in reports:
        if report.problem is not None and report.node not in unhealthy:
            unhealthy[report.node] = f"pre-flight on {report.where()}: {report.problem}"
    timed = [r for r in reports if r.seconds is not None]
    if unhealthy or not timed or len(reports) < 2:
        return Verdict(unhealthy)
    slowest = max(timed, key=lambda r: r.seconds or 0.0)
    busbw = bus_bandwidth_gbps(nbytes, slowest.seconds or 0.0, len(reports))
    if floor_gbps is not None and busbw < floor_gbps:
        unhealthy[slowest.node] = (
            f"pre-flight on node {slowest.node}: all-reduce bus bandwidth {busbw:.1f} GB/s below the floor "
            f"{floor_gbps:g} GB/s (spec.faultTolerance.preflight.minBusBandwidthGbps): {nbytes / MIB:g} MiB across "
            f"{len(reports)} ranks took {cast(float, slowest.seconds) * 1e3:.1f} ms on this node's rank {slowest.rank} "
            f"({slowest.device}), the slowest")
    return Verdict(unhealthy, busbw, slowest)


def rank_line(report: RankReport, nbytes: int, ranks: int, floor_gbps: Optional[float]) -> str:
    """One rank's log line: what was checked and the figures."""
    head = f"preflight: node {report.node} rank {report.rank} ({report.device}): "
    if report.problem is not None:
        return head + f"FAILED: {report.problem}"
    checked = "gpu ok" if report.device.startswith("cuda") else "no gpu"
    if report.seconds is not None:
        busbw = bus_bandwidth_gbps(nbytes, report.seconds, ranks)
        floor = f" (floor {floor_gbps:g})" if floor_gbps is not None else ""
        checked += (f", all-reduce {nbytes / MIB:g} MiB in {report.seconds * 1e3:.1f} ms busbw {busbw:.1f} "
                    f"GB/s{floor}")
    return head + checked


def _gather(world: World, group: dist.ProcessGroup | None, report: RankReport) -> list[RankReport]:
    if not world.distributed:
        return [report]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, report, group=group)
    return out


def run_preflight(spec: PreflightSpec, world: World, *, environ: Mapping[str, str] = os.environ,
                  peer_grace_s: float = PEER_GRACE_SECONDS) -> Preflight:
    """Check this rank's node and, with others, the gang (`spec`: spec.faultTolerance.preflight).
    Returns what passed; raises NodeUnhealthy on a rank of an unhealthy node, PeerUnhealthy on the others."""
    node = node_name(environ)
    device = world.device
    where = str(device) if device.type == "cuda" else "cpu"
    nbytes = collective_bytes(spec.collective_mib, device)
    floor = spec.min_bus_bandwidth_gbps
    me = RankReport(rank=world.rank, node=node, local_rank=world.local_rank, device=where)

    if preflight_fails_on(node, environ):
        problem: Optional[str] = f"{PREFLIGHT_FAIL_ON_NODE_ENV}={node}: the GPU check fails on this node (a test hook)"
        buffer = None
    else:
        problem, buffer = check_device(device, nbytes if world.distributed or device.type == "cuda" else 0)
    me = RankReport(me.rank, me.node, me.local_rank, me.device, problem)

    group = control_group(world)  # gloo: it answers whatever state the GPUs are in
    try:
        reports = _gather(world, group, me)
        verdict = judge(reports, nbytes, floor)
        if not verdict.unhealthy and world.distributed and buffer is not None:
            try:
                problem, seconds = time_all_reduce(world, buffer)
            finally:
                del buffer  # the model needs the memory
            me = RankReport(me.rank, me.node, me.local_rank, me.device, problem, seconds)
            reports = _gather(world, group, me)
            verdict = judge(reports, nbytes, floor)
    finally:
        if group is not None:
            dist.destroy_process_group(group)

    if world.is_main:
        for report in reports:
            log.info("%s", rank_line(report, nbytes, len(reports), floor))
    if verdict.unhealthy:
        mine = verdict.unhealthy.get(node)
        if mine is not None:
            raise NodeUnhealthy(mine)
        names = ", ".join(sorted(verdict.unhealthy))
        log.warning("preflight: node %s failed; this node (%s) passed and stops with the gang in %g s",
                    names, node, peer_grace_s)
        time.sleep(peer_grace_s)
        raise PeerUnhealthy(f"error: {'; '.join(verdict.unhealthy.values())}; this rank's node {node} passed "
                            "and stops with the gang")
    nodes = len({r.node for r in reports})
    if world.is_main and verdict.bus_bandwidth_gbps is not None:
        log.info("preflight: %d ranks on %d nodes passed, all-reduce busbw %.1f GB/s%s", len(reports), nodes,
                 verdict.bus_bandwidth_gbps, f" (floor {floor:g})" if floor is not None else "")
    return Preflight(node=node, ranks=len(reports), nodes=nodes,
                     collective_mib=nbytes / MIB if verdict.bus_bandwidth_gbps is not None else None,
                     bus_bandwidth_gbps=verdict.bus_bandwidth_gbps, floor_gbps=floor)
