"""Kubernetes quantities: their value as the scheduler counts it, and the largest one it can."""

from decimal import Decimal

import pytest

from rosetta_contract.quantities import LARGEST, quantity_value


@pytest.mark.parametrize("text, value", [
    ("8", 8), ("7500m", Decimal("7.5")), ("64Gi", 64 * 2**30), ("1.5k", 1500), ("1e3", 1000), ("2E2", 200),
    (".5", Decimal("0.5")), ("5.", 5), ("+3", 3), ("100n", Decimal("1e-7")), ("1Ei", 2**60), ("1e-3", Decimal("0.001")),
])
def test_a_quantity_has_the_value_kubernetes_gives_it(text, value):
    assert quantity_value(text) == value


def test_the_largest_quantity_is_what_int64_thousandths_hold():
    assert LARGEST * 1000 == 2**63 - 1
    assert quantity_value("8Pi") < LARGEST < quantity_value("9Pi")


def test_a_fractional_exponent_is_not_a_quantity():
    with pytest.raises(ValueError, match="exponent must be a whole number"):
        quantity_value("1e1.5")
