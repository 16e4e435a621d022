"""Process-group setup from the environment torchrun (or the deepspeed launcher) provides.

Run alone, the trainer is a world of one and no process group is created.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from rosetta_trainer.data.examples import DataError

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device
    local_size: int | None = None  # ranks on this node (torchrun's LOCAL_WORLD_SIZE); None: not told
    timeout_s: int | None = None  # spec.faultTolerance.collectiveTimeoutSeconds; None: torch's default

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def spans_nodes(self) -> bool:
        """Whether ranks run on more than one node (or may: a launcher that does not say so)."""
        return self.distributed and self.local_size != self.size


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if preference == "cuda":
        raise RuntimeError("spec.training.device is 'cuda' but no CUDA device is visible")
    return torch.device("cpu")


def init_world(device_preference: str = "auto", timeout_s: int = 1800) -> World:
    """`timeout_s` bounds every collective of the default group and of control_group's."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ["LOCAL_WORLD_SIZE"]) if os.environ.get("LOCAL_WORLD_SIZE") else None
    device = pick_device(device_preference, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return World(rank=rank, local_rank=local_rank, size=size, device=device, local_size=local_size,
                 timeout_s=timeout_s)


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def all_gather_objects(world: World, obj: T) -> list[T]:
    """Every rank's `obj`, in rank order (a list of one when alone)."""
    if not world.distributed:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(world: World, obj: T, src: int = 0) -> T:
    if not world.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def failure(exc: Exception, rank: int, doing: str) -> tuple[str, str]:
    """(kind, message) of an error in work one rank does for all (preparing the data, training
    the tokenizer), to send to the others so that every rank raises it alike rather than waiting
    for that rank forever. A data error and a plain refusal keep their own message: a data
    error becomes the training's DataInvalid condition, word for word."""
    if isinstance(exc, DataError):
        return "data", str(exc)
    if type(exc) is ValueError:
        return "value", str(exc)
    return "other", f"rank {rank} could not {doing}: {type(exc).__name__}: {exc}"


def raise_failures(failures: list[tuple[str, str]]) -> None:
    """Raise what `failure` described, a data error first; nothing when the list is empty."""
    for kind, cls in (("data", DataError), ("value", ValueError)):
        messages = [message for k, message in failures if k == kind]
        if messages:
            raise cls(messages[0])
    if failures:
        raise RuntimeError("; ".join(message for _, message in failures))


def all_reduce_sum(world: World, tensor: torch.Tensor) -> torch.Tensor:
    if world.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def control_group(world: World) -> dist.ProcessGroup | None:
    """A gloo group for small CPU-side agreements (stop flags) that must not wait on the GPU;
    None (the default group) when the world already runs on gloo or alone."""
    if not world.distributed or dist.get_backend() == "gloo":
        return None
    timeout = datetime.timedelta(seconds=world.timeout_s) if world.timeout_s else None
    group: dist.ProcessGroup = dist.new_group(backend="gloo", timeout=timeout)
    return group


def all_reduce_sum_async(world: World, tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> dist.Work:
    """Start a sum-reduce and return its handle (`.wait()` before reading `tensor`)."""
    # async_op: a handle to wait on, never None.
    return cast(dist.Work, dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True))


class CollectiveTimeout(RuntimeError):
    """A collective waited spec.faultTolerance.collectiveTimeoutSeconds for a rank that never came
    (rosetta_contract.exits.COLLECTIVE_TIMEOUT_EXIT)."""


# How torch says a collective timed out. NCCL (with TORCH_NCCL_ASYNC_ERROR_HANDLING=2, pod_template.py)
# raises DistBackendError from its watchdog's report, or says the communicator was aborted for it;
# gloo raises a plain RuntimeError from its transport, then closes the pair; the TCPStore's waits
# raise DistStoreError.
_TIMED_OUT = re.compile(r"timed out|timeout", re.I)
_GLOO_TIMED_OUT = re.compile(r"gloo.*timed out|timed out waiting \d+ms for (recv|send)|"
                             r"application timeout caused pair closure", re.I | re.S)


def collective_timeout(exc: BaseException) -> CollectiveTimeout | None:
    """`exc` as a CollectiveTimeout when it, or an error it was raised from, is torch's report of a
    collective that timed out; None for anything else (a peer that crashed, a bug)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, CollectiveTimeout):
            return cause
        text = str(cause)
        if (isinstance(cause, dist.DistError) and _TIMED_OUT.search(text)) \
                or (isinstance(cause, RuntimeError) and _GLOO_TIMED_OUT.search(text)):
            said = " ".join(text.split())[:600]
            return CollectiveTimeout(f"a collective operation timed out (spec.faultTolerance.collectiveTimeoutSeconds): "
                                     f"{said}; another rank stopped answering, see its log")
        cause = cause.__cause__ or cause.__context__
    return None


def close(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
