"""Label keys and values as the apiserver admits them (metadata.labels, node selectors, topology keys).

A key is [DNS subdomain (at most 253)/]name (at most 63); a value at most 63 characters, alphanumeric
at both ends. Torch-free.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from rosetta_contract.strict_model import matches

QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _parts_fit(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        raise ValueError(f"'{key}': the name after the prefix has {len(name)} characters; at most 63")
    if len(prefix) > 253:
        raise ValueError(f"'{key}': the prefix before '/' has {len(prefix)} characters; at most 253")
    return key


LabelKey = Annotated[str, Field(min_length=1, max_length=317, json_schema_extra={"pattern": QUALIFIED_NAME}),
                     matches(QUALIFIED_NAME, "a label key ([prefix/]name, e.g. cloud.google.com/gke-nodepool: "
                                             "letters, digits, '-', '_' and '.', alphanumeric at both ends)"),
                     AfterValidator(_parts_fit)]
LabelValue = Annotated[str, Field(max_length=63, json_schema_extra={"pattern": LABEL_VALUE}),
                       matches(LABEL_VALUE, "a label value (letters, digits, '-', '_' and '.', alphanumeric at both ends)")]
