"""What padding each batch shape policy costs on Multi30k, and how many shapes an epoch then shows.

    python bench/padding.py [--data ../shared/data/multi30k] [--tokens 6000]

The training pairs are tokenized as examples/multi30k-en-de.yaml does (an 8,000-piece Unigram
vocabulary trained on them), one epoch is planned with the trainer's own batching.plan_epoch and
collated with its Collation, per policy. Reported: the positions the model computes (padding
included) over the real tokens, and the distinct (rows, source length, target length) shapes, which
is what a compiled step specialises on and what CUDA graphs record one graph each for.

Writes RESULTS/padding.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer")]

from rosetta_trainer.data.batching import BatchShapes, plan_epoch  # noqa: E402

POLICIES = {
    "longest in the batch (the default)": BatchShapes(),
    "multiple of 8": BatchShapes(multiple=8),
    "multiple of 16": BatchShapes(multiple=16),
    "multiple of 4, static rows": BatchShapes(multiple=4, static_rows=True),
    "multiple of 8, static rows (the reduce-overhead default)": BatchShapes(multiple=8, static_rows=True),
    "buckets 16,24,32,48,64,96, static rows": BatchShapes(buckets=(16, 24, 32, 48, 64, 96), static_rows=True),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    p.add_argument("--tokens", type=int, default=6000, help="batch.tokens (the example's 6,000)")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--work", type=Path, default=Path("/tmp/rosetta-padding"))
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    return p.parse_args(argv)


def lengths(args) -> tuple[np.ndarray, np.ndarray]:
    from rosetta_contract.data_fields import DataSpec
    from rosetta_contract.model_fields import TokenizerTraining
    from rosetta_trainer.data.reader import read_split
    from rosetta_trainer.models.tokenization import train_tokenizer

    d = args.data.resolve()
    data = DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "maxSourceLength": 96,
                                    "maxTargetLength": 96, "train": [
                                        {"format": "pairs", "source": str(d / "train.en.gz"),
                                         "target": str(d / "train.de.gz")}]})
    examples = read_split(data, "train")
    tokenizer = train_tokenizer(TokenizerTraining(type="unigram", vocab_size=args.vocab),
                                [*(e.source for e in examples), *(e.target for e in examples)], args.work / "tokenizer")
    src = tokenizer([e.source for e in examples], truncation=True, max_length=96)["input_ids"]
    tgt = tokenizer(text_target=[e.target for e in examples], truncation=True, max_length=96)["input_ids"]
    return np.fromiter(map(len, src), dtype=np.int64), np.fromiter(map(len, tgt), dtype=np.int64)


def measure(src: np.ndarray, tgt: np.ndarray, shapes: BatchShapes, tokens: int) -> dict:
    plan = plan_epoch(src, tgt, seed=1, epoch=0, max_tokens=tokens, shapes=shapes)
    computed, seen = 0, set()
    for batch in plan:
        ls, lt = shapes.length(int(src[batch].max())), shapes.length(int(tgt[batch].max()))
        rows = shapes.rows(len(batch), ls, lt, tokens, None)
        computed += rows * (ls + lt)
        seen.add((rows, ls, lt))
    real = int(src.sum() + tgt.sum())
    return {"batches": len(plan), "shapes": len(seen), "computed_positions": computed, "real_tokens": real,
            "overhead": computed / real - 1}


def main(argv=None) -> int:
    args = parse_args(argv)
    src, tgt = lengths(args)
    rows = [{"policy": name, **measure(src, tgt, shapes, args.tokens)} for name, shapes in POLICIES.items()]
    meta = {"date": time.strftime("%Y-%m-%d"), "pairs": len(src), "tokens": args.tokens,
            "mean_source": float(src.mean()), "mean_target": float(tgt.mean())}
    lines = [f"Multi30k train ({meta['pairs']:,} pairs, {meta['mean_source']:.1f} + {meta['mean_target']:.1f} "
             f"tokens on average), batch.tokens {args.tokens}, one epoch, {meta['date']}.", "",
             "| shape policy | batches | distinct shapes | positions computed / real tokens |",
             "|---|---:|---:|---:|"]
    lines += [f"| {r['policy']} | {r['batches']:,} | {r['shapes']} | {1 + r['overhead']:.3f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "padding.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.results / "padding.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
