"""What a training step asks of the device: operators, kernels and host-device synchronisations.

A step that is bound by the host launches too many small kernels and waits for the device where it
need not. Both are counted here from torch's profiler, the same way for an eager and a compiled step
and on any device, so that tests and bench/step_counts.py prove on a CPU what a GPU would gain:

- ops: aten operator calls, at every level (what Python and autograd dispatch).
- kernels: the calls that compute. On a GPU, the device kernels the profiler saw; elsewhere the
  leaves of the operator tree that are neither views nor allocations, plus inductor's own kernels
  (`cpp_fused_*` on the CPU, recorded when `profile_kernels()` is on before compiling), and one
  for each multi-tensor (`_foreach_*`, `_fused_*`) operator, as a GPU runs it.
- syncs: operators that make the host wait for the device on an accelerator (reading a value,
  outputs whose shape depends on the data), plus the CUDA runtime's synchronising calls. Counted
  by name, so a CPU run says what the same code would do on a GPU.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch.autograd.profiler_util import FunctionEvent

# Operators that read device memory into the host, or whose output shape depends on the data.
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::equal", "aten::masked_select",
    "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::repeat_interleave",
})
SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy", "cudaStreamWaitEvent_sync"})
# Device kernels are grouped by the start of their (often templated, very long) names.
KERNEL_NAME_CHARS, KERNEL_NAMES_KEPT = 60, 25
# Each profiled step runs under this label: syncs outside every step (the profiler's, the final wait) do not count.
STEP_MARK = "rosetta::profiled_step"
# Leaves that only describe or allocate memory: no kernel runs for them.
NO_KERNEL = frozenset({
    "aten::as_strided", "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias",
    "aten::transpose", "aten::t", "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze",
    "aten::slice", "aten::select", "aten::narrow", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::chunk", "aten::tensor_split", "aten::alias", "aten::detach", "aten::detach_", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::contiguous", "aten::flatten", "aten::unflatten", "aten::view_as", "aten::expand_as", "aten::to",
    "aten::numpy_T", "aten::set_", "aten::result_type", "aten::is_nonzero", "aten::item", "aten::broadcast_to",
    "aten::stride", "aten::size", "aten::dim", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type",
})
# Inductor's kernels as the profiler names them ("graph_0_cpp_fused_…" on a CPU, "triton_…" on a GPU).
_INDUCTOR_KERNEL = ("cpp_fused", "triton_")
# One operator over a list of tensors: a few multi-tensor kernels on a GPU, a loop over the
# tensors on a CPU. Counted as one kernel, their CPU loop's operators not at all.
_MULTI_TENSOR = ("aten::_foreach_", "aten::_fused_")
# Fused optimizers whose CPU implementation reads each parameter's step count on the host; their
# CUDA kernels keep it on the device. Their reads are not what a GPU step would wait for.
HOST_ONLY_READS = frozenset({"aten::_fused_adamw_", "aten::_fused_adam_", "aten::_fused_sgd_", "aten::_fused_adagrad_"})


@dataclass
class StepCounts:
    """Per-step figures (the profiled steps' totals over their number)."""

    ops: float
    kernels: float
    syncs: float
    # "where: operator" -> count over all profiled steps: the first place to look when syncs > 0.
    sync_sites: dict[str, int] = field(default_factory=dict)
    # On a GPU, device kernels by name (the first words) -> count over all profiled steps, most first:
    # what a kernel count is made of, where a CPU's count of the same step cannot say.
    kernel_names: dict[str, int] = field(default_factory=dict)

    def row(self) -> dict[str, float]:
        return {"ops": round(self.ops, 1), "kernels": round(self.kernels, 1), "syncs": round(self.syncs, 2)}


def profile_kernels() -> None:
    """Make inductor's CPU kernels show in the profiler (they are plain C++ calls otherwise).
    Call before the first compilation: it changes the generated code."""
    import torch._inductor.config

    torch._inductor.config.cpp.enable_kernel_profile = True


def count_step(step: Callable[[], object], steps: int = 1, where: bool = False) -> StepCounts:
    """Run `step` `steps` times under the profiler and count per step. Warm it up first: the first
    call of a compiled step compiles, and an optimizer's first step creates its state.
    `where`: record Python stacks, so that sync_sites says which line asked."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, with_stack=where) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(STEP_MARK):
                step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # outside the steps: the measurement's own wait is not counted
    return counts_of(prof.events(), steps, cuda=torch.cuda.is_available())


def counts_of(events: Iterable[FunctionEvent], steps: int = 1, cuda: bool = False) -> StepCounts:
    events = list(events)
    # A sync counts when it starts inside a step, on any thread: the backward of a CUDA step runs
    # on autograd's device thread, outside the step's operator tree but inside its time.
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == STEP_MARK]
    ops = kernels = syncs = 0
    sites: collections.Counter[str] = collections.Counter()
    device_kernels: collections.Counter[str] = collections.Counter()
    for event in events:
        name = event.name
        on_device = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if on_device:
            kernels += 1
            device_kernels[name[:KERNEL_NAME_CHARS]] += 1
            continue
        if name.startswith("aten::"):
            ops += 1
        if ((name in SYNC_OPS or name in SYNC_RUNTIME) and not _inside(event, HOST_ONLY_READS)
                and (not spans or any(start <= event.time_range.start <= end for start, end in spans))):
            syncs += 1
            sites[f"{_caller(event)}: {name}"] += 1
        if cuda or _inside(event, (), _MULTI_TENSOR):
            continue
        if name.startswith(_MULTI_TENSOR) or any(k in name for k in _INDUCTOR_KERNEL) or (
                name.startswith("aten::") and name not in NO_KERNEL and _computes_itself(event)):
            kernels += 1
    return StepCounts(ops / steps, kernels / steps, syncs / steps, dict(sites),
                      dict(device_kernels.most_common(KERNEL_NAMES_KEPT)))


def _computes_itself(event: FunctionEvent) -> bool:
    """An operator is a kernel when no operator under it computes: a leaf, or one whose children only
    describe memory (aten::mm calls aten::resolve_conj before its matrix product, say)."""
    return all(child.name in NO_KERNEL or not child.name.startswith("aten::") for child in event.cpu_children)


def _inside(event: FunctionEvent, names: frozenset[str] | tuple[()], prefixes: tuple[str, ...] = ()) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names or (prefixes and parent.name.startswith(prefixes)):
            return True
        parent = parent.cpu_parent
    return False


def _caller(event: FunctionEvent) -> str:
    """The innermost Python frame outside torch that the event ran under ("file.py(line): function";
    with stacks recorded, the profiler keeps Python calls as the operators' parents); failing that
    (the backward runs on autograd's threads, with no Python frame), the operators it ran under,
    outermost first ("autograd::engine::evaluate_function: EmbeddingBackward0 > aten::…"), or "?"."""
    parent, chain = event.cpu_parent, []
    while parent is not None:
        name: str = parent.name
        if ".py(" in name and "torch/" not in name and "step_counters.py" not in name:
            return name
        if name != STEP_MARK and ".py(" not in name:
            chain.append(name)
        parent = parent.cpu_parent
    return " > ".join(reversed(chain[:3])) or "?"
