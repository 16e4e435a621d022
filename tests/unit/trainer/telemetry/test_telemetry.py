"""Rank 0's outputs: metrics.jsonl/eval.jsonl, rewound on resume, and the Prometheus endpoint."""

import errno
import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from rosetta_operator.local.pods import free_port
from rosetta_trainer.telemetry.telemetry import Telemetry, truncate_jsonl


def serving_telemetry(tmp_path, name: str) -> Telemetry:
    # A free port can be taken by another process between the lookup and the bind; try a fresh one.
    for attempt in range(5):
        port = free_port()
        try:
            t = Telemetry(tmp_path, name=name, namespace="team", port=port, tensorboard=False, enabled=True)
        except OSError as err:
            if err.errno != errno.EADDRINUSE or attempt == 4:
                raise
        else:
            assert t.port == port
            return t


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


STEP = {"step": 5, "total_steps": 10, "epoch": 0.5, "loss": 2.5, "lr": 1e-3, "tokens_per_s": 1000.0,
        "samples_per_s": 40.0, "grad_norm": 0.75, "mfu": None, "flops_per_s": 1e9, "step_time_s": 0.1}
EVAL = {"step": 5, "split": "validation", "bleu": 30.0, "chrf": 55.0,
        "langs": {"de": {"bleu": 30.0, "chrf": 55.0, "gender": {"gender_gap_bleu": 2.5}}}}


def test_prometheus_endpoint_serves_the_logged_figures_with_labels(tmp_path):
    t = serving_telemetry(tmp_path, name="run-a")
    port = t.port
    try:
        t.set_static(total_steps=10, world_size=2)
        t.log_step(STEP)
        t.log_eval(EVAL)
        t.set_static(last_checkpoint_step=5)
        got = scrape(port)
    finally:
        t.close()
    run = (("namespace", "team"), ("training", "run-a"))
    assert got[("rosetta_step", run)] == 5
    assert got[("rosetta_total_steps", run)] == 10
    assert got[("rosetta_loss", run)] == 2.5
    assert got[("rosetta_learning_rate", run)] == 1e-3
    assert got[("rosetta_tokens_per_second", run)] == 1000
    assert got[("rosetta_world_size", run)] == 2
    assert got[("rosetta_last_checkpoint_step", run)] == 5
    de = tuple(sorted((*run, ("lang", "de"))))
    assert got[("rosetta_eval_bleu", de)] == 30
    assert got[("rosetta_eval_chrf", de)] == 55
    assert got[("rosetta_eval_gender_gap_bleu", de)] == 2.5
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 2.5
    assert json.loads((tmp_path / "eval.jsonl").read_text())["langs"]["de"]["bleu"] == 30


def test_a_resumed_run_rewinds_its_logs_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')
    truncate_jsonl(path, after_step=4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]

    t = Telemetry(tmp_path, name="x", namespace=None, port=0, tensorboard=False, enabled=True, resumed_step=4)
    t.log_step({**STEP, "step": 5})
    t.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_a_fresh_run_starts_new_logs_and_other_ranks_write_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 99}) + "\n")
    Telemetry(tmp_path, name="x", namespace=None, port=0, tensorboard=False, enabled=True).close()
    assert not (tmp_path / "metrics.jsonl").exists()
    other = tmp_path / "rank1"
    t = Telemetry(other, name="x", namespace=None, port=0, tensorboard=False, enabled=False)
    t.log_step(STEP)
    assert t.write_summary({"steps": 1}) is None and not other.exists()


def test_endpoint_serves_checkpoint_restart_and_per_rank_figures(tmp_path):
    t = serving_telemetry(tmp_path, name="run-a")
    port = t.port
    try:
        t.set_static(restarts=2, resumed_from_step=4, best_bleu=31.0)
        t.log_step({**STEP, "data_wait_s": 0.02})
        t.log_eval(EVAL)
        t.log_checkpoint(step=5, path=tmp_path / "step-00000005", seconds=1.5, size_bytes=4096)
        t.log_rank_values("gpu_memory_bytes", [1e9, None, 3e9])
        got = scrape(port)
        t.log_eval({**EVAL, "step": 6, "bleu": 33.0})
        best = scrape(port)[("rosetta_best_bleu", (("namespace", "team"), ("training", "run-a")))]
    finally:
        t.close()
    run = (("namespace", "team"), ("training", "run-a"))
    assert got[("rosetta_restarts", run)] == 2
    assert got[("rosetta_resumed_from_step", run)] == 4
    assert got[("rosetta_dataloader_wait_seconds", run)] == 0.02
    assert got[("rosetta_bleu", run)] == 30
    # One writer: the loop's set_static (the primary metric's best), never an evaluation's BLEU.
    assert got[("rosetta_best_bleu", run)] == 31 and best == 31
    assert got[("rosetta_last_checkpoint_step", run)] == 5
    assert got[("rosetta_checkpoint_save_seconds", run)] == 1.5
    assert got[("rosetta_checkpoint_bytes", run)] == 4096
    path = str(tmp_path / "step-00000005")
    assert got[("rosetta_last_checkpoint_info", tuple(sorted((*run, ("path", path)))))] == 1
    assert got[("rosetta_gpu_memory_bytes", tuple(sorted((*run, ("rank", "0")))))] == 1e9
    assert got[("rosetta_gpu_memory_bytes", tuple(sorted((*run, ("rank", "2")))))] == 3e9
    assert not any(name == "rosetta_gpu_memory_bytes" and ("rank", "1") in labels for name, labels in got)
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["data_wait_s"] == 0.02


