"""The import graph of the contract, the operator and the trainer: no module imports, even inside a function,
a module that imports it back, directly or through others; and no module reaches for another's
private names.

grimp (what import-linter builds its graph with) sees the imports inside functions too, so a lazy
import cannot hide a cycle here. The layers contracts in pyproject.toml keep imports flowing down
between layers; this test also covers the modules within one layer, and the modules a contract
does not place yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGES = ("rosetta_contract", "rosetta_operator", "rosetta_trainer")
ROOT = Path(__file__).resolve().parents[3]
SOURCES = {"rosetta_contract": ROOT / "contract" / "rosetta_contract",
           "rosetta_operator": ROOT / "operator" / "rosetta_operator",
           "rosetta_trainer": ROOT / "trainer" / "rosetta_trainer"}



@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Each first-party module → the first-party modules it imports, anywhere in it."""
    modules = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    return {m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules and t != m}
            for m in modules}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules_and_nothing_else() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back(graph: grimp.ImportGraph) -> None:
    edges = imports(graph)
    problems = []
    for component in strongly_connected(edges):
        members = set(component)
        lines = [f"  {importer} line {detail['line_number']}: {detail['line_contents']}"
                 for importer in component for imported in sorted(edges[importer] & members)
                 for detail in graph.get_import_details(importer=importer, imported=imported)]
        problems.append(" ↔ ".join(component) + "\n" + "\n".join(lines))
    assert not problems, ("import cycles (move the shared part into a module both import; a lazy import does "
                          "not break a cycle):\n" + "\n".join(problems))


def test_the_graph_includes_imports_inside_functions(graph: grimp.ImportGraph) -> None:
    # cli.py imports the CRD builder inside the `crd` command only.
    assert graph.direct_import_exists(importer="rosetta_operator.cli", imported="rosetta_operator.crd")


def module_names() -> dict[str, Path]:
    out = {}
    for package, root in SOURCES.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join((package, *parts)).removesuffix(".__init__")] = path
    return out


def private_imports() -> set[tuple[str, str]]:
    """(importer, module.name) for each name starting with one underscore that a module imports from
    another first-party module, or reads off one it imported."""
    modules = module_names()
    found = set()
    for module, path in modules.items():
        package_of = module if path.name == "__init__.py" else module.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name → the first-party module it is
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package_of.split(".")[: len(package_of.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                if base.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.add((module, f"{base}.{alias.name}"))
                    if f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.add((module, f"{bound[node.value.id]}.{node.attr}"))
    return found


def test_the_private_import_finder_sees_both_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "rosetta_contract"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("_hidden = 1\n")
    (package / "b.py").write_text("from rosetta_contract.a import _hidden\nfrom . import a\nx = a._hidden\n")
    monkeypatch.setitem(SOURCES, "rosetta_contract", package)
    monkeypatch.setitem(SOURCES, "rosetta_operator", tmp_path / "none")
    monkeypatch.setitem(SOURCES, "rosetta_trainer", tmp_path / "none")
    assert private_imports() == {("rosetta_contract.b", "rosetta_contract.a._hidden")}


def test_no_module_imports_another_modules_private_names() -> None:
    new = private_imports()
    assert not new, "private names used across modules (make them public, or move the code that needs them): " + \
        ", ".join(f"{importer} uses {name}" for importer, name in sorted(new))
