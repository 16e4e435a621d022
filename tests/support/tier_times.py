"""A pytest plugin (pyproject.toml's addopts load it): at the end of a run, a line per tier with its tests
and minutes, and the run's wall time, so that `make test` says where its time went.

A tier is the folder under tests/ (unit, training, cluster, ...); a test's time is its setup, call
and teardown, so a session fixture's first use (a cluster, an image build) counts in the tier of the
test that paid for it. Under xdist it also gives the minutes of each shared group
(tests/support/worker_groups.py: one worker runs a group from start to end, so the longest group is
a floor under the wall time) and of each worker (how evenly the rest filled around them).

Every test's seconds also go into pytest's cache (`.pytest_cache/v/rosetta/durations`, slowest first),
since `--durations` prints only the top of a list whose long tail is most of the time. In a run
that leaves the slow tests out (`make test-fast`: `-m "not slow and not cluster"`), a test that took
more than SLOW_SECONDS is named at the end: that run stays within its minutes only while every test
in it stays short, so such a test is to be marked `slow`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SLOW_SECONDS = 4.0


class TierTimes:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.per_test: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.groups: dict[str, float] = defaultdict(float)
        self.workers: dict[str, float] = defaultdict(float)
        # Only where slow tests were left out: a full run's load stretches short tests past the line.
        option = getattr(config, "option", None)
        self.fast_run = "not slow" in (getattr(option, "markexpr", "") or "")
        self.unmarked: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = tier_of(report.nodeid)
        self.seconds[tier] += report.duration
        self.per_test[report.nodeid] += report.duration
        self.tests[tier].add(report.nodeid)
        if self.fast_run and "slow" not in report.keywords:
            self.unmarked.add(report.nodeid)
        group = group_of(report.nodeid)
        if group:
            self.groups[group] += report.duration
        worker = getattr(getattr(report, "node", None), "gateway", None)
        if worker is not None:
            self.workers[worker.id] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("time per tier")
        for tier in sorted(self.seconds, key=lambda t: -self.seconds[t]):
            terminalreporter.write_line(f"{tier:<12} {len(self.tests[tier]):>5} tests {self.seconds[tier] / 60:7.1f} min")
        terminalreporter.write_line(f"{'(wall)':<12} {sum(map(len, self.tests.values())):>5} tests "
                                    f"{(time.monotonic() - self.started) / 60:7.1f} min")
        for title, seconds in (("shared group", self.groups), ("worker", self.workers)):
            for name in sorted(seconds, key=lambda n: -seconds[n]):
                terminalreporter.write_line(f"{title} {name:<{23 - len(title)}} {seconds[name] / 60:7.1f} min")
        too_long = sorted(((s, t) for t, s in self.per_test.items() if t in self.unmarked and s > SLOW_SECONDS),
                          reverse=True)
        if too_long:
            terminalreporter.write_line(f"not marked slow, over {SLOW_SECONDS:.0f} s:")
            for seconds, test in too_long:
                terminalreporter.write_line(f"  {seconds:6.1f} s {test}")
        cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
        if cache is not None:
            slowest = sorted(self.per_test.items(), key=lambda item: -item[1])
            cache.set("rosetta/durations", {test: round(s, 2) for test, s in slowest})


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def group_of(nodeid: str) -> str:
    """The shared group xdist's loadgroup appended to the node id (`...::test@node`); "" for a file's own."""
    _, at, group = nodeid.rpartition("@")
    return group if at and group.isidentifier() else ""


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierTimes(config), "tier-times")
