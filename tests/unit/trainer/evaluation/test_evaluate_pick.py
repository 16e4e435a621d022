"""`rosetta evaluate --pick`: which checkpoint of a checkpoint directory is evaluated."""

import json

import pytest

from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.checkpoints.checkpoint import MARKER, step_dir_name
from rosetta_trainer.evaluation.inference import pick_checkpoint


def checkpoint(root, step: int, score: float | None = None, complete: bool = True, key: str = "score"):
    path = root / step_dir_name(step)
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"step": step, **({key: score} if score is not None else {})}))
    if complete:
        (path / MARKER).write_text("")
    return path


def test_final_is_the_newest_complete_one(tmp_path):
    checkpoint(tmp_path, 100, 20.0)
    newest = checkpoint(tmp_path, 200, 10.0)
    checkpoint(tmp_path, 300, complete=False)  # being written: not a checkpoint yet
    assert pick_checkpoint(tmp_path, "final") == newest


def test_best_is_the_best_scored_and_the_earlier_on_a_tie(tmp_path):
    best = checkpoint(tmp_path, 100, 20.0)
    checkpoint(tmp_path, 200, 20.0)
    checkpoint(tmp_path, 300, 10.0)
    assert pick_checkpoint(tmp_path, "best") == best


def test_best_without_scores_is_the_newest(tmp_path, capsys):
    checkpoint(tmp_path, 100)
    newest = checkpoint(tmp_path, 200)
    assert pick_checkpoint(tmp_path, "best") == newest
    assert "no checkpoint" in capsys.readouterr().err


def test_averaged_and_empty_directories(tmp_path):
    with pytest.raises(ConfigError, match="is checkpoint.average set"):
        pick_checkpoint(tmp_path, "averaged")
    (tmp_path / "averaged").mkdir()
    assert pick_checkpoint(tmp_path, "averaged") == tmp_path / "averaged"
    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        pick_checkpoint(tmp_path / "missing", "final")


def test_best_reads_the_score_of_checkpoints_from_earlier_versions(tmp_path):
    """Their meta.json called the primary metric's score "bleu", whatever the metric."""
    best = checkpoint(tmp_path, 100, 30.0, key="bleu")
    checkpoint(tmp_path, 200, 20.0)
    assert pick_checkpoint(tmp_path, "best") == best
