"""rosetta_trainer.runtime.deepspeed_import: DeepSpeed without its autotuner's MLflow, MLflow still importable."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import sys
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.autotuning import autotuner
print("after deepspeed:", sorted(m for m in ("mlflow", "fastapi", "pandas") if m in sys.modules), autotuner.has_mlflow)
import mlflow
print("then:", type(mlflow).__name__, import_deepspeed() is deepspeed)
"""


@pytest.mark.slow  # ~5 s: DeepSpeed and MLflow in a fresh process
def test_deepspeed_loads_without_mlflow_which_imports_afterwards():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "after deepspeed: [] False" in res.stdout, res.stdout
    assert "then: module True" in res.stdout, res.stdout


TRAINER = Path(__file__).resolve().parents[4] / "trainer" / "rosetta_trainer"


def _deepspeed_imports_not_through_the_helper(tree: ast.Module) -> list[int]:
    """Lines of `import deepspeed...` / `from deepspeed... import` at module level, or in a function
    before that function has called import_deepspeed()."""
    def is_deepspeed(node: ast.AST) -> bool:
        if isinstance(node, ast.ImportFrom):
            return (node.module or "").split(".")[0] == "deepspeed"
        return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "deepspeed" for a in node.names)

    def calls_helper(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_deepspeed"

    bad = [n.lineno for n in tree.body if is_deepspeed(n)]
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        helper_lines = [n.lineno for n in ast.walk(function) if calls_helper(n)]
        bad += [n.lineno for n in ast.walk(function) if is_deepspeed(n) and not any(h < n.lineno for h in helper_lines)]
    return bad


def test_every_deepspeed_import_of_the_trainer_goes_through_the_helper():
    """The saving holds only if DeepSpeed's first import in a process is the helper's: a module that
    imported deepspeed directly would bring MLflow back for every rank."""
    offenders = {}
    for path in TRAINER.rglob("*.py"):
        if path.name != "deepspeed_import.py":
            lines = _deepspeed_imports_not_through_the_helper(ast.parse(path.read_text()))
            if lines:
                offenders[str(path.relative_to(TRAINER))] = lines
    assert not offenders, offenders


def test_the_check_finds_a_direct_import():
    direct = ast.parse("def f():\n    from deepspeed.ops import adam\n\ndef g():\n    import_deepspeed()\n"
                       "    import deepspeed.ops\n\nimport deepspeed\n")
    assert _deepspeed_imports_not_through_the_helper(direct) == [8, 2]
