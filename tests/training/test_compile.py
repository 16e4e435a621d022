"""training.compile: the model really goes through torch.compile (inductor), under DDP and under
DeepSpeed, and trains to the losses of the eager run.

Evidence that it compiled is torch's own count of the graphs dynamo captured, which the trainer
writes into summary.json (`compile`). The runs share one inductor cache, so the second compiled
run reuses the kernels of the first (the suite's time, not what is tested).
"""

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile")
    out, summaries = {}, {}
    for name, spec in {"eager": {}, "ddp": {"training": {"compile": "default"}},
                       "deepspeed": {"training": {"compile": "default"}, **DEEPSPEED}}.items():
        out[name] = tmp / name
        # One process under torchrun: DeepSpeed wants a process group.
        summaries[name] = torchrun_training(deep_update(BASE, {"spec": spec}), out[name], 1,
                                            env={"TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor-cache")})
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
