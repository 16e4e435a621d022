"""What DeepSpeed reads back from a checkpoint runs no code from the files.

DeepSpeed loads its checkpoints with torch.load(weights_only=False): its engine (resume),
zero_to_fp32 (export, evaluation, averaging). While the backend reads one, every torch.load is
checkpoint.load_state_file with DeepSpeed's own plain-data classes allowed
(deepspeed_checkpoints.weights_only_loads). The resume from real ZeRO-2 and ZeRO-3 checkpoints, and a
planted one refused in a real resume, are in tests/training/test_deepspeed.py.
"""

import os
from collections import OrderedDict

import pytest
import torch

from rosetta_trainer.checkpoints.checkpoint import UnsafeCheckpointError
from rosetta_trainer.checkpoints.deepspeed_checkpoints import consolidated_model, weights_only_loads
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed

import_deepspeed()  # as the trainer does: without the MLflow of DeepSpeed's autotuner (every worker collects this)
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402


class Planted:
    """Unpickling this would create a file: the stand-in for any code a pickle can run."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return os.mknod, (self.target,)


def test_the_objects_of_a_zero_optimizers_state_load(tmp_path):
    # What a ZeRO optimizer pickles beside its tensors; fp16's dynamic scaler is made here because
    # only a GPU trains in fp16.
    dynamic = DynamicLossScaler(init_scale=2**16, scale_window=1000, min_scale=1, delayed_shift=2,
                                consecutive_hysteresis=False, dtype=torch.half)
    dynamic.cur_scale, dynamic.cur_iter, dynamic.last_overflow_iter = 2**12, 40, 37
    state = {"loss_scaler": dynamic, "static_loss_scaler": LossScaler(scale=1.0),
             "zero_stage": ZeroStageEnum.gradients,
             "param_slice_mappings": [OrderedDict(weight=fragment_address(numel=6, start=2))],
             "single_partition_of_fp32_groups": [torch.arange(6.0)]}
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save(state, path)
    with weights_only_loads():
        loaded = TorchCheckpointEngine().load(str(path), map_location="cpu")
    assert type(loaded["loss_scaler"]) is DynamicLossScaler
    assert vars(loaded["loss_scaler"]) == vars(dynamic)
    assert loaded["static_loss_scaler"].loss_scale == 1.0
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    assert loaded["param_slice_mappings"][0]["weight"] == fragment_address(numel=6, start=2)
    torch.testing.assert_close(loaded["single_partition_of_fp32_groups"][0], torch.arange(6.0))


def test_deepspeeds_engine_load_refuses_a_planted_pickle_and_runs_nothing(tmp_path):
    target = tmp_path / "ran"
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {}, "payload": Planted(str(target))}, path)
    original = torch.load
    with pytest.raises(UnsafeCheckpointError, match="mp_rank_00_model_states.pt.*refused, not run.*posix.mknod"):
        with weights_only_loads():
            # What DeepSpeedEngine.load_checkpoint calls for every file, asking for weights_only=False.
            TorchCheckpointEngine().load(str(path), map_location="cpu")
    assert not target.exists()
    assert torch.load is original  # restored, also when the load failed


def test_gathering_a_planted_checkpoint_refuses_it_and_runs_nothing(tmp_path):
    # export, evaluation and averaging gather ZeRO shards with zero_to_fp32, which calls torch.load
    # itself (not through the engine); it reads the model states first.
    target = tmp_path / "ran"
    shards = tmp_path / "step-00000006" / "deepspeed"
    shards.mkdir(parents=True)
    torch.save({"buffer_names": [], "payload": Planted(str(target))}, shards / "mp_rank_00_model_states.pt")
    with pytest.raises(UnsafeCheckpointError, match="refused, not run"):
        consolidated_model(tmp_path / "step-00000006")
    assert not target.exists()


class _ByName:
    """How some Pythons pickle an enum member: getattr(EnumClass, name)."""

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        from deepspeed.runtime.zero.config import ZeroStageEnum

        return (getattr, (ZeroStageEnum, self.name))


def test_an_enum_pickled_by_name_loads_and_getattr_reaches_nothing_else(tmp_path):
    """ZeRO-3 offload's optimizer states, saved by Debian's Python 3.11, hold the stage as
    getattr(ZeroStageEnum, 'weights'); that lookup, and no other, is allowed."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from rosetta_trainer.checkpoints.checkpoint import UnsafeCheckpointError, load_state_file
    from rosetta_trainer.checkpoints.deepspeed_checkpoints import checkpoint_classes

    path = tmp_path / "optim_states.pt"
    torch.save({"zero_stage": _ByName("weights")}, path)
    assert load_state_file(path, allowed=checkpoint_classes())["zero_stage"] is ZeroStageEnum.weights
    torch.save({"zero_stage": _ByName("__class__")}, path)
    with pytest.raises(UnsafeCheckpointError):
        load_state_file(path, allowed=checkpoint_classes())
