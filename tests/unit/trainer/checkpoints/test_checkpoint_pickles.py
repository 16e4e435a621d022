"""What a checkpoint's pickles may hold: tensors, plain types and numpy's RNG arrays, never code.

Whoever can write the shared claim or the S3 prefix can plant a checkpoint; resuming from it must
not run what its pickles ask for."""

import os
import random

import numpy as np
import pytest
import torch

from rosetta_trainer.checkpoints.checkpoint import UnsafeCheckpointError, load_trainer_state, rng_state
from rosetta_trainer.runtime.distributed import World

CPU = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))


class Planted:
    """Unpickling this would create a file: the stand-in for any code a pickle can run."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return os.mknod, (self.target,)


def test_a_checkpoint_of_tensors_plain_types_and_rng_state_loads(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state = {"optimizer": optimizer.state_dict(), "step": 7, "best_score": 12.5, "skipped_steps": [3], "metric": "bleu"}
    torch.save(state, tmp_path / "trainer_state.pt")
    (tmp_path / "rng").mkdir()
    random.seed(1)
    np.random.seed(1)
    torch.save(rng_state(), tmp_path / "rng" / "rank-0.pt")
    loaded, rng = load_trainer_state(tmp_path, CPU)
    assert loaded["step"] == 7 and loaded["skipped_steps"] == [3]
    torch.testing.assert_close(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    expected = (np.random.rand(), random.random())
    np.random.seed(1)
    random.seed(1)
    assert expected == (np.random.rand(), random.random())


@pytest.mark.parametrize("where", ["trainer_state.pt", "rng/rank-0.pt"])
def test_a_pickle_that_would_run_code_is_refused_and_not_run(tmp_path, where):
    target = tmp_path / "ran"
    torch.save({"step": 1}, tmp_path / "trainer_state.pt")
    (tmp_path / "rng").mkdir()
    torch.save({"step": 1, "payload": Planted(str(target))}, tmp_path / where)
    with pytest.raises(UnsafeCheckpointError, match=f"{where}.*refused, not run.*GLOBAL posix.mknod"):
        load_trainer_state(tmp_path, CPU)
    assert not target.exists()
