"""spec.tracking: Weights & Biases (offline run files) and MLflow (local store) get what
metrics.jsonl and eval.jsonl get; TensorBoard and Prometheus carry the validation loss."""

import glob
import json
import struct

import pytest

from rosetta_contract.evaluation_fields import TrackingSpec, WandbSpec
from rosetta_trainer.telemetry import tracking
from rosetta_trainer.telemetry.telemetry import Telemetry

STEP = {"step": 5, "total_steps": 10, "epoch": 0.5, "loss": 2.5, "lr": 1e-3, "tokens_per_s": 1000.0,
        "samples_per_s": 40.0, "grad_norm": 0.75, "mfu": None, "val_loss": None}
EVAL = {"step": 5, "split": "validation", "loss": 3.25, "bleu": 30.0, "chrf": 55.0,
        "langs": {"de": {"bleu": 30.0, "chrf": 55.0}}}
CONFIG = {"training": {"learningRate": 0.0005, "batch": {"sentences": 32}}, "data": {"targetLangs": ["de"]}}


def telemetry(tmp_path, tracking_spec: dict, resumed_step: int = 0, tensorboard: bool = False) -> Telemetry:
    return Telemetry(tmp_path, name="run-a", namespace="team", port=0, tensorboard=tensorboard, enabled=True,
                     resumed_step=resumed_step, tracking=TrackingSpec.model_validate(tracking_spec), config=CONFIG)


