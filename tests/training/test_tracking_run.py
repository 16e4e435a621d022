"""A real tiny training with spec.tracking: validation loss in every sink, W&B offline, MLflow local."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rosetta_trainer.commands.train import train_from_file
from support.training import read_jsonl

pytestmark = pytest.mark.slow


def test_validation_loss_and_scores_reach_tensorboard_jsonl_and_both_trackers(write_config, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # mode auto without a key: offline
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = write_config({"tracking": {"wandb": {"project": "rosetta-tests"}, "mlflow": {}}})
    out = tmp_path / "run"
    train_from_file(str(cfg), str(out), progress=False)

    evals = [r for r in read_jsonl(out / "eval.jsonl") if r["split"] == "validation"]
    assert [r["step"] for r in evals] == [10, 20]
    assert all(r["loss"] > 0 for r in evals)
    steps = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
    assert steps[5]["val_loss"] is None and steps[11]["val_loss"] == evals[0]["loss"]

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/validation", "validation/loss", "validation/bleu", "validation/chrf", "optim/lr"} <= scalars
    assert [e.step for e in events.Scalars("validation/loss")] == [10, 20]
    assert len(events.Scalars("optim/lr")) == 20

    ids = json.loads((out / "tracking.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    history = client.get_metric_history(ids["mlflow"], "validation/loss")
    assert [(m.step, m.value) for m in history] == [(10, pytest.approx(evals[0]["loss"])),
                                                    (20, pytest.approx(evals[1]["loss"]))]
    assert client.get_run(ids["mlflow"]).data.params["model.dModel"] == "32"
    assert list((out / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
