"""The CPU allocator settings keep freed 64 MiB tensors' pages for the next ones.

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_pages_are_reused_instead_of_faulted_in_again():
    default, tuned = probe(), probe(ROSETTA_CPU_ALLOCATOR="keep")
    pages = (64 << 20) // 4096
    # glibc's default unmaps a 64 MiB block on free: every new tensor faults its pages in again.
    assert default["faults_per_tensor"] > pages / 2
    assert tuned["applied"] is True
    assert tuned["faults_per_tensor"] < pages / 50


def test_without_the_opt_in_the_allocator_is_left_alone():
    for value in ("", "system", "1"):
        result = probe(ROSETTA_CPU_ALLOCATOR=value)
        assert result["applied"] is False
        assert result["faults_per_tensor"] > (64 << 20) // 4096 / 2
