"""The end-of-run report of where `make test`'s time went (tests/support/tier_times.py)."""

from __future__ import annotations

from types import SimpleNamespace

from support.tier_times import SLOW_SECONDS, TierTimes, group_of, tier_of


def test_a_test_counts_in_the_folder_below_tests():
    assert tier_of("tests/cluster/test_real_pods.py::test_x@node") == "cluster"
    assert tier_of("tests/unit/trainer/engine/test_loop.py::test_y") == "unit"


def test_only_the_shared_groups_are_named():
    assert group_of("tests/cluster/test_real_pods.py::test_x@node") == "node"
    assert group_of("tests/integration/test_a.py::test_b[x]@apiserver") == "apiserver"
    # A file's own group (its path), a run without xdist, an "@" inside a parameter: none.
    assert group_of("tests/training/test_compile.py::test_c@tests/training/test_compile.py") == ""
    assert group_of("tests/unit/test_d.py::test_e") == ""
    assert group_of("tests/unit/test_d.py::test_e[user@host.example]") == ""


class Cache(dict):
    def set(self, key, value):
        self[key] = value


def report_of(reports: list[tuple[str, str, float, tuple[str, ...]]],
              markexpr: str = "") -> tuple[TierTimes, list[str]]:
    """The plugin fed (node id, phase, seconds, markers) reports, and the lines it ends the run with."""
    times = TierTimes(type("Config", (), {"cache": Cache(), "option": SimpleNamespace(markexpr=markexpr)})())
    for nodeid, when, seconds, marks in reports:
        keywords = {nodeid.rpartition("::")[2]: 1, **dict.fromkeys(marks, 1)}
        times.pytest_runtest_logreport(type("Report", (), {"nodeid": nodeid, "when": when, "duration": seconds,
                                                           "keywords": keywords})())
    lines: list[str] = []
    times.pytest_terminal_summary(type("Reporter", (), {"section": lines.append, "write_line": lines.append})())
    return times, lines


def test_every_tests_seconds_are_kept_slowest_first():
    times, _ = report_of([("tests/unit/a.py::fast", "call", 0.5, ()),
                          ("tests/cluster/b.py::slow@live", "setup", 3.0, ("slow", "cluster")),
                          ("tests/cluster/b.py::slow@live", "call", 4.0, ("slow", "cluster"))])
    kept = times.config.cache["rosetta/durations"]
    assert kept == {"tests/cluster/b.py::slow@live": 7.0, "tests/unit/a.py::fast": 0.5}
    assert list(kept) == ["tests/cluster/b.py::slow@live", "tests/unit/a.py::fast"]


def test_a_long_test_not_marked_slow_is_named_where_slow_tests_were_left_out():
    """Setup and call add up; a slow-marked test, and a short one, are not named; nor is anything in
    a run that did not leave slow tests out (its load stretches every test)."""
    reports = [("tests/unit/a.py::long", "setup", 3.0, ()), ("tests/unit/a.py::long", "call", 2.5, ()),
               ("tests/unit/a.py::short", "call", 3.9, ()), ("tests/training/b.py::marked", "call", 60.0, ("slow",))]
    _, lines = report_of(reports, markexpr="not slow and not cluster")
    named = lines[lines.index(f"not marked slow, over {SLOW_SECONDS:.0f} s:") + 1:]
    assert [line.split() for line in named] == [["5.5", "s", "tests/unit/a.py::long"]]
    _, lines = report_of(reports)
    assert not [line for line in lines if "not marked slow" in line]
