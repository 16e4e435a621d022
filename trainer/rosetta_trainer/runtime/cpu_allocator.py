"""Keep freed memory in the training process instead of handing it back to the OS every step.

glibc serves allocations above 32 MiB (and, before its threshold adapts, above 128 KiB) with a
fresh mmap and unmaps them on free. A training step allocates and frees the same large
tensors (activations, the logit matrix and its gradient) every time, so each step pays page
faults and zeroing for memory it just returned: on CPU that was half the step time of a small
translation model. Turning mmap off for the allocator and raising the trim threshold keeps the
pages in the heap for the next step. This is what PyTorch's CPU performance guides get by
preloading jemalloc or tcmalloc, done with glibc's own `mallopt`, so nothing extra is
installed. The process keeps its peak heap until it exits, which a training process needs
again at the next step anyway.

Opt-in, with ROSETTA_CPU_ALLOCATOR=keep: heap blocks start at varying offsets within a page
where fresh mappings always start at the same one, and MKL's matrix kernels can round
differently with the offset. A run resumed from a checkpoint then drifts from an
uninterrupted one in the last bits (seen in tests/faults/test_kill_resume.py), where with
glibc's defaults it is bitwise identical.

The other way round, at a few points of a first start: `give_back_freed_memory` after a phase
whose freed memory the next one cannot reuse (the tokenizer's training, before the corpus is
tokenized; the writing of the prepared shards, before the plan and the model).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int
ENV = "ROSETTA_CPU_ALLOCATOR"


def keep_freed_memory() -> bool:
    """Apply the settings above to this process (and the loader processes it forks later).

    Returns whether they were applied: only with ROSETTA_CPU_ALLOCATOR=keep, and on glibc.
    """
    if os.environ.get(ENV, "").lower() != "keep":
        return False
    libc = _glibc()
    if libc is None:
        return False
    applied = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not applied:
        log.warning("mallopt refused the CPU allocator settings; training runs with glibc's defaults")
    return applied


def give_back_freed_memory() -> bool:
    """Return the heap's free pages to the OS (glibc's malloc_trim); whether any were returned.

    For the end of a phase that freed much more than what comes next allocates: the tokenizer
    trainer's working memory (some 100 MiB of small blocks, docs/benchmarks.md) stays in the
    process's RSS after it is freed, and the tokenizing that follows, whose own allocations are
    smaller and differently sized, stacks its peak on top instead of reusing it.
    """
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


@functools.cache  # find_library runs `ldconfig -p` in a subprocess: once per process is enough
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has mallopt and malloc_trim with these meanings
    except (OSError, AttributeError, TypeError):
        return None
    return libc
