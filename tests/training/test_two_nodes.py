"""A training on two 'nodes' (two torchrun launchers on this machine, gloo), each with its own output
directory, as two pods each have their own disk: the tokenizer reaches rank 1 without storage
shared with rank 0, and the checkpoint directory must be shared, or the run stops with a clear error."""

import json

import pytest
import yaml

from rosetta_trainer.checkpoints.checkpoint import SHARED_PROBE_PREFIX, latest_checkpoint
from support.trainer_processes import two_node_training
from support.training import TINY, deep_update, read_jsonl

pytestmark = pytest.mark.slow

SHORT = {"training": {"maxSteps": 4}, "checkpoint": {"interval": 4}, "evaluation": {"interval": 4, "maxSamples": 8},
         "metrics": {"tensorboard": False}}


def write_config(tmp_path, patch: dict):
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"spec": deep_update(SHORT, patch)})))
    return path


def test_rank_1_gets_the_tokenizer_without_shared_output_and_resumes_from_shared_checkpoints(tmp_path):
    shared = tmp_path / "shared-checkpoints"
    cfg = write_config(tmp_path, {"checkpoint": {"dir": str(shared)}})
    outputs = [tmp_path / "node-0", tmp_path / "node-1"]

    results = two_node_training(cfg, outputs)
    assert [code for code, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    summary = json.loads((outputs[0] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    # Rank 0 trained and saved the tokenizer; rank 1 got it sent, and its output never held one.
    assert (outputs[0] / "tokenizer" / "tokenizer.json").is_file()
    assert not (outputs[1] / "tokenizer").exists()
    checkpoint = latest_checkpoint(shared)
    assert sorted(p.name for p in (checkpoint / "rng").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert not list(shared.glob(f"{SHARED_PROBE_PREFIX}*")), "the probe is cleaned up"

    # A restarted gang resumes from the shared checkpoint (its tokenizer included).
    results = two_node_training(cfg, outputs, "--set", "spec.training.maxSteps=6")
    assert [code for code, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    summary = json.loads((outputs[0] / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 6
    assert [r["step"] for r in read_jsonl(outputs[0] / "metrics.jsonl")] == list(range(1, 7))


def test_checkpoints_each_node_keeps_for_itself_stop_the_run_with_the_directory_named(tmp_path):
    cfg = write_config(tmp_path, {})  # checkpoints under each node's own output
    outputs = [tmp_path / "node-0", tmp_path / "node-1"]

    results = two_node_training(cfg, outputs, timeout=300)
    assert all(code != 0 for code, _ in results), "\n".join(log[-3000:] for _, log in results)
    message = (f"error: the checkpoint directory {outputs[0] / 'checkpoints'} is not shared between the nodes: "
               f"rank 0 (on ")
    for _, log in results:  # every rank says so, not only the one that cannot see it
        assert message in log, log[-3000:]
        assert "rank 1 (on " in log and "cannot see it there" in log
    assert not (outputs[0] / "metrics.jsonl").exists(), "it stopped before training"
    assert not list((outputs[0] / "checkpoints").glob(f"{SHARED_PROBE_PREFIX}*")), "the probe is cleaned up"
