"""The training loop waits for the device only where it reads results: at a log line, an evaluation,
a checkpoint and the end, never inside a step.

A real `rosetta train` (in this process) whose Trainer.run is profiled, its methods marked as
profiler ranges: every operator that would make the host wait for a GPU (step_counters.SYNC_OPS)
is traced to the loop method it ran under (None: the loop's own body). With a log line every 5 steps, the steps in between must have none, eagerly
and compiled alike.
"""

import json

import pytest
import torch

from rosetta_trainer.commands.train import train_from_file
from rosetta_trainer.engine import loop
from rosetta_trainer.engine.step_counters import HOST_ONLY_READS, SYNC_OPS

pytestmark = pytest.mark.slow

# Where the loop reads device values on purpose, and where it reads host tensors only.
READS = {"_log", "_read_step_flags", "_evaluate", "_save", "_finish", "_gpu_memory_by_rank"}
HOST_ONLY = {"iterate"}


def marked(method):
    """`method` inside a profiler range named after it, so the events under it say where they ran."""
    def wrapper(self, *args, **kwargs):
        with torch.profiler.record_function(f"loop.{method.__name__}"):
            return method(self, *args, **kwargs)
    return wrapper


def marked_function(function):
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(f"loop.{function.__name__}"):
            return function(*args, **kwargs)
    return wrapper


def loop_method(event) -> str | None:
    """The innermost marked Trainer method the event ran under."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("loop."):
            return parent.name[len("loop."):]
        parent = parent.cpu_parent
    return None


def compiling(event) -> bool:
    """Inductor's own work while it compiles (constant folding reads values once, at the first step)
    runs under its timed passes, "… (dynamo_timed)"."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.endswith("(dynamo_timed)"):
            return True
        parent = parent.cpu_parent
    return False


def under(event, names) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


@pytest.mark.parametrize("compile_mode", ["none", "default"])
def test_no_step_waits_for_the_device(write_config, tmp_path, monkeypatch, compile_mode):
    run = loop.Trainer.run
    profiled = {}

    def profiled_run(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            result = run(self)
        profiled["events"] = prof.events()
        return result

    monkeypatch.setattr(loop.Trainer, "run", profiled_run)
    for name in READS | {"_micro_step", "_optimizer_step"}:
        monkeypatch.setattr(loop.Trainer, name, marked(getattr(loop.Trainer, name)))
    # Each epoch's DataLoader draws its workers' seed from a CPU generator (.item() of a host tensor).
    monkeypatch.setattr(loop.batching, "iterate", marked_function(loop.batching.iterate))
    config = write_config({"training": {"maxSteps": 10, "logInterval": 5, "compile": compile_mode},
                           "checkpoint": {"interval": 10}, "evaluation": {"interval": 10, "maxSamples": 4}})
    summary = train_from_file(str(config), str(tmp_path / "run"), progress=False)
    assert summary["steps"] == 10

    where = {}
    for event in profiled["events"]:
        if event.name in SYNC_OPS and not under(event, HOST_ONLY_READS) and not compiling(event):
            method = loop_method(event)
            where[method] = where.get(method, 0) + 1

    # Nothing in _micro_step, _optimizer_step or the loop's own body (None).
    assert set(where) - READS - HOST_ONLY == set(), where
    assert where.get("_log"), "the log lines read the loss: the profile should show it"
    if compile_mode != "none":
        compiled = json.loads((tmp_path / "run" / "summary.json").read_text())["compile"]
        assert compiled["graph_breaks"] == 0 and compiled["graphs"] <= 2, compiled
