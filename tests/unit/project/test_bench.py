"""bench/hf_seq2seq.py: argument checks and how the two systems' logs become figures (no training)."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "hf_seq2seq.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("hf_seq2seq", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_defaults_and_checks(bench):
    args = bench.parse_args([])
    assert (args.steps, args.repeats, args.batch, args.model_size, args.warmup) == (300, 2, 64, "small", 30)
    with pytest.raises(SystemExit):
        bench.parse_args(["--eval-interval", "15"])  # not a multiple of the log interval
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "40", "--skip-steps", "50"])
    env = bench.parse_args(["--peer-env", "MALLOC_MMAP_MAX_=0", "--rosetta-env", "A=b=c"]).env
    assert env == {"peer": {"MALLOC_MMAP_MAX_": "0"}, "rosetta": {"A": "b=c"}}
    with pytest.raises(SystemExit):
        bench.parse_args(["--peer-env", "NO_VALUE"])


def test_rosetta_windows_leave_out_validation_time(bench, tmp_path):
    # Two windows of 10 steps, 1 s per step; a 4 s validation at step 10 falls in the second.
    write_jsonl(tmp_path / "metrics.jsonl", [
        {"step": 10, "step_time_s": 1.0, "target_tokens_per_s": 100.0, "loss": 6.0},
        {"step": 20, "step_time_s": 1.0, "target_tokens_per_s": 100.0, "loss": 5.0},
    ])
    write_jsonl(tmp_path / "eval.jsonl", [
        {"step": 10, "split": "validation", "bleu": 1.0, "seconds": 4.0},
        {"step": 20, "split": "validation", "bleu": 3.0, "seconds": 4.0},
    ])
    (tmp_path / "summary.json").write_text(json.dumps({"final_loss": 5.0}))
    windows, evals = bench.rosetta_timeline(tmp_path)
    assert windows == [(1, 10, 1000.0, 10.0), (11, 20, 1000.0, 6.0)]
    assert [e["train_seconds"] for e in evals] == [10.0, 16.0]

    args = bench.parse_args(["--skip-steps", "10", "--bleu", "2"])
    run = bench.measure("rosetta", tmp_path, {"wall_seconds": 30.0, "peak_rss_main_bytes": 1,
                                              "peak_rss_tree_bytes": 2}, args)
    assert run["target_tokens_per_s"] == pytest.approx(1000.0 / 6.0)
    assert (run["seconds_to_bleu"], run["steps_to_bleu"]) == (16.0, 20)


def test_late_loss_averages_the_last_100_steps(bench):
    losses = [(step, float(step)) for step in range(10, 301, 10)]
    assert bench.late_loss(losses, 300) == pytest.approx(sum(range(210, 301, 10)) / 10)
    assert bench.late_loss([], 300) is None


def test_peer_measure_reads_its_step_times_evals_and_logged_losses(bench, tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [
        {"step": s, "target_tokens": 500, "seconds": 0.5, "train_seconds": 0.5 * s} for s in range(1, 201)])
    write_jsonl(tmp_path / "eval.jsonl", [{"step": 100, "split": "validation", "bleu": 2.5, "train_seconds": 50.0},
                                          {"step": 200, "split": "validation", "bleu": 4.0, "train_seconds": 100.0}])
    (tmp_path / "summary.json").write_text(json.dumps({"final_loss": 9.9, "losses": [[s, 4.0 + (s % 20 == 0)]
                                                                                      for s in range(10, 201, 10)]}))
    args = bench.parse_args(["--steps", "200", "--skip-steps", "50", "--bleu", "3"])
    run = bench.measure("peer", tmp_path, {"wall_seconds": 1.0, "peak_rss_main_bytes": 1, "peak_rss_tree_bytes": 1},
                        args)
    assert run["target_tokens_per_s"] == pytest.approx(1000.0)
    assert (run["seconds_to_bleu"], run["steps_to_bleu"]) == (100.0, 200)
    # Not the last logged window (5.0): the mean over the last 100 steps.
    assert run["final_loss"] == pytest.approx(4.5)
