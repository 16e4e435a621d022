"""One epoch's batch plan at millions of pairs: batching.plan_epoch against the per-example plan it
replaced (tests/support/plan_reference.py, the same batches), in one run.

    python bench/plan_epoch.py [--pairs 1000000,4000000,16000000] [--tokens 8192] [--against REV]

Lengths are drawn like parallel text (target ≈ 1.1 × source, 3-60 tokens). Prints a markdown table:
seconds for each and their ratio. Every start of a training plans its first epoch, so these seconds
come before the first step. With --against, batching.py as it was at a git revision is timed too,
alternating with today's on the largest size (the same plans), so that a change is measured
against what it replaced in one run on one machine's load.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer"), str(REPO / "tests")]

from rosetta_trainer.data.batching import plan_epoch  # noqa: E402
from support.plan_reference import reference_plan  # noqa: E402


def lengths(pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 60, size=pairs).astype(np.int32)
    return src, np.maximum(2, (src * 1.1).astype(np.int32) + rng.integers(-3, 4, size=pairs).astype(np.int32))


def timed(plan, src, tgt, tokens: int) -> tuple[float, list]:
    started = time.perf_counter()
    batches = plan(src, tgt, seed=1, epoch=0, max_tokens=tokens)
    return time.perf_counter() - started, batches


def former_plan(revision: str):
    """plan_epoch from batching.py as it was at `revision` (imported from a temporary copy)."""
    source = subprocess.run(["git", "show", f"{revision}:trainer/rosetta_trainer/data/batching.py"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "batching_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("batching_before", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module.plan_epoch


def alternate(revision: str, src: np.ndarray, tgt: np.ndarray, tokens: int, rounds: int = 5) -> None:
    before, pairs = former_plan(revision), len(src)
    times: dict[str, list[float]] = {"today": [], revision: []}
    for _ in range(rounds):
        ours, batches = timed(plan_epoch, src, tgt, tokens)
        theirs, expected = timed(before, src, tgt, tokens)
        assert batches == expected, "the plans differ"
        times["today"].append(ours)
        times[revision].append(theirs)
    print(f"\n{pairs:,} pairs, {rounds} alternating rounds (seconds, median and range):\n\n| plan_epoch | median | min | max |\n|---|---:|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default="1000000,4000000,16000000")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--against", metavar="REV", help="also time batching.py at this git revision, alternating")
    args = p.parse_args(argv)
    print("| pairs | plan_epoch (s) | per-example plan (s) | ratio | batches |\n|---:|---:|---:|---:|---:|")
    for pairs in sorted(int(x) for x in args.pairs.split(",")):
        src, tgt = lengths(pairs)
        ours, batches = timed(plan_epoch, src, tgt, args.tokens)
        theirs, expected = timed(reference_plan, src, tgt, args.tokens)
        assert batches == expected, "the plans differ"
        print(f"| {pairs:,} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.1f}x | {len(batches):,} |", flush=True)
    if args.against:
        alternate(args.against, src, tgt, args.tokens)  # the largest size's lengths, drawn above


if __name__ == "__main__":
    main()
