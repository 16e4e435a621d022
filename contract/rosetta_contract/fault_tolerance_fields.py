"""spec.faultTolerance: what counts as a hang and what the operator does then, the collective
timeout of every rank, and the pre-flight check of each node (docs/operator.md, Hangs and Bad nodes).

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from rosetta_contract.strict_model import Model

# Seconds, as Kubernetes spells durations in its own APIs (terminationGracePeriodSeconds).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800
# Twice the collective timeout: a hung all-reduce ends with the trainer's own CollectiveTimeout exit
# before the operator calls the training stalled, so the more precise diagnosis wins.
DEFAULT_STALL_TIMEOUT_SECONDS = 2 * DEFAULT_COLLECTIVE_TIMEOUT_SECONDS


class PreflightSpec(Model):
    """A check of each pod's node before it trains (docs/operator.md, Bad nodes)."""

    enabled: bool = Field(
        False,
        description="Before training, every rank checks that its GPU is visible and computes correctly, and the "
                    "gang runs one all-reduce; a rank that fails exits with NodeUnhealthy (81), and on a cluster the "
                    "operator keeps the next attempts off that node.",
    )
    min_bus_bandwidth_gbps: Optional[float] = Field(
        None, gt=0, le=10_000,
        description="With GPUs, the all-reduce's bus bandwidth (GB/s, as nccl-tests reports it) below which the "
                    "node whose rank is slowest is unhealthy. None: no floor, the collective only has to finish.",
    )
    collective_mib: int = Field(
        256, ge=1, le=8192, description="Size of the pre-flight all-reduce per rank, in MiB (the bandwidth needs "
                                        "a message large enough to measure the links, not the latency).",
    )
    max_excluded_nodes: int = Field(
        4, ge=0, le=256,
        description="On a cluster, at most this many nodes are kept out of the training's next attempts; past it "
                    "the attempt restarts anywhere (a fleet-wide fault is no single node's).",
    )


class FaultToleranceSpec(Model):
    """What counts as a hang, and what happens then (docs/operator.md, Hangs)."""

    stall_timeout_seconds: int = Field(
        DEFAULT_STALL_TIMEOUT_SECONDS, ge=10, le=7 * 24 * 3600,
        description="On a cluster, the training is Stalled when rank 0's heartbeat has not moved for this long. "
                    "The trainer beats after every optimizer step, evaluation batch and checkpoint save, so a "
                    "long evaluation or save is no stall; only one batch or one save longer than this is.",
    )
    stall_action: Literal["restart", "fail", "report"] = Field(
        "restart",
        description="What the operator does with a Stalled training besides the condition and a Warning event: "
                    "restart ends the attempt's Job so that the JobSet restarts the gang from the last checkpoint "
                    "(counted towards failurePolicy.maxRestarts); fail stops the gang and fails the training; "
                    "report does nothing more.",
    )
    collective_timeout_seconds: int = Field(
        DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, ge=10, le=24 * 3600,
        description="How long one collective (all-reduce, barrier, broadcast) may wait for the other ranks "
                    "before the trainer exits with CollectiveTimeout (75); also NCCL's heartbeat timeout. "
                    "It must cover the longest time one rank works alone while the others wait, e.g. rank 0 "
                    "training the tokenizer.",
    )
    preflight: PreflightSpec = Field(default_factory=PreflightSpec,
                                     description="Check each node before training (off unless enabled).")
