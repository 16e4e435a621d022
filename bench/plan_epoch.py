"""One epoch's batch plan at millions of pairs: batching.plan_epoch against the per-example plan it
replaced (tests/support/plan_reference.py, the same batches), in one run.

    python bench/plan_epoch.py [--pairs 1000000,4000000,16000000] [--tokens 8192]

Lengths are drawn like parallel text (target ≈ 1.1 × source, 3-60 tokens). Prints a markdown table:
seconds for each and their ratio. Every start of a training plans its first epoch, so these seconds
come before the first step.
"""

from __future__ import annotations

import argparse
import sys
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default="1000000,4000000,16000000")
    p.add_argument("--tokens", type=int, default=8192)
    args = p.parse_args(argv)
    print("| pairs | plan_epoch (s) | per-example plan (s) | ratio | batches |\n|---:|---:|---:|---:|---:|")
    for pairs in (int(x) for x in args.pairs.split(",")):
        src, tgt = lengths(pairs)
        ours, batches = timed(plan_epoch, src, tgt, args.tokens)
        theirs, expected = timed(reference_plan, src, tgt, args.tokens)
        assert batches == expected, "the plans differ"
        print(f"| {pairs:,} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.1f}x | {len(batches):,} |", flush=True)


if __name__ == "__main__":
    main()