def test_phase_says_what_rank_0_is_doing_so_a_pause_is_not_a_hang(tmp_path):
    t = serving_telemetry(tmp_path, name="run-a")
    port = t.port

    def phases() -> dict:
        return {dict(labels)["phase"]: value for (name, labels), value in scrape(port).items()
                if name == "rosetta_phase"}

    try:
        assert phases() == {"train": 1, "evaluate": 0, "checkpoint": 0}
        with t.phase("evaluate"):
            assert phases() == {"train": 0, "evaluate": 1, "checkpoint": 0}
        try:
            with t.phase("checkpoint"):
                assert phases()["checkpoint"] == 1
                raise OSError("disk full")
        except OSError:
            pass
        assert phases() == {"train": 1, "evaluate": 0, "checkpoint": 0}
    finally:
        t.close()
    # Without an endpoint (ranks other than 0, metrics off) the block just runs.
    quiet = Telemetry(tmp_path / "q", name="q", namespace=None, port=0, tensorboard=False, enabled=False)
    with quiet.phase("evaluate"):
        pass


def test_step_time_split_and_tokens_per_node(tmp_path):
    t = serving_telemetry(tmp_path, name="run-b")
    port = t.port
    try:
        t.log_step({**STEP, "data_wait_s": 0.01, "compute_s": 0.07, "optimizer_s": 0.02,
                    "node_tokens_per_s": {"0": 600.0, "1": 400.0}})
        got = scrape(port)
    finally:
        t.close()
    run = (("namespace", "team"), ("training", "run-b"))
    assert got[("rosetta_dataloader_wait_seconds", run)] == 0.01
    assert got[("rosetta_step_compute_seconds", run)] == 0.07
    assert got[("rosetta_step_optimizer_seconds", run)] == 0.02
    assert got[("rosetta_node_tokens_per_second", tuple(sorted((*run, ("node", "0")))))] == 600.0
    assert got[("rosetta_node_tokens_per_second", tuple(sorted((*run, ("node", "1")))))] == 400.0


GENDER = {"bleu_masculine": 31.0, "bleu_feminine": 27.5, "accuracy_masculine": 90.0, "accuracy_feminine": 80.0,
          "accuracy": 85.0, "gender_gap_bleu": 3.5, "gender_gap_accuracy": 10.0, "count_masculine": 4}


def test_gender_figures_reach_the_endpoint_and_the_status_per_language(tmp_path):
    # MT-GenEval's per-gender BLEU, accuracy and gaps for each target language: gauges on rank 0's
    # endpoint, and through the operator's scrape, status.progress (kubectl get -o wide: Gender gap).
    from rosetta_operator import progress as pr
    from rosetta_operator.crd_status import status_schema

    t = serving_telemetry(tmp_path, name="run-a")
    port = t.port
    try:
        t.set_static(total_steps=10)
        t.log_step(STEP)
        t.log_eval({**EVAL, "langs": {"de": {"bleu": 30.0, "gender": GENDER},
                                      "es": {"bleu": 35.0, "gender": {**GENDER, "gender_gap_bleu": -1.5}}}})
        got = scrape(port)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        t.close()
    run = (("namespace", "team"), ("training", "run-a"))
    de, fem = tuple(sorted((*run, ("lang", "de")))), tuple(sorted((*run, ("gender", "feminine"), ("lang", "de"))))
    assert got[("rosetta_eval_gender_accuracy", de)] == 85
    assert got[("rosetta_eval_gender_gap_accuracy", de)] == 10
    assert got[("rosetta_eval_gender_bleu", fem)] == 27.5
    assert got[("rosetta_eval_gender_accuracy_by_gender", fem)] == 80

    progress = pr.progress_from(pr.parse_metrics(text), now="2026-01-01T00:00:00Z")
    assert progress["gender"]["de"] == {"gapBleu": 3.5, "gapAccuracy": 10.0, "accuracy": 85.0,
                                        "bleuMasculine": 31.0, "bleuFeminine": 27.5,
                                        "accuracyMasculine": 90.0, "accuracyFeminine": 80.0}
    assert progress["gender"]["es"]["gapBleu"] == -1.5
    assert progress["genderGapBleu"] == 1.0  # the mean over languages, signed
    schema = status_schema()["properties"]["progress"]["properties"]
    assert set(progress["gender"]["de"]) <= set(schema["gender"]["additionalProperties"]["properties"])


def test_heartbeat_moves_with_each_unit_of_work_and_never_by_itself(tmp_path):
    import time

    t = serving_telemetry(tmp_path, name="run-a")
    port = t.port
    run = (("namespace", "team"), ("training", "run-a"))

    def heartbeat() -> float:
        return scrape(port)[("rosetta_heartbeat_timestamp_seconds", run)]

    try:
        started = heartbeat()
        assert abs(started - time.time()) < 60  # set when the endpoint starts: the stall clock can start
        time.sleep(0.05)
        assert heartbeat() == started  # no timer beats in the background
        t.beat()
        stepped = heartbeat()
        assert stepped > started
        time.sleep(0.05)
        with t.phase("checkpoint"):
            saving = heartbeat()
            assert saving > stepped
        assert heartbeat() > saving  # the end of a save is a beat too
    finally:
        t.close()
    Telemetry(tmp_path, name="x", namespace=None, port=0, tensorboard=False, enabled=False).beat()  # other ranks
