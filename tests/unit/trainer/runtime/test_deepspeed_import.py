"""rosetta_trainer.runtime.deepspeed_import: DeepSpeed without its autotuner's MLflow, MLflow still importable."""

import subprocess
import sys

PROBE = """
import sys
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.autotuning import autotuner
print("after deepspeed:", sorted(m for m in ("mlflow", "fastapi", "pandas") if m in sys.modules), autotuner.has_mlflow)
import mlflow
print("then:", type(mlflow).__name__, import_deepspeed() is deepspeed)
"""


def test_deepspeed_loads_without_mlflow_which_imports_afterwards():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "after deepspeed: [] False" in res.stdout, res.stdout
    assert "then: module True" in res.stdout, res.stdout
