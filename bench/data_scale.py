"""The training data at scale: tokenizing once into memory-mapped shards vs every rank's Python lists.

On Multi30k's English → German training set repeated to --pairs pairs (the same text the
issue's first measurement used; the built-in generator makes about 15k pairs/s on this machine,
too slow to be the input of a benchmark that times tokenizers), with a Unigram tokenizer trained
as the trainer would (8k pieces, on the first 29k pairs), this measures the data stage of a
training start, each in a fresh process:

- current: what the trainer did before shards.py, `batching.encode` into Python lists (one
  process: the trainer sets TOKENIZERS_PARALLELISM=false);
- prepared: `shards.prepare_corpus` writing (--workers processes) from the text in memory, as
  datasets.map is given it, and `rosetta prepare` from the files (reading and checking as the
  text streams: its peak memory); then the start-up of a training from its output (hashing the
  text for the key, then mapping) and a restart (the files' identity, no text read);
- datasets: what a Seq2SeqTrainer user does, `Dataset.from_dict(...).map(batched=True,
  num_proc=--workers)` into an Arrow cache file, then the same map again, which loads that cache;
- wall and CPU seconds (the process and its worker pools): on a machine that other work shares,
  the CPU seconds are the steadier measure of the work, the wall time of the parallel speed-up;
- memory per rank with 2 ranks at once, each holding its training data as it would during
  training: current (the text and the lists), prepared (the maps, the text dropped), datasets
  (the Arrow cache file, memory-mapped). RSS counts pages of a mapped file that the other rank
  shares; PSS splits them between the ranks and USS leaves them out.

    .venv/bin/python bench/data_scale.py                       # 1M pairs
    .venv/bin/python bench/data_scale.py --pairs 4000000 --skip-current
    .venv/bin/python bench/data_scale.py --first-start --pairs 4000000 --output bench/results/first_start_4m.json

--first-start measures instead a whole first start from the files (bench/first_start.py: `rosetta
train` on one process up to its first epoch's plan, and the stage job's `rosetta prepare`), with
the example's settings and every data check on, against the same `datasets.map`, on a corpus whose
copies of Multi30k are told apart by a number word so that the duplicate filter keeps every pair.

Prints a JSON summary and writes it to --output (default bench/results/data_scale.json). Needs
psutil and datasets (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "trainer"), str(REPO / "contract"), str(REPO / "operator")]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
MAX_LENGTH = 128
VOCAB = 8000

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def _memory() -> dict:
    import psutil

    info = psutil.Process().memory_full_info()
    return {"rss_mib": _mib(info.rss), "pss_mib": _mib(info.pss), "uss_mib": _mib(info.uss),
            "peak_rss_mib": _mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (worker pools): the work done,
    which a busy machine slows less than the wall time."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _read(work: Path) -> tuple[list[str], list[str]]:
    return ((work / "train.en").read_text().splitlines(), (work / "train.de").read_text().splitlines())


def _tokenizer(work: Path):
    from rosetta_trainer.models.tokenization import load_tokenizer

    return load_tokenizer(work / "tokenizer")


# Each job runs in its own process and returns a dict of figures.

def job_current(work: Path, workers: int) -> dict:
    from rosetta_trainer.data.batching import encode

    tokenizer = _tokenizer(work)
    sources, targets = _read(work)
    before = _memory()
    started, cpu = time.perf_counter(), _cpu()
    corpus = encode(tokenizer, sources, targets, MAX_LENGTH, MAX_LENGTH)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    after = _memory()
    corpus.lengths()
    return {"seconds": seconds, "cpu_seconds": cpu, "ids_rss_mib": round(after["rss_mib"] - before["rss_mib"], 1),
            **after}


def _data_spec(work: Path):
    from rosetta_contract.data_fields import DataSpec

    # The corpus is Multi30k repeated: with the duplicate filter on, a start would keep 29k pairs.
    return DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "checks": {"dropDuplicates": False},
                                    "train": [{"format": "pairs", "source": str(work / "train.en"),
                                               "target": str(work / "train.de")}]})


class _Pairs:
    """Text already read, as shards.prepare_corpus takes it (iterable again, with a report)."""

    def __init__(self, sources: list[str], targets: list[str]):
        self.sources, self.targets = sources, targets

    def __iter__(self):
        return zip(self.sources, self.targets)

    def report(self) -> dict:
        return {"read": len(self.sources), "kept": len(self.sources)}


def _alone():
    import torch

    from rosetta_trainer.runtime.distributed import World

    return World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), local_size=1)


def job_prepare(work: Path, workers: int) -> dict:
    """`rosetta prepare`'s part after reading, from text in memory as datasets.map is given it:
    hashing, tokenizing and writing in one pass (with the data files' identity, as the trainer
    records it for its restarts)."""
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_identity import data_identity

    tokenizer = _tokenizer(work)
    text = _Pairs(*_read(work))
    started, cpu = time.perf_counter(), _cpu()
    corpus, _ = shards.prepare_corpus(work / "prepared", tokenizer, text, MAX_LENGTH, MAX_LENGTH, _alone(),
                                      workers=workers, identity=data_identity(_data_spec(work), use_prefix=False))
    done = time.perf_counter()
    size = sum(p.stat().st_size for p in corpus.path.iterdir())
    return {"seconds": done - started, "cpu_seconds": _cpu() - cpu,
            "tokens": corpus.meta["tokens"]["source"] + corpus.meta["tokens"]["target"], "dtype": corpus.meta["dtype"],
            "disk_mib": _mib(size), **_memory()}


def job_prepare_files(work: Path, workers: int) -> dict:
    """`rosetta prepare` from the data files, what a first start's writing rank does: reading,
    checking, hashing, tokenizing and writing in one pass with the text streaming through. Its
    peak memory is the point: it must not grow with the corpus."""
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_checks import read_checked

    tokenizer = _tokenizer(work)
    before = _memory()
    started, cpu = time.perf_counter(), _cpu()
    data = read_checked(_data_spec(work), read_train=False)
    _, report = shards.prepare_corpus(work / "prepared-files", tokenizer, data.training_text.pairs(False),
                                           MAX_LENGTH, MAX_LENGTH, _alone(), workers=workers)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": _cpu() - cpu, "pairs": report["kept"],
            **_with_baseline(before, _memory())}


def job_startup(work: Path, workers: int) -> dict:
    """A start that has read the text (a first start, or changed files): key it, map it."""
    from rosetta_trainer.data.batching import plan_epoch
    from rosetta_trainer.preparation import shards

    tokenizer = _tokenizer(work)
    text = _Pairs(*_read(work))
    started = time.perf_counter()
    corpus, _ = shards.prepare_corpus(work / "prepared", tokenizer, text, MAX_LENGTH, MAX_LENGTH, _alone())
    lengths = corpus.lengths()
    ready = time.perf_counter()
    plan_epoch(*lengths, seed=1, epoch=0, max_tokens=8192)
    planned = time.perf_counter()
    return {"seconds": ready - started, "plan_seconds": planned - ready, **_memory()}


def job_restart(work: Path, workers: int) -> dict:
    """A restart with unchanged data files: their identity finds the directory; no text is read
    (read_text of the files is what the other start-ups pay before they begin)."""
    from rosetta_trainer.preparation import shards
    from rosetta_trainer.preparation.data_identity import data_identity

    tokenizer = _tokenizer(work)
    before = _memory()
    started = time.perf_counter()
    found = shards.find_prepared(work / "prepared", data_identity(_data_spec(work), use_prefix=False), tokenizer,
                                 MAX_LENGTH, MAX_LENGTH, _alone())
    if found is None:
        raise RuntimeError("the prepared directory was not found by its data files' identity")
    found[0].lengths()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, **_with_baseline(before, _memory())}


def _hf_map(work: Path, workers: int):
    import datasets
    from datasets import Dataset

    datasets.disable_progress_bars()

    tokenizer = _tokenizer(work)
    sources, targets = _read(work)

    def tokenize(batch):
        enc = tokenizer(batch["source"], truncation=True, max_length=MAX_LENGTH)
        enc["labels"] = tokenizer(text_target=batch["target"], truncation=True, max_length=MAX_LENGTH)["input_ids"]
        return enc

    raw = Dataset.from_dict({"source": sources, "target": targets})
    del sources, targets
    started, cpu = time.perf_counter(), _cpu()
    ds = raw.map(tokenize, batched=True, num_proc=workers, remove_columns=["source", "target"],
                 cache_file_name=str(work / "hf" / "tokenized.arrow"), desc=None)
    return ds, time.perf_counter() - started, _cpu() - cpu


def job_datasets(work: Path, workers: int) -> dict:
    (work / "hf").mkdir(exist_ok=True)
    ds, seconds, cpu = _hf_map(work, workers)
    # With num_proc the cache is one file per process.
    (work / "hf" / "files.json").write_text(json.dumps([f["filename"] for f in ds.cache_files]))
    size = sum(Path(f["filename"]).stat().st_size for f in ds.cache_files)
    return {"seconds": seconds, "cpu_seconds": cpu, "rows": len(ds), "disk_mib": _mib(size), **_memory()}


def job_datasets_cached(work: Path, workers: int) -> dict:
    ds, seconds, _ = _hf_map(work, workers)  # the same map: datasets finds its cache files
    return {"seconds": seconds, "rows": len(ds), **_memory()}


# Memory with two ranks at once.

def _with_baseline(before: dict, after: dict) -> dict:
    """`after`, plus what the training data added to the process (after - before)."""
    return {**after, "baseline_rss_mib": before["rss_mib"], "data_peak_rss_mib": round(after["peak_rss_mib"] - before["rss_mib"], 1),
            **{f"data_{k}": round(after[k] - before[k], 1) for k in ("rss_mib", "pss_mib", "uss_mib")}}


def rank_current(work: Path, barrier) -> dict:
    from rosetta_trainer.data.batching import encode

    tokenizer = _tokenizer(work)
    before = _memory()
    sources, targets = _read(work)
    corpus = encode(tokenizer, sources, targets, MAX_LENGTH, MAX_LENGTH)
    corpus.lengths()
    barrier.wait()
    return _with_baseline(before, _memory())


def rank_prepared(work: Path, barrier) -> dict:
    from rosetta_trainer.preparation import shards

    tokenizer = _tokenizer(work)
    before = _memory()
    text = _Pairs(*_read(work))
    corpus, _ = shards.prepare_corpus(work / "prepared", tokenizer, text, MAX_LENGTH, MAX_LENGTH, _alone())
    del text  # as the trainer does once the ids are mapped
    corpus.lengths()
    int(corpus.sources.ids.sum()) + int(corpus.targets.ids.sum())  # every page read once, as an epoch does
    barrier.wait()
    return _with_baseline(before, _memory())


def rank_datasets(work: Path, barrier) -> dict:
    import pyarrow.compute as pc
    from datasets import Dataset, concatenate_datasets

    _tokenizer(work)  # a Seq2SeqTrainer rank loads it too
    before = _memory()
    files = json.loads((work / "hf" / "files.json").read_text())
    ds = concatenate_datasets([Dataset.from_file(f) for f in files])
    for column in ("input_ids", "labels"):
        for chunk in ds.data.table.column(column).chunks:
            pc.sum(pc.list_flatten(chunk))
    barrier.wait()
    return _with_baseline(before, _memory())


def _child(fn, args, queue):
    try:
        queue.put(fn(*args))
    except BaseException as exc:
        queue.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def write_result(result: dict, output: str | Path) -> None:
    """The run's figures on stdout and as JSON at `output` (bench/results/...)."""
    text = json.dumps(result, indent=2)
    print(text)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text + "\n")


