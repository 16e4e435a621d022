"""Which tests one pytest-xdist worker runs together, and which groups are handed out first.

`make test` runs two workers (`--dist loadgroup --no-loadscope-reorder`). Tests that share a
session-wide resource go to one worker as a group, so that it is built and started once: the
simulated cluster (`live`), the real node with the images it runs (`node`), the control plane of
tests/integration (`apiserver`). These mostly wait on controllers and containers, so they overlap
well with each other and with the CPU-bound tiers. Every other test is grouped with its file (a
module-scoped training, say, then runs once).
"""

from __future__ import annotations

from typing import Iterable

# A test using the fixture goes to the group; the first match wins.
SHARED = (
    ("node_cluster", "node"), ("images", "node"), ("test_base", "node"), ("docker_engine", "node"),
    ("local_registry", "node"), ("live_cluster", "live"), ("cluster", "apiserver"),
)

# The groups that take longest, longest first (worker-seconds of warm runs on two cores,
# 2026-11-29: live ~670, node ~560, kill_resume ~240, deepspeed ~210, gpu_checks ~180, compile
# ~100-180, apiserver ~130, local_run ~130). xdist hands groups out in collection order under
# `--no-loadscope-reorder` (by default it orders them by their number of tests, which put the
# one-test gpu_checks last), and a worker takes its next group when it has two tests left: a long
# group handed out last is the run's tail, the other worker idle while it runs. With these first,
# the many short files fill in around them at the end. The test tree's own test checks that each
# entry still names a group.
LONGEST_FIRST = (
    "live", "node", "tests/faults/test_kill_resume.py", "tests/training/test_deepspeed.py",
    "tests/training/test_gpu_checks.py", "tests/training/test_compile.py", "apiserver",
    "tests/localrun/test_local_run.py", "tests/faults/test_sigterm_grace.py",
    "tests/training/test_training.py",
    "tests/faults/test_collective_timeout.py",
)


def group_of(fixtures: Iterable[str], nodeid: str) -> str:
    """The xdist group of a test: a shared resource's, else its file's."""
    fixtures = set(fixtures)
    return next((group for fixture, group in SHARED if fixture in fixtures), nodeid.split("::")[0])


def rank(group: str) -> int:
    """Where a group goes in the queue: the long ones by their place, the rest after them."""
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)
