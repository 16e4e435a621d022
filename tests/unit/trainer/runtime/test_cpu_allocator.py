"""The CPU allocator settings keep freed 64 MiB tensors' pages for the next ones; freed heap goes back on request.

Each case runs in a fresh interpreter: mallopt changes the whole process.
"""

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, resource
import torch
from rosetta_trainer.runtime.cpu_allocator import keep_freed_memory
applied = keep_freed_memory()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

# 64 MiB tensors, allocated, touched and freed as a training step does. glibc's aligned
# allocations leave small gaps that keep the first few freed blocks from being reused, so the
# heap grows for a few rounds before it settles; count only after that.
for _ in range(12):
    torch.ones(16 << 20)
before = faults()
for _ in range(5):
    torch.ones(16 << 20)
print(json.dumps({"applied": applied, "faults_per_tensor": (faults() - before) / 5}))
"""


def probe(**env) -> dict:
    import os

    base = {k: v for k, v in os.environ.items() if k != "ROSETTA_CPU_ALLOCATOR"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**base, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # ~6 s: torch in fresh processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_pages_are_reused_instead_of_faulted_in_again():
    default, tuned = probe(), probe(ROSETTA_CPU_ALLOCATOR="keep")
    pages = (64 << 20) // 4096
    # glibc's default unmaps a 64 MiB block on free: every new tensor faults its pages in again.
    assert default["faults_per_tensor"] > pages / 2
    assert tuned["applied"] is True
    assert tuned["faults_per_tensor"] < pages / 50


@pytest.mark.parametrize("value", ["", "system", "1"])
def test_without_the_opt_in_the_allocator_is_left_alone(monkeypatch, value):
    """In this process: a value that is not the opt-in returns before mallopt is reached. What glibc
    then does (every freed block unmapped) is the unset case above, measured in its own process."""
    from rosetta_trainer.runtime import cpu_allocator

    monkeypatch.setenv("ROSETTA_CPU_ALLOCATOR", value)
    monkeypatch.setattr(cpu_allocator, "_glibc", lambda: pytest.fail("reached the allocator"))
    assert cpu_allocator.keep_freed_memory() is False


TRIM_PROBE = r"""
import json
from rosetta_trainer.runtime.cpu_allocator import give_back_freed_memory

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

# 1 KiB blocks (glibc's heap, not Python's small-object arenas), 49 in 50 freed: the one in
# fifty still alive, spread over the heap, keeps glibc from trimming its top on free.
blocks = [bytearray(1024) for _ in range(100_000)]
survivors = blocks[::50]
del blocks
freed = rss_mib()
given = give_back_freed_memory()
print(json.dumps({"given": given, "freed_mib": freed, "trimmed_mib": rss_mib(), "alive": len(survivors)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_memory_freed_in_the_middle_of_the_heap_goes_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["given"] is True
    # Most of the 100 MiB freed sits in whole free pages between the survivors (about 89 MiB).
    assert result["freed_mib"] - result["trimmed_mib"] > 50, result
