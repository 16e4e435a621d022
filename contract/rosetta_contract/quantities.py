"""Kubernetes resource quantities (cpu, memory, sizes) as a spec writes them, and how large one may be.

The apiserver stores `cpu: 1e100` as written, but the scheduler and the kubelet count requests in
int64 thousandths of a unit: such a pod is never scheduled, or overflows. One type for every
quantity of the spec, checked here so that `rosetta validate` refuses what would fail later.
Torch-free.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from rosetta_contract.strict_model import IntOrString

# Kubernetes' quantity grammar without the sign: a negative request, limit or size is never meant.
QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"), "Ki": Decimal(2 ** 10), "Mi": Decimal(2 ** 20), "Gi": Decimal(2 ** 30),
    "Ti": Decimal(2 ** 40), "Pi": Decimal(2 ** 50), "Ei": Decimal(2 ** 60),
}
_PARTS = re.compile(r"^\+?(?P<number>[0-9]*\.?[0-9]*)(?P<suffix>[KMGTPE]i|[numkMGTPE]?)(?P<exponent>[eE][-+]?[0-9.]+)?$")
# What the scheduler can count: int64 milli-units (resource.Quantity.MilliValue).
LARGEST = Decimal(2 ** 63 - 1) / 1000


def quantity_value(text: str) -> Decimal:
    """The value of a quantity that matches QUANTITY, in units (cores, bytes)."""
    m = _PARTS.match(text)
    if m is None:
        raise ValueError(f"'{text}' is not a Kubernetes quantity")
    try:
        value = Decimal(m["number"]) * _SUFFIXES[m["suffix"]]
        if m["exponent"]:
            value = value.scaleb(Decimal(m["exponent"][1:]))
    except (InvalidOperation, ValueError, OverflowError):
        # A fractional exponent (1e1.5): the grammar's regex admits it, Kubernetes' parser does not.
        raise ValueError(f"'{text}' is not a Kubernetes quantity (the exponent must be a whole number)") from None
    return value


def _number_to_str(value: Any) -> Any:
    # YAML reads `cpu: 8` as an int; Kubernetes quantities are int-or-string (not float: `cpu: 0.5`
    # is refused by the apiserver, so here too).
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        # 1e9: a whole number to the apiserver; 1e100 stays short (and is refused for its size).
        return str(int(value)) if abs(value) < 1e18 else f"{value:g}".replace("+", "")
    return value


def _countable(value: str) -> str:
    # pydantic's own messages would print the regex or count "items"; say what a valid value looks like.
    if len(value) > 64 or not re.match(QUANTITY, value):
        raise ValueError(f"'{value}' is not a non-negative Kubernetes quantity (e.g. 8, 7500m, 64Gi)")
    if quantity_value(value) > LARGEST:
        raise ValueError(f"'{value}' is more than Kubernetes counts (at most about 9.2e15: cores, or bytes, "
                         "in int64 thousandths)")
    return value


Quantity = Annotated[
    str,
    IntOrString(),
    BeforeValidator(_number_to_str),
    AfterValidator(_countable),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}],
                    "maxLength": 64, "pattern": QUANTITY}),
]
