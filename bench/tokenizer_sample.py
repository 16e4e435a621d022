"""The tokenizer's training sample against training on every sentence: memory, time, vocabulary.

`tokenizer.train.maxSentences` defaults to a seeded reservoir sample of 300,000 pairs. This
trains the tokenizer as the trainer does (rosetta_trainer.models.tokenization.train_tokenizer, one
thread: the trainer sets TOKENIZERS_PARALLELISM=false) on a corpus of --pairs pairs streamed from
its files, once on everything (`maxSentences: null`) and once per --samples size, each in a fresh
process, and reports for each:

- peak RSS of the process, and what training added to it (peak minus the RSS after imports);
- wall and CPU seconds, the reading of the files included;
- the vocabulary's Jaccard overlap with the one trained on everything;
- tokens per sentence (fertility, `</s>` left out) on a held-out set, Multi30k's test_2016_flickr,
  per side: a vocabulary fitted to less text spends more tokens on new text.

With --former, an earlier tokenization.py trains on everything too (before the sample became the
default, everything was held in memory while the tokenizer trained).

The corpus is Multi30k's English → German training set (29,000 pairs) repeated, each copy
prefixed with its own number word ("seventeen Two young guys ...") so that every line is
distinct, as in bench/data_scale.py. It has no more distinct words than Multi30k: a sample sees
most of them, where a real corpus of the same size has a long tail that a sample misses.

    .venv/bin/python bench/tokenizer_sample.py                     # 300k pairs, about 3 minutes
    .venv/bin/python bench/tokenizer_sample.py --pairs 1000000 --output bench/results/tokenizer_sample_1m.json

Prints a JSON summary and writes it to --output (default bench/results/tokenizer_sample.json).
Needs psutil (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from data_scale import MULTI30K, REPO, _cpu, _memory, run_spawned, write_result

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HELD_OUT = "test_2016_flickr"
ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
       "seventeen eighteen nineteen".split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_word(n: int) -> str:
    """English words for 0 ≤ n < 1,000,000, one token: "three-hundred-and-forty-two"."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10 - 2] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + "-hundred" + ("" if n % 100 == 0 else "-and-" + number_word(n % 100))
    return number_word(n // 1000) + "-thousand" + ("" if n % 1000 == 0 else "-" + number_word(n % 1000))


def _lines(name: str) -> list[str]:
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as fh:
        return fh.read().splitlines()


def make_corpus(work: Path, pairs: int) -> dict:
    en, de = _lines("train.en.gz"), _lines("train.de.gz")
    for lang, lines in (("en", en), ("de", de)):
        with open(work / f"train.{lang}", "w", encoding="utf-8") as fh:
            for i in range(pairs):
                fh.write(f"{number_word(i // len(lines))} {lines[i % len(lines)]}\n")
    return {"base_pairs": len(en), "copies": -(-pairs // len(en)),
            "corpus_mib": round(sum((work / f"train.{lang}").stat().st_size for lang in ("en", "de")) / 2**20, 1)}


def _stream(work: Path):
    """The pairs as the trainer gives them to the tokenizer: read as they stream, never held."""
    with open(work / "train.en", encoding="utf-8") as en, open(work / "train.de", encoding="utf-8") as de:
        for source, target in zip(en, de):
            yield source.rstrip("\n"), target.rstrip("\n")


def job_train(work: Path, name: str, settings: dict, module: str | None = None) -> dict:
    from rosetta_contract.model_fields import TokenizerTraining
    from rosetta_trainer.models.tokenization import train_tokenizer

    if module is not None:
        loaded = importlib.util.spec_from_file_location("former_tokenization", module)
        former = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(former)
        train_tokenizer = former.train_tokenizer
    spec = TokenizerTraining.model_validate(settings)
    before = _memory()
    started, cpu = time.perf_counter(), _cpu()
    tokenizer = train_tokenizer(spec, _stream(work), work / name)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    after = _memory()
    fertility = {}
    for lang in ("en", "de"):
        held_out = _lines(f"{HELD_OUT}.{lang}.gz")
        ids = tokenizer(held_out, add_special_tokens=False)["input_ids"]
        fertility[lang] = {"tokens_per_sentence": round(sum(map(len, ids)) / len(ids), 4),
                           "unk_per_1000_tokens": round(1000 * sum(x.count(tokenizer.unk_token_id) for x in ids)
                                                         / sum(map(len, ids)), 3)}
    (work / name / "vocab.json").write_text(json.dumps(sorted(tokenizer.get_vocab())))
    return {"max_sentences": spec.max_sentences, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
            "peak_rss_mib": after["peak_rss_mib"], "baseline_rss_mib": before["rss_mib"],
            "added_peak_rss_mib": round(after["peak_rss_mib"] - before["rss_mib"], 1),
            "vocab_size": len(tokenizer), "held_out": fertility}


def run(fn, *args) -> dict:
    return run_spawned(f"{fn.__name__} {args[1]}", fn, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=300_000)
    from rosetta_contract.model_fields import TokenizerTraining

    parser.add_argument("--samples", default=f"{TokenizerTraining().max_sentences},100000,29000",
                        help="sample sizes (pairs) to compare with everything; the first is the spec's default")
    parser.add_argument("--type", default="unigram", choices=["unigram", "bpe"])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--former", metavar="FILE",
                        help="also train on everything with this tokenization.py, e.g. an earlier one: "
                             "git show <commit>:trainer/rosetta_trainer/models/tokenization.py > /tmp/former.py")
    parser.add_argument("--workdir", help="keep the corpus and tokenizers here (default: a temporary directory)")
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "tokenizer_sample.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rosetta-tokenizer-sample-", dir=args.workdir) as tmp:
        work = Path(tmp)
        started, load = time.perf_counter(), os.getloadavg()[0]
        corpus = run(make_corpus, work, args.pairs)
        base = {"type": args.type, "vocabSize": args.vocab_size}
        runs = {"everything": run(job_train, work, "everything", {**base, "maxSentences": None})}
        if args.former:
            runs["former_everything"] = run(job_train, work, "former_everything", {**base, "maxSentences": None},
                                            args.former)
        for k in (int(x) for x in args.samples.split(",") if x):
            runs[f"sample_{k}"] = run(job_train, work, f"sample_{k}", {**base, "maxSentences": k})
        full = set(json.loads((work / "everything" / "vocab.json").read_text()))
        everything = runs["everything"]
        for name, figures in runs.items():
            vocab = set(json.loads((work / name / "vocab.json").read_text()))
            figures["jaccard_with_everything"] = round(len(vocab & full) / len(vocab | full), 4)
            figures["tokens_per_sentence_vs_everything_pct"] = {
                lang: round(100 * (figures["held_out"][lang]["tokens_per_sentence"]
                                   / everything["held_out"][lang]["tokens_per_sentence"] - 1), 2)
                for lang in ("en", "de")}
        result = {
            "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()}-core CPU, {platform.machine()}",
            "pairs": args.pairs, "corpus": "Multi30k train en-de repeated, each copy prefixed with its number word",
            **corpus, "tokenizer": f"{args.type} {args.vocab_size}", "held_out": f"Multi30k {HELD_OUT} en, de",
            "load_average_at_start": load, "runs": runs,
            "wall_seconds": round(time.perf_counter() - started, 1), "load_average_at_end": os.getloadavg()[0],
        }
    write_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
