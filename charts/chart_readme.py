"""charts/rosetta/README.md, generated from values.yaml: a table of every value with its type (from
the values schema, charts/values_schema.py), its default and its description, read from the
helm-docs comments above it:

    # -- What the value does; further `#` lines continue the sentence.
    # @default -- what to show instead of the literal default (e.g. "the chart's appVersion")
    key: value

    .venv/bin/python charts/chart_readme.py > charts/rosetta/README.md

Every value needs a description, on itself or on a mapping above it: the generator stops, naming
the values that have none. tests/unit/project/test_chart_readme.py fails when the committed README differs
from this output, and `make verify` when `make generate` changed it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "rosetta"
VALUES = CHART / "values.yaml"
REGENERATE = "python charts/chart_readme.py > charts/rosetta/README.md"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?:\s|$)")


class Doc(NamedTuple):
    path: str
    description: str
    default: Optional[str]  # the `@default --` text, shown instead of the value


def comments(text: str) -> list[Doc]:
    """The documented keys of a values file, in file order: a `# --` comment and the comment lines
    right after it belong to the key below them. A blank line or a list item ends a comment."""
    docs: list[Doc] = []
    stack: list[tuple[int, str]] = []
    description: Optional[list[str]] = None
    default: Optional[str] = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# @default --"):
            default = stripped.removeprefix("# @default --").strip()
            continue
        if stripped.startswith("# --"):
            description, default = [stripped.removeprefix("# --").strip()], None
            continue
        if stripped.startswith("#"):
            if description is not None:
                description.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match["key"]))
            if description is not None:
                docs.append(Doc(".".join(k for _, k in stack), " ".join(description), default))
        description, default = None, None
    return docs


def _lookup(values: Any, path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def _leaves(values: Any, path: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for key, child in values.items() for leaf in _leaves(child, f"{path}.{key}" if path else key)]
    return [path]


def _schema_node(schema: dict, path: str) -> dict:
    for key in path.split("."):
        schema = schema.get("properties", {}).get(key, {})
    return schema


def _type(node: dict) -> str:
    kinds = node.get("type", "")
    text = " or ".join(kinds) if isinstance(kinds, list) else kinds
    if "enum" in node:
        text += " (" + ", ".join(f"`{v}`" for v in node["enum"]) + ")"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value: Any) -> str:
    shown = json.dumps(value, separators=(",", ":"))
    return f"`{shown}`"


def build(values_path: Path = VALUES, chart_path: Path = CHART / "Chart.yaml") -> str:
    sys.path.insert(0, str(HERE))
    try:
        import values_schema
    finally:
        sys.path.remove(str(HERE))
    text = values_path.read_text()
    values = yaml.safe_load(text)
    chart = yaml.safe_load(chart_path.read_text())
    schema = values_schema.build(values_path)
    docs = comments(text)

    documented = {d.path for d in docs}
    unknown = sorted(documented - {p for leaf in _leaves(values) for p in _prefixes(leaf)})
    if unknown:
        raise SystemExit(f"chart_readme.py: comments for keys values.yaml does not have: {unknown}")
    bare = [leaf for leaf in _leaves(values) if not documented & set(_prefixes(leaf))]
    if bare:
        raise SystemExit("chart_readme.py: values without a `# --` description (on the value or a mapping above "
                         f"it) in values.yaml: {', '.join(bare)}")

    docs_url = f"{chart['home']}/blob/main/docs"
    lines = [
        f"# {chart['name']}",
        "",
        chart["description"],
        "",
        f"Chart version {chart['version']}, app version {chart['appVersion']}; Kubernetes "
        f"`{chart['kubeVersion']}` with the JobSet controller.",
        "",
        f"The chart's guide: [docs/helm.md]({docs_url}/helm.md). From an empty cloud account to a GPU "
        f"training: [docs/eks.md]({docs_url}/eks.md), [docs/gke.md]({docs_url}/gke.md).",
        "",
        "```sh",
        "helm install rosetta charts/rosetta -n rosetta-system --create-namespace",
        "```",
        "",
        "Generated from the comments of `values.yaml` by `charts/chart_readme.py` (`make generate`); edit "
        "those, not this file.",
        "",
        "## Values",
        "",
        "| Key | Type | Default | Description |",
        "|-----|------|---------|-------------|",
    ]
    for doc in docs:
        default = doc.default if doc.default is not None else _default(_lookup(values, doc.path))
        lines.append(f"| `{doc.path}` | {_cell(_type(_schema_node(schema, doc.path)))} | {_cell(default)} | "
                     f"{_cell(doc.description)} |")
    return "\n".join(lines) + "\n"


def _prefixes(path: str) -> list[str]:
    keys = path.split(".")
    return [".".join(keys[:i]) for i in range(1, len(keys) + 1)]


def text() -> str:
    return build()


if __name__ == "__main__":
    sys.stdout.write(text())