def wandb_records(run_dir):
    """The records of an offline run's .wandb file (LevelDB log framing: 32 KiB blocks of
    checksum, length, type and payload; W&B's 7-byte header first)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        payload = chunk if kind in (1, 2) else payload + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(payload)
            yield record


@pytest.mark.slow  # ~5 s: W&B and its service process
def test_wandb_offline_run_holds_the_config_and_every_logged_curve(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    t = telemetry(tmp_path, {"wandb": {"project": "rosetta-tests", "tags": ["unit"]}})  # auto, no key: offline
    try:
        t.log_step(STEP)
        t.log_eval(EVAL)
        t.log_step({**STEP, "step": 6, "loss": 2.0, "val_loss": 3.25})
    finally:
        t.close()
    (run_dir,) = [p for p in (tmp_path / "wandb").glob("offline-run-*")]
    history, config = {}, {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
    assert history[5]["loss/train"] == 2.5 and history[5]["optim/lr"] == 1e-3
    assert history[5]["validation/loss"] == 3.25 and history[5]["validation/bleu"] == 30.0
    assert history[5]["validation/chrf_de"] == 55.0
    assert history[6]["loss/validation"] == 3.25 and history[6]["loss/train"] == 2.0
    assert config["training"]["learningRate"] == 0.0005
    assert json.loads((tmp_path / "tracking.json").read_text())["wandb"] == run_dir.name.rsplit("-", 1)[1]


def test_mlflow_local_store_has_the_params_and_metrics_and_a_resume_continues_the_run(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    t = telemetry(tmp_path, {"mlflow": {"experiment": "rosetta-tests"}})
    try:
        t.log_step(STEP)
        t.log_eval(EVAL)
        t.write_summary({"steps": 5, "best_score": 30.0, "primary_metric": "bleu"})
    finally:
        t.close()
    run_id = json.loads((tmp_path / "tracking.json").read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert run.data.params["training.learningRate"] == "0.0005"
    assert run.data.params["data.targetLangs"] == '["de"]'
    assert run.data.metrics["validation/loss"] == 3.25 and run.data.metrics["validation/bleu"] == 30.0
    assert run.data.tags["best_score"] == "30.0" and run.data.tags["primary_metric"] == "bleu"
    assert run.info.status == "FINISHED"

    resumed = telemetry(tmp_path, {"mlflow": {"experiment": "rosetta-tests"}}, resumed_step=5)
    try:
        resumed.log_step({**STEP, "step": 6, "loss": 2.0})
    finally:
        resumed.close()
    assert json.loads((tmp_path / "tracking.json").read_text())["mlflow"] == run_id
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss/train")] == [(5, 2.5), (6, 2.0)]
    experiment = client.get_experiment_by_name("rosetta-tests")
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_tensorboard_gets_validation_loss_scores_and_learning_rate(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = telemetry(tmp_path, {}, tensorboard=True)
    try:
        t.log_step(STEP)
        t.log_eval({**EVAL, "rougeL": 41.0})
    finally:
        t.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/train", "optim/lr", "loss/validation", "validation/loss", "validation/bleu", "validation/chrf",
            "validation/rougeL", "validation/bleu_de"} <= tags
    assert events.Scalars("validation/loss")[0].value == 3.25
    assert events.Scalars("optim/lr")[0].step == 5


def test_prometheus_and_metrics_jsonl_carry_the_validation_loss(tmp_path):
    from test_telemetry import scrape

    from rosetta_operator.local.pods import free_port
    from support.training import read_jsonl

    port = free_port()
    t = Telemetry(tmp_path, name="run-a", namespace="team", port=port, tensorboard=False, enabled=True)
    try:
        t.log_eval(EVAL)
        t.log_step({**STEP, "val_loss": 3.25})
        got = scrape(port)
    finally:
        t.close()
    assert got[("rosetta_validation_loss", (("namespace", "team"), ("training", "run-a")))] == 3.25
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["val_loss"] == 3.25


def test_wandb_mode_goes_offline_without_a_key_or_a_network(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert tracking.wandb_mode(WandbSpec(project="p"))[0] == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(tracking, "reachable", lambda url, timeout=3.0: False)
    mode, why = tracking.wandb_mode(WandbSpec(project="p", base_url="https://wandb.example"))
    assert mode == "offline" and "wandb.example" in why
    monkeypatch.setattr(tracking, "reachable", lambda url, timeout=3.0: True)
    assert tracking.wandb_mode(WandbSpec(project="p"))[0] == "online"
    assert tracking.wandb_mode(WandbSpec(project="p", mode="offline"))[0] == "offline"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.wandb_mode(WandbSpec(project="p", mode="online"))[0] == "offline"


def test_a_failing_tracker_is_dropped_and_the_others_go_on():
    class Broken:
        name = "broken"

        def log(self, metrics, step):
            raise ConnectionError("tracking server down")

    class Kept:
        name = "kept"
        logged = []

        def log(self, metrics, step):
            self.logged.append((step, metrics))

    broken, kept = Broken(), Kept()
    trackers = tracking.Trackers([broken, kept])
    trackers.log_step(STEP)
    trackers.log_eval(EVAL)
    assert trackers.trackers == [kept]
    assert kept.logged[0] == (5, {"loss/train": 2.5, "optim/lr": 1e-3, "optim/grad_norm": 0.75,
                                  "throughput/tokens_per_s": 1000.0, "throughput/samples_per_s": 40.0,
                                  "progress/epoch": 0.5})
    assert kept.logged[1][1]["validation/loss"] == 3.25


def test_tracking_spec_refuses_what_could_not_work():
    from pydantic import ValidationError

    for bad in ({"wandb": {"project": "p", "apiKeySecret": {"name": "Not_A_Secret", "key": "k"}}},
                {"wandb": {"project": "p", "apiKey": "literal"}},
                {"wandb": {"project": "p", "baseUrl": "wandb.example"}},
                {"mlflow": {"trackingUri": "mlflow:5000"}}):
        with pytest.raises(ValidationError):
            TrackingSpec.model_validate(bad)


def test_a_tracker_that_cannot_start_is_left_out_and_a_missing_package_is_an_error(tmp_path, monkeypatch, caplog):
    def refused(*args, **kwargs):
        raise PermissionError("API key rejected")

    monkeypatch.setattr(tracking, "WandbTracker", refused)
    started = tracking.Trackers.start(TrackingSpec.model_validate({"wandb": {"project": "p"}}), output=tmp_path,
                                      name="run-a", config={}, resumed=False)
    assert started.trackers == [] and "API key rejected" in caplog.text

    def missing(*args, **kwargs):
        raise ImportError("spec.tracking.wandb needs the wandb package")

    monkeypatch.setattr(tracking, "WandbTracker", missing)
    with pytest.raises(ImportError, match="wandb package"):
        tracking.Trackers.start(TrackingSpec.model_validate({"wandb": {"project": "p"}}), output=tmp_path,
                                name="run-a", config={}, resumed=False)


def test_params_are_flattened_into_keys_mlflow_accepts():
    params = tracking.flatten({"training": {"lr": 0.1, "batch": {"tokens": 4096}},
                               "distributed": {"deepspeed": {"zero_optimization:stage": 3}},
                               "data": {"targetLangs": ["de", "fr"], "note": "x" * 7000}})
    assert params == {"training.lr": "0.1", "training.batch.tokens": "4096",
                      "distributed.deepspeed.zero_optimization_stage": "3",
                      "data.targetLangs": '["de", "fr"]', "data.note": "x" * 6000}
