#!/usr/bin/env python3
"""The diagram in docs/architecture.md, drawn from the code: the four packages and the imports between
them, each package's modules, and for every package a layers contract of pyproject.toml places, its
layers top to bottom.

    .venv/bin/python scripts/architecture_diagram.py            # rewrite the block in docs/architecture.md
    .venv/bin/python scripts/architecture_diagram.py --check    # exit 1 when the block is stale

The imports are grimp's graph, the one import-linter checks, so an import inside a function counts.
An arrow between packages is an import that exists; an arrow between two layers says some module of
the upper one imports one of the lower, left out where a path through other layers already implies it.
A layer's title is the comment above it in pyproject.toml, up to its first colon or semicolon (its
modules' names where it has none).
Modules a non-exhaustive contract has not placed yet get a box of their own; packages no contract
layers (the command line) are drawn flat, as it is. A subpackage named as a layer brings all its modules.

The output is sorted and carries no date, so running it twice changes nothing, and only the text
between the two markers is rewritten. tests/unit/project/test_architecture_diagram.py fails when the
committed block differs from this output; `make verify` when `make generate` changed it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import grimp

if sys.version_info >= (3, 11):
    import tomllib
else:  # import-linter, which the dev extra installs, brings tomli on 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
DOC = REPO / "docs" / "architecture.md"
BEGIN = "<!-- BEGIN GENERATED: architecture -->"
END = "<!-- END GENERATED -->"
REGENERATE = "make architecture (or: .venv/bin/python scripts/architecture_diagram.py)"
# Dagre puts a box's unlinked nodes in one row; past this many, they wrap into rows of this size.
ROW = 6


@dataclass(frozen=True)
class Layer:
    title: str
    modules: Tuple[str, ...]  # full names, each placed name's submodules included


@dataclass(frozen=True)
class Package:
    name: str
    path: str
    layers: Tuple[Layer, ...]  # top to bottom; empty for a package no contract layers
    unplaced: Tuple[str, ...]  # in a layered package, modules in no layer; otherwise all of them


def _layer_names(raw: str) -> List[str]:
    # import-linter's syntax: "a : b" siblings, "a | b" independent siblings, "(a)" optional.
    return [name.strip().strip("()").strip() for name in re.split(r"[:|]", raw) if name.strip()]


def _comment_above(text: str, raw: str) -> Optional[str]:
    """The comment lines right above a layer's string in pyproject.toml, up to the first colon or
    semicolon, without the final period."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip().rstrip(",") in (f'"{raw}"', f"'{raw}'"):
            comment: List[str] = []
            above = index - 1
            while above >= 0 and lines[above].strip().startswith("#"):
                comment.insert(0, lines[above].strip().lstrip("#").strip())
                above -= 1
            joined = " ".join(comment)
            head = re.split(r"[:;]", joined, maxsplit=1)[0].strip().rstrip(".")
            return head or None
    return None


def _members(name: str, modules: Iterable[str]) -> List[str]:
    return sorted(m for m in modules if m == name or m.startswith(name + "."))


def packages(graph: grimp.ImportGraph, pyproject: Path = PYPROJECT) -> List[Package]:
    text = pyproject.read_text()
    config = tomllib.loads(text)["tool"]["importlinter"]
    roots = sorted(config["root_packages"])
    contracts = {container: contract for contract in config.get("contracts", [])
                 if contract.get("type") == "layers" for container in contract.get("containers", [])}
    found = []
    for root in roots:
        own = sorted(m for m in graph.modules if m.startswith(root + "."))
        contract = contracts.get(root)
        layers: List[Layer] = []
        placed: Set[str] = set()
        for number, raw in enumerate(contract["layers"] if contract else [], start=1):
            names = _layer_names(raw)
            modules = [m for name in names for m in _members(f"{root}.{name}", own)]
            placed.update(modules)
            title = _comment_above(text, raw) or " · ".join(names)
            if "|" in raw:
                title += " (independent: none imports another)"
            layers.append(Layer(f"{number}. {title}", tuple(sorted(modules))))
        directory = root.removeprefix("rosetta_")
        found.append(Package(root, f"{directory}/{root}/", tuple(layers),
                             tuple(m for m in own if m not in placed)))
    return found


