"""The host's part of a batch: Rosetta's loader against transformers' DataCollatorForSeq2Seq.

    python bench/collate.py [--pairs 256] [--repeat 200]

A fast step leaves the host a millisecond or two per batch: the loader process must make each batch
in well under that, or it caps the step rate. Both sides make the same 256-pair batches of
Multi30k-like lengths (9 to 30 source tokens, the target a few longer): Rosetta's Collation (padding,
masks, labels, and its counts: tokens, sentences and the batch's training FLOPs), from the in-memory
lists and from a prepared memory map, and the collator Seq2SeqTrainer uses (padding, labels and the
decoder inputs made by the model), from the tokenized rows it gets. Median milliseconds per batch.

Writes RESULTS/collate.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer")]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--batches", type=int, default=20, help="distinct batches, cycled")
    p.add_argument("--repeat", type=int, default=200, help="batches timed per variant")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    return p.parse_args(argv)


def median_ms(fn, batches: list, repeat: int) -> float:
    for b in batches:
        fn(b)
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        fn(batches[i % len(batches)])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import DataCollatorForSeq2Seq, MarianConfig, MarianMTModel

    from rosetta_trainer.data.batching import Collation, EncodedCorpus
    from rosetta_trainer.planning.flops import Seq2SeqDims, training_flops
    from rosetta_trainer.preparation.shards import ShardedCorpus

    rng = np.random.default_rng(0)
    n = args.pairs * args.batches
    src_len = rng.integers(9, 31, n)
    tgt_len = np.maximum(3, src_len + rng.integers(-2, 5, n))
    corpus = EncodedCorpus([rng.integers(3, 8000, k).tolist() for k in src_len],
                           [rng.integers(3, 8000, k).tolist() for k in tgt_len])
    batches = [list(range(i * args.pairs, (i + 1) * args.pairs)) for i in range(args.batches)]
    config = MarianConfig(vocab_size=8000, decoder_vocab_size=8000, d_model=512, encoder_layers=6, decoder_layers=6,
                          pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    dims = Seq2SeqDims.from_hf_config(config)
    rosetta = Collation(0, flops=lambda s, t: training_flops(dims, s, t))

    with tempfile.TemporaryDirectory() as tmp:
        # The prepared corpus: ids end to end in .npy files, read through memory maps (shards.py's layout).
        for side, seqs in (("source", corpus.sources), ("target", corpus.targets)):
            offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
            np.save(Path(tmp) / f"{side}_ids.npy", np.concatenate([np.asarray(s, dtype=np.uint16) for s in seqs]))
            np.save(Path(tmp) / f"{side}_offsets.npy", offsets)
        (Path(tmp) / "meta.json").write_text("{}")
        sharded = ShardedCorpus(tmp)

        model = MarianMTModel(config)  # the collator asks it for decoder inputs, as run_translation.py sets it up
        peer = DataCollatorForSeq2Seq(tokenizer=_tokenizer(), model=model, label_pad_token_id=-100)
        features = [[{"input_ids": corpus.sources[i], "attention_mask": [1] * len(corpus.sources[i]),
                      "labels": corpus.targets[i]} for i in b] for b in batches]
        rows = {
            "rosetta Collation, in-memory lists": median_ms(lambda b: rosetta(corpus, b), batches, args.repeat),
            "rosetta Collation, prepared memory map": median_ms(lambda b: rosetta(sharded, b), batches, args.repeat),
            "DataCollatorForSeq2Seq(model=...)": median_ms(peer, features, args.repeat),
        }
    peer_ms = rows["DataCollatorForSeq2Seq(model=...)"]
    meta = {"date": time.strftime("%Y-%m-%d"), "pairs": args.pairs, "torch": torch.__version__}
    lines = [f"{args.pairs}-pair batches of Multi30k-like lengths, median of {args.repeat}, one core, {meta['date']}.",
             "", "| collate | ms per batch | vs DataCollatorForSeq2Seq |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.3f} | {peer_ms / ms:.1f}x faster |" if name.startswith("rosetta")
              else f"| {name} | {ms:.3f} | 1.0x |" for name, ms in rows.items()]
    table = "\n".join(lines) + "\n"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "collate.json").write_text(json.dumps({"meta": meta, "ms": rows}, indent=2))
    (args.results / "collate.md").write_text(table)
    print(table)
    return 0


def _tokenizer():
    """A real fast tokenizer (what the collator pads with); its vocabulary does not matter here."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2},
                                                                        unk_token="<unk>")),
                                   pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


if __name__ == "__main__":
    sys.exit(main())
