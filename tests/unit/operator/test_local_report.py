"""The `rosetta run` end-of-run table and plots name the run's own score: BLEU or ROUGE-L."""

import json
from types import SimpleNamespace

from rosetta_operator.local.report import format_table, summary_rows, write_plots


def _run(tmp_path, summary: dict, evals: list[dict]):
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0, "lr": 1e-3}) + "\n")
    outcome = SimpleNamespace(phase="Succeeded", message=None, restarts=0)
    plots = write_plots(tmp_path, tmp_path / "plots")
    return format_table(summary_rows(outcome, tmp_path, plots)), plots


BASE = {"steps": 10, "total_steps": 10, "world_size": 1, "wall_seconds": 3, "tokens_per_s": 100,
        "best_step": 10, "latest_checkpoint": "c", "best_checkpoint": "c"}


def test_translation_reports_bleu_and_chrf(tmp_path):
    table, plots = _run(tmp_path, {**BASE, "final_bleu": 31.5, "best_bleu": 31.5, "primary_metric": "bleu",
                                   "test": {"bleu": 30.1, "chrf": 55.2}},
                        [{"step": 10, "split": "validation", "bleu": 31.5, "langs": {"de": {"bleu": 31.5}}}])
    assert "validation BLEU" in table and "31.50 (best 31.50 at step 10)" in table
    assert "test BLEU / chrF" in table and "30.10 / 55.20" in table
    assert sorted(p.name for p in plots) == ["bleu.png", "learning_rate.png", "loss.png"]


def test_summarization_reports_rouge(tmp_path):
    table, plots = _run(tmp_path, {**BASE, "final_bleu": 75.3, "best_bleu": 77.2, "primary_metric": "rougeL",
                                   "test": {"rouge1": 76.2, "rouge2": 61.4, "rougeL": 75.3}},
                        [{"step": 10, "split": "validation", "rougeL": 75.3, "langs": {"en": {"rougeL": 75.3}}}])
    assert "validation ROUGE-L" in table and "BLEU" not in table
    assert "test ROUGE-1 / ROUGE-2 / ROUGE-L" in table and "76.20 / 61.40 / 75.30" in table
    assert sorted(p.name for p in plots) == ["learning_rate.png", "loss.png", "rougel.png"]


def test_the_loss_plot_has_the_validation_loss_beside_the_training_loss(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    lines = {}
    close = plt.close

    def record(fig):
        lines[fig.axes[0].get_title()] = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].lines}
        close(fig)

    monkeypatch.setattr(plt, "close", record)
    _run(tmp_path, {**BASE, "final_bleu": 31.5, "best_bleu": 31.5, "primary_metric": "bleu"},
         [{"step": 1, "split": "validation", "loss": 2.5, "bleu": 31.5, "langs": {"de": {"bleu": 31.5}}},
          {"step": 1, "split": "test", "loss": 9.0, "bleu": 30.0, "langs": {"de": {"bleu": 30.0}}}])
    assert lines["loss"] == {"training": [2.0], "validation": [2.5]}
    assert lines["learning rate"] == {"training": [1e-3]}
