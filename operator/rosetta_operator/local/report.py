"""End-of-run report: PNG plots of loss, learning rate and the validation score (BLEU, or ROUGE-L
for summarization), and a summary table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from rosetta_contract.metrics import LABELS


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def primary_metric(summary: Optional[dict[str, Any]], evals: list[dict[str, Any]]) -> str:
    """The score the run picks its best checkpoint by, as the trainer reported it."""
    if summary and summary.get("primary_metric"):
        return str(summary["primary_metric"])
    if evals and "bleu" not in evals[0] and "rougeL" in evals[0]:
        return "rougeL"
    return "bleu"


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


def write_plots(trainer_output: Path, plots_dir: Path) -> list[Path]:
    """loss.png, learning_rate.png and <metric>.png, e.g. bleu.png (one line per language); the paths written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    metrics = _jsonl(trainer_output / "metrics.jsonl")
    evals = [e for e in _jsonl(trainer_output / "eval.jsonl") if e.get("split", "validation") == "validation"]
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig: Any, name: str) -> None:
        path = plots_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    steps = [r["step"] for r in metrics]
    for key, title, name in (("loss", "training loss", "loss.png"), ("lr", "learning rate", "learning_rate.png")):
        if not metrics:
            break
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [_or_nan(r.get(key)) for r in metrics], label="training")
        validation = [(e["step"], e["loss"]) for e in evals if e.get("loss") is not None]
        if key == "loss" and validation:  # one chart, so that overfitting shows as the curves part
            ax.plot(*zip(*validation), marker="o", label="validation")
            ax.legend()
            title = "loss"
        ax.set(xlabel="step", ylabel=title, title=title)
        ax.grid(alpha=0.3)
        save(fig, name)
    summary_path = trainer_output / "summary.json"
    metric = primary_metric(json.loads(summary_path.read_text()) if summary_path.exists() else None, evals)
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        langs = sorted({lang for e in evals for lang in e.get("langs", {})})
        for lang in langs:
            points = [(e["step"], e["langs"][lang][metric]) for e in evals
                      if lang in e.get("langs", {}) and e["langs"][lang].get(metric) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=lang)
        if len(langs) > 1:
            ax.plot([e["step"] for e in evals], [_or_nan(e.get(metric)) for e in evals], "k--", label="all")
        ax.set(xlabel="step", ylabel=label(metric), title=f"validation {label(metric)}")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, f"{metric.lower()}.png")
    return written


def _or_nan(value: Optional[float]) -> float:
    """A gap in the curve where a record has no value (what matplotlib makes of None, spelled out)."""
    return float("nan") if value is None else value


def _summary_score(summary: Mapping[str, Any], which: str) -> Any:
    """final_score / best_score, or from a summary of an earlier version, final_bleu / best_bleu."""
    return summary.get(f"{which}_score", summary.get(f"{which}_bleu"))


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(outcome: Any, trainer_output: Path, plots: list[Path]) -> list[tuple[str, str]]:
    summary: Optional[dict[str, Any]] = None
    if (trainer_output / "summary.json").exists():
        summary = json.loads((trainer_output / "summary.json").read_text())
    rows = [("phase", outcome.phase + (f" ({outcome.message})" if outcome.message else "")),
            ("restarts", str(outcome.restarts))]
    if summary:
        test = summary.get("test") or {}
        metric = primary_metric(summary, [])
        rows += [
            ("steps", f"{summary.get('steps')}/{summary.get('total_steps')}"),
            ("world size", str(summary.get("world_size"))),
            ("wall seconds", _fmt(summary.get("wall_seconds"), ".0f")),
            ("tokens/s", _fmt(summary.get("tokens_per_s"), ".0f")),
            (f"validation {label(metric)}", f"{_fmt(_summary_score(summary, 'final'))} (best "
                                             f"{_fmt(_summary_score(summary, 'best'))} at step {summary.get('best_step')})"),
        ]
        shown = [m for m in ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum") if test.get(m) is not None]
        if shown:
            rows.append((f"test {' / '.join(label(m) for m in shown)}", " / ".join(_fmt(test[m]) for m in shown)))
        rows += [("checkpoint", str(summary.get("latest_checkpoint"))),
                 ("best checkpoint", str(summary.get("best_checkpoint")))]
    rows.append(("trainer output", str(trainer_output)))
    rows += [(f"plot: {p.stem}", str(p)) for p in plots]
    return rows


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
