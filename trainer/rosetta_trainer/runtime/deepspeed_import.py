"""DeepSpeed imported without the MLflow its autotuner pulls in.

`import deepspeed` reaches deepspeed.autotuning.autotuner, which imports mlflow whenever it is
installed (spec.tracking's extra puts it in the trainer image) and with it fastapi, pandas and
OpenTelemetry: about 1.5 s of CPU at every DeepSpeed rank's start (measured on two cores), for an
autotuner Rosetta never runs. Every module that touches DeepSpeed imports it through here first;
the autotuner then sees MLflow as absent, and everything else (spec.tracking's MLflow included)
imports mlflow as usual afterwards.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """The deepspeed package (ImportError where it is not installed)."""
    loaded = sys.modules.get("deepspeed")
    if loaded is not None:
        return loaded
    hide = "mlflow" not in sys.modules  # loaded already (a tracker started first): nothing to save
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        deepspeed = importlib.import_module("deepspeed")
    finally:
        if hide and sys.modules.get("mlflow", ...) is None:  # still our placeholder
            del sys.modules["mlflow"]
    return deepspeed
