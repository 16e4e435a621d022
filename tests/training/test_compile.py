"""training.compile: the model really goes through torch.compile (inductor), under DDP and under
DeepSpeed, and trains to the losses of the eager run.

Evidence that it compiled is torch's own count of the graphs dynamo captured, which the trainer
writes into summary.json (`compile`). The runs share one inductor cache that outlives the session
(as DeepSpeed's built ops do): inductor's C++ kernels took most of this file's minutes, and a
cached kernel is found only for the same graph, code and torch version, so a change to the model,
the loss or the backends compiles afresh (the suite's time, not what is tested).
"""

import os
from pathlib import Path

import pytest

from support.training import TINY, deep_update, logged_losses, torchrun_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 4
# Without dropout (inductor draws its own random numbers, so its masks differ from eager's: 3e-4
# apart with them) the losses are equal to 7 decimals, measured. A wrong graph
# (another attention mask, a missed label shift) is off by percents from the first step.
LOSS_RTOL = 1e-4

BASE = deep_update(TINY, {"spec": {
    "model": {"dropout": 0.0},
    "training": {"maxSteps": STEPS},
    "checkpoint": {"interval": STEPS},
    # Validation once, at the end (atEnd): under DeepSpeed generation runs the compiled module too.
    "evaluation": {"interval": 1000, "maxSamples": 8},
}})
DEEPSPEED = {"distributed": {"backend": "deepspeed", "zeroStage": 2}}


INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(Path("~/.cache/rosetta/inductor").expanduser())
# One compiling process: a pool of compile workers is three more interpreters importing torch on a
# two-core machine, started even when every kernel comes from the cache.
COMPILE_ENV = {"TORCHINDUCTOR_CACHE_DIR": INDUCTOR_CACHE, "TORCHINDUCTOR_COMPILE_THREADS": "1"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile")
    out, summaries = {}, {}
    # A world of one is the same run with or without torchrun (no process group, no DDP wrapper),
    # so only DeepSpeed, which wants the launcher's rendezvous for its process group, gets one.
    for name, nproc, spec in [("eager", None, {}), ("ddp", None, {"training": {"compile": "default"}}),
                              ("deepspeed", 1, {"training": {"compile": "default"}, **DEEPSPEED})]:
        out[name] = tmp / name
        summaries[name] = torchrun_training(deep_update(BASE, {"spec": spec}), out[name], nproc, env=COMPILE_ENV)
    return {"out": out, "summary": summaries}


def test_the_eager_run_reports_no_compilation(runs):
    assert runs["summary"]["eager"]["compile"] is None


@pytest.mark.parametrize("backend", ["ddp", "deepspeed"])
def test_compiled_model_trains_like_the_eager_one(runs, backend):
    summary = runs["summary"][backend]
    assert summary["backend"] == backend and summary["steps"] == STEPS
    # Captured whole: a graph break is a return to eager Python in the middle of the model.
    assert summary["compile"]["graphs"] >= 1, summary["compile"]
    assert summary["compile"]["graph_breaks"] == 0, summary["compile"]
    eager, compiled = logged_losses(runs["out"]["eager"]), logged_losses(runs["out"][backend])
    assert sorted(compiled) == list(range(1, STEPS + 1))
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, rel=LOSS_RTOL), f"{backend}, step {step}"
