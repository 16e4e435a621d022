"""A first start's peak memory, phase by phase: which part of the data stage holds the most.

The data stage of `rosetta train` on a training with `tokenizer.train` and nothing prepared yet
(examples/multi30k-en-de.yaml: a Unigram tokenizer of 8,000 pieces, lengths up to 96, batches of
6,000 tokens), on Multi30k's English → German training set repeated --copies times, each copy
prefixed with its number word (bench/tokenizer_sample.py) so that the duplicate filter keeps
every pair, validated and tested on Multi30k's own sets. Measured two ways:

- each phase alone, in a fresh process, from the files (a phase reads the text again, as the
  start does, so each includes the ones it streams through): reading the training files;
  reading and checking them (the length-ratio and test-overlap filters); with the duplicate
  filter too; training the tokenizer (with the default sample) from that stream; tokenizing it
  (discarding the ids); tokenizing and writing the prepared shards; the batch plan of one epoch
  from those shards. Each reports the peak RSS it added to a process that has imported the
  trainer (torch and transformers: the baseline), and for the tokenizing phases the peak RSS of
  the largest tokenizing worker (forked, so it shares the parent's pages);
- all of them in one process, in the start's order (trainer/rosetta_trainer/commands/train.py,
  prepare_data, then the first epoch's plan), with the RSS sampled every 10 ms: what the process
  holds during each phase, with what earlier phases left behind.

    .venv/bin/python bench/first_start_phases.py                  # 290k pairs, about 4 minutes

Prints a markdown table and writes JSON to --output (default bench/results/first_start_phases.json).
Needs psutil (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

from data_scale import MULTI30K, REPO, _alone, _cpu, _memory, _mib, run_spawned
from tokenizer_sample import make_corpus

EXAMPLE = REPO / "examples" / "multi30k-en-de.yaml"


def _spec(work: Path):
    from rosetta_contract.spec import load_for_trainer

    def pairs(source: Path, target: Path) -> str:
        return json.dumps([{"format": "pairs", "source": str(source), "target": str(target)}])

    document = load_for_trainer(EXAMPLE, overrides=[
        f"spec.data.train={pairs(work / 'train.en', work / 'train.de')}",
        f"spec.data.validation={pairs(MULTI30K / 'val.en.gz', MULTI30K / 'val.de.gz')}",
        f"spec.data.test={pairs(MULTI30K / 'test_2016_flickr.en.gz', MULTI30K / 'test_2016_flickr.de.gz')}",
    ])
    return document.spec


def _text(spec, drop_duplicates: bool = True):
    from rosetta_trainer.preparation.data_checks import read_checked

    spec.data.checks.drop_duplicates = drop_duplicates
    return read_checked(spec.data, read_train=False).training_text.pairs(spec.uses_task_prefix())


def _count(stream) -> int:
    n = 0
    for _ in stream:
        n += 1
    return n


def _tokenizer(work: Path):
    from rosetta_trainer.models.tokenization import load_tokenizer

    return load_tokenizer(work / "tokenizer")


def _worker_peak_mib() -> float:
    return _mib(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)


# Each phase runs in its own process, from the files, and returns what it added to the baseline.

def phase_read(work: Path) -> dict:
    from rosetta_trainer.data.reader import iter_source

    spec = _spec(work)
    return {"pairs": sum(_count(iter_source(src, spec.data)) for src in spec.data.train)}


def phase_check(work: Path) -> dict:
    return {"pairs": _count(_text(_spec(work), drop_duplicates=False))}


def phase_dedup(work: Path) -> dict:
    return {"pairs": _count(_text(_spec(work)))}


def phase_tokenizer(work: Path) -> dict:
    from rosetta_trainer.models.tokenization import train_tokenizer

    spec = _spec(work)
    tokenizer = train_tokenizer(spec.tokenizer.train, _text(spec), work / "tokenizer")
    return {"max_sentences": spec.tokenizer.train.max_sentences, "vocab_size": len(tokenizer)}


def phase_tokenize(work: Path) -> dict:
    from rosetta_trainer.preparation import shards

    spec = _spec(work)
    tokens = 0
    for (src_ids, _), (tgt_ids, _) in shards.tokenize(_tokenizer(work), _text(spec), spec.data.max_source_length,
                                                      spec.data.max_target_length):
        tokens += len(src_ids) + len(tgt_ids)
    return {"tokens": tokens, "worker_peak_rss_mib": _worker_peak_mib()}


def phase_write(work: Path) -> dict:
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_identity import data_identity

    spec = _spec(work)
    text = _text(spec)
    corpus, _ = shards.prepare_corpus(work / "prepared", _tokenizer(work), text, spec.data.max_source_length,
                                      spec.data.max_target_length, _alone(),
                                      identity=data_identity(spec.data, use_prefix=spec.uses_task_prefix()))
    return {"pairs": len(corpus), "disk_mib": _mib(sum(p.stat().st_size for p in corpus.path.iterdir())),
            "worker_peak_rss_mib": _worker_peak_mib()}


def phase_plan(work: Path) -> dict:
    from rosetta_trainer.data.batching import batch_shapes, plan_epoch
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_identity import data_identity

    spec = _spec(work)
    found = shards.find_prepared(work / "prepared", data_identity(spec.data, use_prefix=spec.uses_task_prefix()),
                                 _tokenizer(work), spec.data.max_source_length, spec.data.max_target_length, _alone())
    if found is None:
        raise RuntimeError("the prepared directory was not found")
    src, tgt = found[0].lengths()
    b = spec.training.batch
    plan = plan_epoch(src, tgt, seed=spec.training.seed, epoch=0, max_tokens=b.tokens, max_sentences=b.sentences,
                      shapes=batch_shapes(spec))
    return {"batches": len(plan)}


def measured(phase, work: Path) -> dict:
    # What every phase imports first, so that the baseline is a process ready to start.
    import rosetta_trainer.models.tokenization  # noqa: F401
    import rosetta_trainer.preparation.shards  # noqa: F401

    _spec(work)
    before = _memory()
    started, cpu = time.perf_counter(), _cpu()
    out = phase(work)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    after = _memory()
    return {**out, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "baseline_rss_mib": before["rss_mib"],
            "peak_rss_mib": after["peak_rss_mib"], "added_peak_rss_mib": round(after["peak_rss_mib"] - before["rss_mib"], 1),
            "rss_after_mib": after["rss_mib"]}


class Sampler(threading.Thread):
    """The process's RSS every 10 ms, its peak and its seconds kept per named phase."""

    def __init__(self):
        super().__init__(daemon=True)
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.phase, self.peaks, self.running = "imports", {}, True
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * self.page

    def run(self) -> None:
        while self.running:
            self.mark_peak()
            time.sleep(0.01)

    def mark_peak(self) -> None:
        rss = self.rss()
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[self.phase] = round(now - self._clock, 2)
        self._clock = now
        self.mark_peak()
        self.phase = phase
        self.mark_peak()