def _first_party(module: str, roots: Iterable[str]) -> Optional[str]:
    top = module.split(".")[0]
    return top if top in roots else None


def package_imports(graph: grimp.ImportGraph, roots: List[str]) -> List[Tuple[str, str]]:
    edges = set()
    for module in graph.modules:
        source = _first_party(module, roots)
        if source is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            target = _first_party(imported, roots)
            if target is not None and target != source:
                edges.add((source, target))
    return sorted(edges)


def layer_imports(graph: grimp.ImportGraph, layers: Tuple[Layer, ...]) -> List[Tuple[int, int]]:
    """(upper, lower) layer indexes where a module of the upper imports one of the lower, less the
    pairs a path through other layers implies."""
    where = {m: index for index, layer in enumerate(layers) for m in layer.modules}
    direct: Dict[int, Set[int]] = {index: set() for index in range(len(layers))}
    for module, index in where.items():
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in where and where[imported] != index:
                direct[index].add(where[imported])

    def reachable(start: int, skip: int) -> Set[int]:
        seen: Set[int] = set()
        work = [n for n in direct[start] if n != skip]
        while work:
            node = work.pop()
            if node not in seen:
                seen.add(node)
                work.extend(direct[node])
        return seen

    return sorted((upper, lower) for upper, lowers in direct.items() for lower in lowers
                  if lower not in reachable(upper, lower))


def _id(name: str) -> str:
    return name.replace(".", "__")


def _label(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def _box(ident: str, title: str, modules: Iterable[str], root: str, indent: str) -> List[str]:
    modules = list(modules)
    lines = [f"{indent}subgraph {ident} [{_label(title)}]"]
    for module in modules:
        lines.append(f"{indent}    {_id(module)}[{_label(module.removeprefix(root + '.'))}]")
    # Invisible links stack the rows: each node sits above the one ROW places after it.
    for upper, lower in zip(modules, modules[ROW:]):
        lines.append(f"{indent}    {_id(upper)} ~~~ {_id(lower)}")
    lines.append(f"{indent}end")
    return lines


def mermaid(graph: Optional[grimp.ImportGraph] = None, pyproject: Path = PYPROJECT) -> str:
    roots = sorted(tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["root_packages"])
    if graph is None:
        graph = grimp.build_graph(*roots, cache_dir=None)
    lines = ["```mermaid", "flowchart TB"]
    for package in packages(graph, pyproject):
        lines.append(f"    subgraph {package.name} [{_label(f'{package.name} · {package.path}')}]")
        for index, layer in enumerate(package.layers):
            lines += _box(f"{package.name}__layer{index + 1}", layer.title, layer.modules, package.name, " " * 8)
        if package.unplaced:
            title = "in no layer yet" if package.layers else "flat: no layers"
            lines += _box(f"{package.name}__flat", title, package.unplaced, package.name, " " * 8)
        for upper, lower in layer_imports(graph, package.layers):
            lines.append(f"        {package.name}__layer{upper + 1} --> {package.name}__layer{lower + 1}")
        lines.append("    end")
    for source, target in package_imports(graph, roots):
        lines.append(f"    {source} --> {target}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def block(graph: Optional[grimp.ImportGraph] = None, pyproject: Path = PYPROJECT) -> str:
    """The text between the markers, markers included."""
    return (f"{BEGIN}\n<!-- Generated by scripts/architecture_diagram.py from the import graph and pyproject.toml's "
            f"layers contracts; run `make architecture`, do not edit. -->\n\n{mermaid(graph, pyproject)}{END}")


def rewrite(document: str, generated: str) -> str:
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"architecture_diagram.py: {DOC.relative_to(REPO)} has no {BEGIN} ... {END} block")
    return document[:start] + generated + document[end + len(END):]


def text(document_path: Path = DOC) -> str:
    """The document as it should be: the committed one with the block drawn again."""
    return rewrite(document_path.read_text(), block())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="architecture_diagram.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed diagram is stale")
    args = parser.parse_args(argv)
    current, wanted = DOC.read_text(), text()
    if args.check:
        if current != wanted:
            print(f"{DOC.relative_to(REPO)}: the diagram is stale; run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
