"""The container's memory as its cgroup (v2) counts it: how often the kernel killed a process at the
limit, the limit and the peak. The launcher (launch.py) reads it when the trainer died without
naming why: a worker killed at the limit leaves the launcher, the container's first process, alive,
and only the cgroup says what happened. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# Where a container sees its own cgroup (cgroup v2 in a private cgroup namespace, as containerd and
# CRI-O set it up); the variable points elsewhere for tests.
CGROUP_DIR_ENV = "ROSETTA_CGROUP_DIR"
DEFAULT_CGROUP_DIR = "/sys/fs/cgroup"


def cgroup_dir() -> Path:
    return Path(os.environ.get(CGROUP_DIR_ENV) or DEFAULT_CGROUP_DIR)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def oom_kills(directory: Path) -> Optional[int]:
    """memory.events' oom_kill: processes the kernel killed at this cgroup's limit (None: no cgroup v2)."""
    for line in (_read(directory / "memory.events") or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _bytes(value: Optional[str]) -> Optional[int]:
    return int(value) if value and value.isdigit() else None


def human(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@dataclass(frozen=True)
class MemoryFigures:
    limit: Optional[int]  # memory.max; None: no limit ("max") or no cgroup
    peak: Optional[int]   # memory.peak (Linux 5.19+)

    def describe(self) -> str:
        return f"limit {human(self.limit) if self.limit else 'none'}, peak {human(self.peak)}"


def memory_figures(directory: Path) -> MemoryFigures:
    return MemoryFigures(_bytes(_read(directory / "memory.max")), _bytes(_read(directory / "memory.peak")))


def oom_message(figures: MemoryFigures) -> str:
    """The termination message's text for a process killed at the container's memory limit."""
    return (f"a process of the container was killed by the kernel at its memory limit ({figures.describe()}): "
            "raise spec.resources.memory (with /dev/shm, resources.shmSize, inside it), or lower "
            "training.batch.tokens or the data loader's workers")
