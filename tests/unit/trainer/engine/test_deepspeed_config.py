"""The DeepSpeed config generated from a spec, the user's overrides, and the spec's rules."""

import pytest

from rosetta_contract.documents import deep_merge as merge
from rosetta_contract.documents import parse_document
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.engine.deepspeed_backend import deepspeed_config
from support.training import TINY, deep_update


def spec(patch: dict):
    return parse_document(deep_update(TINY, {"spec": patch})).spec


def test_training_settings_become_deepspeed_settings():
    s = spec({"training": {"gradientAccumulation": 4, "clipGradNorm": 0.5, "precision": "bf16"},
              "distributed": {"backend": "deepspeed", "zeroStage": 3}})
    config = deepspeed_config(s, cuda=True)
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True} and config["fp16"]["enabled"] is False
    assert config["zero_optimization"]["stage"] == 3 and config["zero_optimization"]["overlap_comm"] is True
    assert "offload_optimizer" not in config["zero_optimization"]
    assert "optimizer" not in config  # torch's AdamW is passed in as the client optimizer


def test_default_stage_is_2_and_clipping_off_is_zero():
    s = spec({"training": {"clipGradNorm": None}, "distributed": {"backend": "deepspeed"}})
    config = deepspeed_config(s, cuda=False)
    assert config["zero_optimization"]["stage"] == 2 and s.distributed.stage == 2
    assert config["gradient_clipping"] == 0.0
    assert config["zero_optimization"]["overlap_comm"] is False  # no CUDA streams on CPU


def test_optimizer_offload_uses_deepspeeds_cpu_adamw_with_the_spec_hyperparameters():
    s = spec({"training": {"learningRate": 2e-4, "weightDecay": 0.01, "adamBetas": [0.9, 0.95], "adamEps": 1e-8},
              "distributed": {"backend": "deepspeed", "zeroStage": 3,
                              "offload": {"optimizer": "cpu", "parameters": "cpu"}}})
    config = deepspeed_config(s, cuda=True)
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert config["optimizer"] == {"type": "AdamW", "params": {
        "lr": 2e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}


def test_raw_overrides_merge_over_the_generated_config():
    s = spec({"distributed": {"backend": "deepspeed", "zeroStage": 2, "deepspeedConfig": {
        "zero_optimization": {"reduce_bucket_size": 50000000}, "gradient_clipping": 2.0}}})
    config = deepspeed_config(s, cuda=True)
    assert config["zero_optimization"]["reduce_bucket_size"] == 50000000
    assert config["zero_optimization"]["stage"] == 2  # siblings survive a nested override
    assert config["gradient_clipping"] == 2.0


def test_merge_copies_and_recurses():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    out = merge(base, {"a": {"b": 2}, "e": {"f": 3}})
    assert out == {"a": {"b": 2, "c": [1]}, "d": 1, "e": {"f": 3}}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


@pytest.mark.parametrize("distributed, message", [
    ({"zeroStage": 2}, "zeroStage need backend: deepspeed"),
    ({"offload": {"optimizer": "cpu"}}, "offload.optimizer need backend: deepspeed"),
    ({"deepspeedConfig": {"a": 1}}, "deepspeedConfig need backend: deepspeed"),
    ({"backend": "deepspeed", "zeroStage": 2, "offload": {"parameters": "cpu"}},
     "offload.parameters: cpu needs zeroStage 3 (got 2)"),
    ({"backend": "deepspeed", "zeroStage": 4}, "distributed.zeroStage"),
    ({"backend": "horovod"}, "distributed.backend"),
])
def test_inconsistent_settings_are_refused_with_the_field(distributed, message):
    with pytest.raises(ConfigError) as err:
        spec({"distributed": distributed})
    assert message in str(err.value)


def test_a_cpu_run_does_not_compile_deepspeeds_shared_memory_all_reduce(monkeypatch):
    """DeepSpeed's torch backend builds its shared-memory all-reduce (inference only) on every rank
    that initialises distributed, about two minutes of C++ per rank of a fresh pod, unless its own
    table of compatible ops says no."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    from rosetta_trainer.engine.deepspeed_backend import skip_cpu_shared_memory_collectives

    builder = get_accelerator().get_op_builder("ShareMemCommBuilder")

    def compiled(self):
        raise AssertionError("the shared-memory all-reduce was compiled")
    monkeypatch.setattr(builder, "load", compiled)
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, builder.NAME, True)
    skip_cpu_shared_memory_collectives(cuda=True)  # a CUDA run keeps whatever DeepSpeed probed
    assert deepspeed.ops.__compatible_ops__[builder.NAME] is True
    skip_cpu_shared_memory_collectives(cuda=False)
    assert build_shm_op() is None
