"""The test tree itself: pytest imports test modules by basename (no packages under tests/), so two
files of one name in different folders stop the whole run at collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_name():
    by_name = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    assert not {name: paths for name, paths in by_name.items() if len(paths) > 1}
