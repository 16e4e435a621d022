"""A live progress bar fed by rank 0's metrics.jsonl and eval.jsonl, the files the trainer
writes anyway, so the runner needs no connection to the training processes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from tqdm.auto import tqdm


class JsonlFollower:
    """The complete lines appended to a file since the last call (the file may not exist yet)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                if size < self.offset:  # truncated: a resumed run rewinds the file to its checkpoint
                    self.offset = 0
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records


class TrainingProgress:
    """Step/total, loss, tokens/s, latest BLEU and ETA, refreshed on every `tick()`."""

    def __init__(self, trainer_output: Optional[Path], enabled: bool = True, min_interval: float = 0.5):
        self.enabled, self.min_interval = enabled, min_interval
        self.bar: Optional[tqdm] = None
        self.last: dict[str, Any] = {}
        self.bleu: Optional[float] = None
        self._next = 0.0
        self.output: Optional[Path] = None
        self.metrics: Optional[JsonlFollower] = None
        self.evals: Optional[JsonlFollower] = None
        if trainer_output is not None:
            self.follow(trainer_output)

    def follow(self, trainer_output: Path) -> None:
        """Read rank 0's files from `trainer_output` from now on (a restart attempt whose output is a new
        emptyDir starts over there; the bar then restarts at its first record)."""
        if trainer_output == self.output:
            return
        self.output = trainer_output
        self.metrics = JsonlFollower(trainer_output / "metrics.jsonl")
        self.evals = JsonlFollower(trainer_output / "eval.jsonl")

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.min_interval
        if self.metrics is None or self.evals is None:
            return
        records = self.metrics.new_records()
        for record in self.evals.new_records():
            if record.get("split") == "validation" and record.get("bleu") is not None:
                self.bleu = record["bleu"]
        if not records and self.bar is None:
            return
        if records:
            self.last = records[-1]
        if not self.enabled:
            return
        step = self.last.get("step", 0)
        if self.bar is None or step < self.bar.n:
            # First record, or a restarted gang rewound to its checkpoint: rates restart from here.
            if self.bar is not None:
                self.bar.close()
            self.bar = tqdm(total=self.last.get("total_steps"), initial=step, desc="train", unit="step",
                            dynamic_ncols=True)
        else:
            self.bar.update(step - self.bar.n)
        postfix = {"loss": f"{self.last['loss']:.3f}" if "loss" in self.last else "-",
                   "tok/s": f"{self.last.get('tokens_per_s', 0):.0f}",
                   "BLEU": "-" if self.bleu is None else f"{self.bleu:.1f}"}
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        """Print a log line without breaking the bar."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self._next = 0.0
        self.tick()
        if self.bar is not None:
            self.bar.close()
