"""Writes rosetta_contract/core_types.json: the core/v1 types that free-form spec fields are checked against.

The contract checks `scheduling.affinity` in every process that reads a spec, the trainer's pods
included, whose image has no Kubernetes client. So the client's generated models (each type's JSON
field names and their types) are read here, once, on the operator's side, and the table they give
is committed; `make generate` rewrites it and `make verify` fails when it is stale (a client upgrade
that adds a field).

    python -m rosetta_operator.core_types_table > contract/rosetta_contract/core_types.json
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from rosetta_contract.core_types import ROOTS

_INNER = re.compile(r"^(?:[Ll]ist\[(.+)\]|[Dd]ict\((?:str|String), ?(.+)\)|[Dd]ict\[str, ?(.+)\])$")


def table(roots: tuple[str, ...] = ROOTS) -> dict[str, dict[str, str]]:
    """{type: {json field: type string}} for the roots and every model type they reach."""
    from kubernetes.client import models

    out: dict[str, dict[str, str]] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        cls: Any = getattr(models, name, None)
        if name in out or cls is None:
            continue
        out[name] = {cls.attribute_map[field]: kind for field, kind in cls.openapi_types.items()}
        for kind in out[name].values():
            while m := _INNER.match(kind):
                kind = next(g for g in m.groups() if g)
            if getattr(models, kind, None) is not None:
                pending.append(kind)
    return dict(sorted(out.items()))


def main() -> None:
    json.dump(table(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
