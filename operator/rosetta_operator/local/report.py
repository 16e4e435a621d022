"""End-of-run report: PNG plots of loss, learning rate and validation BLEU, and a summary table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_plots(trainer_output: Path, plots_dir: Path) -> list[Path]:
    """loss.png, learning_rate.png and bleu.png (one line per language); the paths written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    metrics = _jsonl(trainer_output / "metrics.jsonl")
    evals = [e for e in _jsonl(trainer_output / "eval.jsonl") if e.get("split", "validation") == "validation"]
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name: str) -> None:
        path = plots_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    steps = [r["step"] for r in metrics]
    for key, label, name in (("loss", "training loss", "loss.png"), ("lr", "learning rate", "learning_rate.png")):
        if not metrics:
            break
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r.get(key) for r in metrics])
        ax.set(xlabel="step", ylabel=label, title=label)
        ax.grid(alpha=0.3)
        save(fig, name)
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        langs = sorted({lang for e in evals for lang in e.get("langs", {})})
        for lang in langs:
            points = [(e["step"], e["langs"][lang]["bleu"]) for e in evals
                      if lang in e.get("langs", {}) and e["langs"][lang].get("bleu") is not None]
            ax.plot(*zip(*points), marker="o", label=lang)
        if len(langs) > 1:
            ax.plot([e["step"] for e in evals], [e["bleu"] for e in evals], "k--", label="all")
        ax.set(xlabel="step", ylabel="BLEU", title="validation BLEU")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "bleu.png")
    return written


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(outcome, trainer_output: Path, plots: list[Path]) -> list[tuple[str, str]]:
    summary: Optional[dict] = None
    if (trainer_output / "summary.json").exists():
        summary = json.loads((trainer_output / "summary.json").read_text())
    rows = [("phase", outcome.phase + (f" ({outcome.message})" if outcome.message else "")),
            ("restarts", str(outcome.restarts))]
    if summary:
        test = summary.get("test") or {}
        rows += [
            ("steps", f"{summary.get('steps')}/{summary.get('total_steps')}"),
            ("world size", str(summary.get("world_size"))),
            ("wall seconds", _fmt(summary.get("wall_seconds"), ".0f")),
            ("tokens/s", _fmt(summary.get("tokens_per_s"), ".0f")),
            ("validation BLEU", f"{_fmt(summary.get('final_bleu'))} (best {_fmt(summary.get('best_bleu'))} "
                                f"at step {summary.get('best_step')})"),
        ]
        if test:
            rows.append(("test BLEU / chrF", f"{_fmt(test.get('bleu'))} / {_fmt(test.get('chrf'))}"))
        rows += [("checkpoint", str(summary.get("latest_checkpoint"))),
                 ("best checkpoint", str(summary.get("best_checkpoint")))]
    rows.append(("trainer output", str(trainer_output)))
    rows += [(f"plot: {p.stem}", str(p)) for p in plots]
    return rows


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
