"""pydantic's JSON Schema → the structural OpenAPI v3 schema a Kubernetes CRD needs.

pydantic emits JSON Schema 2020-12; a CRD needs a *structural* schema (every node typed, no $ref,
nullable instead of anyOf-null, boolean exclusiveMinimum). `structural()` does that conversion.
"""

from __future__ import annotations

from typing import Any

# Keywords a CRD schema may carry and that we keep as they are.
_KEEP = {"type", "description", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern",
         "minItems", "maxItems", "nullable", "required", "format",
         "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One pydantic JSON-schema node → a structural OpenAPI v3 node (recursively)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # The field's own description beats the model's docstring.
        node = {**target, **{k: v for k, v in node.items() if k in ("description", "default")}}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        # Optional[X] → X, nullable; any other union has no structural form.
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node['anyOf']}")
        one = structural(options[0], defs)
        if len(options) < len(node["anyOf"]):
            one["nullable"] = True
        if "description" in node:
            one["description"] = node["description"]
        if "default" in node and _scalar(node["default"]):
            one["default"] = node["default"]
        return one
    out: dict[str, Any] = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    for key, value in node.items():
        if key in _KEEP:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # JSON Schema's numeric exclusive bounds → OpenAPI v3.0's boolean flags.
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:
            out[flag] = node[bound]
            out[bound] = True
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: structural(v, defs) for k, v in node["properties"].items()}
    elif node.get("type") == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural(extra, defs)
        else:  # dict[str, Any]: free-form (affinity)
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "prefixItems" in node:  # tuple[float, float] → a fixed-length array of one type
        kinds = [structural(i, defs) for i in node["prefixItems"]]
        if any(k != kinds[0] for k in kinds):
            raise ValueError(f"cannot express a mixed tuple in a structural schema: {kinds}")
        out["items"] = kinds[0]
    elif "items" in node:
        out["items"] = structural(node["items"], defs)
    if "default" in node and _scalar(node["default"]):
        # Only scalars: null needs nullable, and object/array defaults would be
        # pydantic's resolved factories, which the apiserver need not know.
        out["default"] = node["default"]
    if out.get("required") == []:
        out.pop("required")
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and value is not None


def node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node at a dotted property path; `[]` steps into array items."""
    node = schema
    for part in path.split(".") if path else []:
        if part == "[]":
            node = node["items"]
        else:
            node = node["properties"][part]
    return node