def one_start(work: Path) -> dict:
    """The phases in the start's order, in one process (prepare_data and the first plan)."""
    sampler = Sampler()
    sampler.start()
    from rosetta_trainer.data.batching import batch_shapes, plan_epoch
    from rosetta_trainer.models.tokenization import train_tokenizer
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_checks import read_checked
    from rosetta_trainer.preparation.data_identity import data_identity

    spec = _spec(work)
    d, b = spec.data, spec.training.batch
    baseline = sampler.rss()

    enter, seconds = sampler.enter, sampler.seconds

    enter(READ_HELD_OUT)
    text = read_checked(d, read_train=False).training_text.pairs(spec.uses_task_prefix())
    enter(TRAIN_TOKENIZER)
    tokenizer = train_tokenizer(spec.tokenizer.train, text, work / "start" / "tokenizer")
    enter(PREPARE)
    corpus, _ = shards.prepare_corpus(work / "start" / "prepared", tokenizer, text, d.max_source_length,
                                      d.max_target_length, _alone(),
                                      identity=data_identity(d, use_prefix=spec.uses_task_prefix()))
    enter(PLAN)
    plan_epoch(*corpus.lengths(), seed=spec.training.seed, epoch=0, max_tokens=b.tokens, max_sentences=b.sentences,
               shapes=batch_shapes(spec))
    enter("end")
    sampler.running = False
    sampler.join()
    return {"baseline_rss_mib": _mib(baseline),
            "phases": [{"phase": name, "seconds": seconds[name], "peak_rss_mib": _mib(sampler.peaks[name]),
                        "peak_above_baseline_mib": _mib(sampler.peaks[name] - baseline)}
                       for name in (READ_HELD_OUT, TRAIN_TOKENIZER, PREPARE, PLAN)],
            "peak_rss_mib": _memory()["peak_rss_mib"], "worker_peak_rss_mib": _worker_peak_mib()}


READ_HELD_OUT = "validation and test read and checked"
TRAIN_TOKENIZER = "tokenizer trained (the training text streamed, checked, deduplicated)"
PREPARE = "training text tokenized and written (streamed, checked, deduplicated again)"
PLAN = "batch plan of the first epoch"


def run(fn, *args) -> dict:
    return run_spawned(getattr(args[0], "__name__", fn.__name__), fn, args)


PHASES = [("reading the training files", phase_read), ("+ checking (length ratio, test overlap)", phase_check),
          ("+ deduplicating", phase_dedup), ("+ training the tokenizer (default sample)", phase_tokenizer),
          ("+ tokenizing (ids discarded)", phase_tokenize), ("+ tokenizing and writing the shards", phase_write),
          ("batch plan of one epoch, from the shards", phase_plan)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=10, help="Multi30k's 29,000 training pairs, this many times")
    parser.add_argument("--workdir", help="keep the corpus and outputs here (default: a temporary directory)")
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "first_start_phases.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rosetta-first-start-", dir=args.workdir) as tmp:
        work = Path(tmp)
        started, load = time.perf_counter(), os.getloadavg()[0]
        corpus = run(make_corpus, work, 29_000 * args.copies)
        alone = {name: run(measured, phase, work) for name, phase in PHASES}
        together = run(one_start, work)
        result = {"date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()}-core CPU, {platform.machine()}",
                  "pairs": 29_000 * args.copies, "config": str(EXAMPLE.relative_to(REPO)), **corpus,
                  "load_average_at_start": load, "phases_alone": alone, "one_start": together,
                  "wall_seconds": round(time.perf_counter() - started, 1), "load_average_at_end": os.getloadavg()[0]}
    print("| phase (alone, from the files) | seconds | CPU s | peak RSS added (MiB) | largest worker's peak RSS (MiB) |")
    print("|---|---:|---:|---:|---:|")
    for name, figures in alone.items():
        print(f"| {name} | {figures['seconds']} | {figures['cpu_seconds']} | {figures['added_peak_rss_mib']} | "
              f"{figures.get('worker_peak_rss_mib', '–')} |")
    print(f"\none process, baseline {together['baseline_rss_mib']} MiB:\n")
    print("| phase (in the start's order) | seconds | peak RSS (MiB) | above the baseline (MiB) |\n|---|---:|---:|---:|")
    for p in together["phases"]:
        print(f"| {p['phase']} | {p['seconds']} | {p['peak_rss_mib']} | {p['peak_above_baseline_mib']} |")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
