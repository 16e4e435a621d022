"""The end-of-run report of where `make test`'s time went (tests/support/tier_times.py)."""

from __future__ import annotations

from support.tier_times import TierTimes, group_of, tier_of


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


def test_every_tests_seconds_are_kept_slowest_first():
    class Cache(dict):
        def set(self, key, value):
            self[key] = value

    config = type("Config", (), {"cache": Cache()})()
    times = TierTimes(config)
    for nodeid, when, seconds in (("tests/unit/a.py::fast", "call", 0.5), ("tests/cluster/b.py::slow@live", "setup", 3.0),
                                  ("tests/cluster/b.py::slow@live", "call", 4.0)):
        times.pytest_runtest_logreport(type("Report", (), {"nodeid": nodeid, "when": when, "duration": seconds})())
    times.pytest_terminal_summary(type("Reporter", (), {"section": print, "write_line": print})())
    kept = config.cache["rosetta/durations"]
    assert kept == {"tests/cluster/b.py::slow@live": 7.0, "tests/unit/a.py::fast": 0.5}
    assert list(kept) == ["tests/cluster/b.py::slow@live", "tests/unit/a.py::fast"]
