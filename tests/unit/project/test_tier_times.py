"""The end-of-run report of where `make test`'s time went (tests/support/tier_times.py)."""

from __future__ import annotations

from support.tier_times import group_of, tier_of


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
