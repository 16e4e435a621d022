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


def test_each_group_handed_out_first_still_exists():
    from support.worker_groups import LONGEST_FIRST, SHARED

    shared = {group for _, group in SHARED}
    gone = [g for g in LONGEST_FIRST if g not in shared and not (TESTS.parent / g).is_file()]
    assert not gone, f"support/worker_groups.py's LONGEST_FIRST names groups that no longer exist: {gone}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_make_keeps_the_collection_order_it_hands_out():
    # Without --no-loadscope-reorder xdist reorders the groups by their number of tests and
    # LONGEST_FIRST silently stops mattering.
    runs = [line for line in (TESTS.parent / "Makefile").read_text().splitlines() if "--dist loadgroup" in line]
    assert runs and all("--no-loadscope-reorder" in line for line in runs), runs