def run_spawned(label: str, fn, args: tuple) -> dict:
    """fn(*args)'s figures, measured in a spawned process: a forked child would inherit the parent's
    peak RSS. Printed on stderr as `label: {...}`."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, args, queue))
    p.start()
    out = queue.get(timeout=3600)
    p.join()
    if p.exitcode or "error" in out:
        raise RuntimeError(f"{label} failed: {out.get('error')}")
    print(f"{label}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def run_alone(name: str, work: Path, workers: int) -> dict:
    return run_spawned(name, globals()[f"job_{name}"], (work, workers))


def run_two_ranks(name: str, work: Path) -> list[dict]:
    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(2)
    started = time.perf_counter()
    procs = [ctx.Process(target=_child, args=(globals()[f"rank_{name}"], (work, barrier), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    for o in out:
        o["wall_seconds"] = round(time.perf_counter() - started, 2)
    print(f"2 ranks {name}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def make_corpus(work: Path, pairs: int, distinct: bool = False) -> int:
    from tokenizer_sample import make_corpus as make_distinct

    from rosetta_contract.model_fields import TokenizerTraining
    from rosetta_trainer.models.tokenization import train_tokenizer

    en = gzip.open(MULTI30K / "train.en.gz", "rt").read().splitlines()
    de = gzip.open(MULTI30K / "train.de.gz", "rt").read().splitlines()
    if distinct:
        make_distinct(work, pairs)
    else:
        for lang, lines in (("en", en), ("de", de)):
            with open(work / f"train.{lang}", "w") as fh:
                for i in range(pairs):
                    fh.write(lines[i % len(lines)] + "\n")
    train_tokenizer(TokenizerTraining(type="unigram", vocab_size=VOCAB), list(zip(en, de)), work / "tokenizer")
    return len(en)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="tokenizing processes of `rosetta prepare` and of datasets.map (default: every core)")
    parser.add_argument("--skip-current", action="store_true", help="leave out the in-memory lists (slow at 4M+)")
    parser.add_argument("--first-start", action="store_true",
                        help="a whole first start from the files (train and prepare) against datasets.map")
    parser.add_argument("--workdir", help="keep the corpus and outputs here (default: a temporary directory)")
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "data_scale.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rosetta-data-scale-", dir=args.workdir) as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        # In a child, like every measurement: a spawned process inherits its parent's peak RSS.
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        maker = ctx.Process(target=_child, args=(make_corpus, (work, args.pairs, args.first_start), queue))
        maker.start()
        base = queue.get(timeout=3600)
        maker.join()
        result = {
            "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()}-core CPU, {platform.machine()}",
            "pairs": args.pairs, "corpus": f"Multi30k train en-de ({base} pairs) repeated", "workers": args.workers,
            "tokenizer": f"unigram {VOCAB}", "max_length": MAX_LENGTH,
            "corpus_mib": _mib(sum((work / f"train.{lang}").stat().st_size for lang in ("en", "de"))),
            "setup_seconds": round(time.perf_counter() - started, 1),
            "load_average_at_start": os.getloadavg()[0],
        }
        if args.first_start:
            result["corpus"] += ", each copy prefixed with its number word"
            from first_start import against_datasets

            result.update(against_datasets(work, args.pairs, args.workers))
            result["wall_seconds"] = round(time.perf_counter() - started, 1)
            result["load_average_at_end"] = os.getloadavg()[0]
            write_result(result, args.output)
            return 0
        runs = {}
        if not args.skip_current:
            runs["current"] = run_alone("current", work, args.workers)
        runs["prepare"] = run_alone("prepare", work, args.workers)
        runs["prepare_files"] = run_alone("prepare_files", work, args.workers)
        runs["startup_prepared"] = run_alone("startup", work, args.workers)
        runs["restart_prepared"] = run_alone("restart", work, args.workers)
        runs["datasets_map"] = run_alone("datasets", work, args.workers)
        runs["datasets_cached"] = run_alone("datasets_cached", work, args.workers)
        result["runs"] = runs
        ranks = {}
        if not args.skip_current:
            ranks["current"] = run_two_ranks("current", work)
        ranks["prepared"] = run_two_ranks("prepared", work)
        ranks["datasets"] = run_two_ranks("datasets", work)
        result["two_ranks"] = ranks

        tokens = runs["prepare"]["tokens"]
        ratios = {
            "prepare_pairs_per_s": round(args.pairs / runs["prepare"]["seconds"]),
            "prepare_tokens_per_s": round(tokens / runs["prepare"]["seconds"]),
            "datasets_pairs_per_s": round(args.pairs / runs["datasets_map"]["seconds"]),
            "prepare_vs_datasets_map_cpu": round(runs["datasets_map"]["cpu_seconds"] / runs["prepare"]["cpu_seconds"], 2),
            "prepare_vs_datasets_map": round(runs["datasets_map"]["seconds"] / runs["prepare"]["seconds"], 2),
            "startup_vs_datasets_cached": round(runs["datasets_cached"]["seconds"]
                                                / runs["startup_prepared"]["seconds"], 2),
            "restart_vs_datasets_cached": round(runs["datasets_cached"]["seconds"]
                                                / runs["restart_prepared"]["seconds"], 2),
        }
        if "current" in runs:
            ratios["current_pairs_per_s"] = round(args.pairs / runs["current"]["seconds"])
            ratios["prepare_vs_current"] = round(runs["current"]["seconds"] / runs["prepare"]["seconds"], 2)
            ratios["prepare_vs_current_cpu"] = round(runs["current"]["cpu_seconds"] / runs["prepare"]["cpu_seconds"], 2)
            ratios["startup_vs_current"] = round(runs["current"]["seconds"] / runs["startup_prepared"]["seconds"], 2)
            ratios["rank_data_uss_current_vs_prepared"] = round(
                ranks["current"][0]["data_uss_mib"] / max(ranks["prepared"][0]["data_uss_mib"], 1), 2)
        result["ratios"] = ratios
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        result["load_average_at_end"] = os.getloadavg()[0]
    write_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
