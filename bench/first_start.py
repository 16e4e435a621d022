"""A whole first start at scale: files to the first epoch's batch plan, for `rosetta train` on one
process and for the stage job's `rosetta prepare`, with examples/multi30k-en-de.yaml's settings
(a Unigram tokenizer of 8,000 pieces trained on the default sample, lengths up to 96, 6,000-token
batches, every data check on, the duplicate filter included).

The corpus is Multi30k's English → German training set repeated, each copy prefixed with its
number word (bench/tokenizer_sample.py) so that the duplicate filter keeps every pair and holds
a digest for each; validation and test are Multi30k's own sets. Each start runs in a fresh
process, with nothing prepared and no tokenizer yet:

- train: what a first `rosetta train` does before it builds the model, in its order
  (__main__.prepare_data, then the first epoch's plan): the validation and test sets read and
  checked, the tokenizer trained from the training text as it streams (read, checked,
  deduplicated), the text read again, tokenized by every core and written, the plan made. Each
  phase's seconds and the process's RSS sampled every 10 ms;
- prepare: the stage job's `rosetta prepare` (prepare_command.prepare_training), the same data
  stage without the plan.

Peak RSS added: the process's peak minus its RSS once it has imported the trainer (torch and
transformers) and read the spec. `data_scale.py --first-start` runs both against the `datasets`
peer; on its own:

    .venv/bin/python bench/first_start.py --multi30k    # the example on Multi30k and on ×10, ~3 min

With --pairs N, `rosetta train` itself runs the example on N number-word pairs with one optimizer
step, from the files to that step (its metrics line): the seconds a user waits on one process,
start-up and model included; its log's phase lines and the peak RSS of the command and its
tokenizing processes come with them:

    .venv/bin/python bench/first_start.py --pairs 16000000 --output bench/results/first_step_16m.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data_scale import MULTI30K, REPO, _alone, _cpu, _memory, _mib, run_alone, run_spawned, write_result
from first_start_phases import Sampler
from tokenizer_sample import make_corpus

EXAMPLE = REPO / "examples" / "multi30k-en-de.yaml"


def example_spec(work: Path, original: bool = False):
    """The example's spec, its training set `work`/train.{en,de} (or Multi30k's own files)."""
    from rosetta_contract.spec import load_for_trainer

    def pairs(source: Path, target: Path) -> str:
        return json.dumps([{"format": "pairs", "source": str(source), "target": str(target)}])

    train = (MULTI30K / "train.en.gz", MULTI30K / "train.de.gz") if original else (work / "train.en", work / "train.de")
    return load_for_trainer(EXAMPLE, overrides=[
        f"spec.data.train={pairs(*train)}",
        f"spec.data.validation={pairs(MULTI30K / 'val.en.gz', MULTI30K / 'val.de.gz')}",
        f"spec.data.test={pairs(MULTI30K / 'test_2016_flickr.en.gz', MULTI30K / 'test_2016_flickr.de.gz')}",
    ]).spec


HELD_OUT = "validation and test read and checked"
TOKENIZER = "tokenizer trained (text streamed: read, checked, deduplicated)"
PREPARE = "text tokenized and written (streamed again)"
PLAN = "batch plan of the first epoch"


def _imported() -> None:
    """What a start has imported before its data stage, so that both jobs share one baseline."""
    import transformers  # noqa: F401

    import rosetta_trainer.commands.prepare  # noqa: F401
    import rosetta_trainer.commands.train  # noqa: F401
    import rosetta_trainer.models.tokenization  # noqa: F401
    import rosetta_trainer.preparation.shards  # noqa: F401


def job_first_start(work: Path, workers: int, original: bool = False) -> dict:
    """`rosetta train`'s data stage on one process, phase by phase (prepare_data's steps)."""
    _imported()
    from rosetta_trainer.data.batching import batch_shapes, plan_epoch
    from rosetta_trainer.preparation.data_checks import read_checked
    from rosetta_trainer.preparation.data_identity import data_identity
    from rosetta_trainer.preparation.prepare_data import prepare_tokenizer
    from rosetta_trainer.preparation.shards import PREPARED_DIR, find_prepared, prepare_corpus

    spec = example_spec(work, original)
    d, b, output, world = spec.data, spec.training.batch, work / ("train-original" if original else "train"), _alone()
    sampler = Sampler()
    sampler.start()
    before = _memory()
    baseline, cpu = sampler.rss(), _cpu()

    enter, seconds = sampler.enter, sampler.seconds

    enter(HELD_OUT)
    identity = data_identity(d, use_prefix=spec.uses_task_prefix())
    data = read_checked(d, read_train=False)
    text = data.training_text.pairs(spec.uses_task_prefix())
    enter(TOKENIZER)
    tokenizer = prepare_tokenizer(spec, text, output, world, None, identity)
    enter(PREPARE)
    if find_prepared(output / PREPARED_DIR, identity, tokenizer, d.max_source_length, d.max_target_length, world):
        raise RuntimeError("a first start found prepared data")
    corpus, report = prepare_corpus(output / PREPARED_DIR, tokenizer, text, d.max_source_length,
                                    d.max_target_length, world, workers=workers, identity=identity)
    enter(PLAN)
    plan = plan_epoch(*corpus.lengths(), seed=spec.training.seed, epoch=0, max_tokens=b.tokens,
                      max_sentences=b.sentences, shapes=batch_shapes(spec))
    enter("end")
    total_cpu = _cpu() - cpu
    sampler.running = False
    sampler.join()
    after = _memory()
    return {"pairs": report["kept"], "read": report["read"], "batches": len(plan),
            "seconds": round(sum(seconds[p] for p in (HELD_OUT, TOKENIZER, PREPARE, PLAN)), 2),
            "cpu_seconds": round(total_cpu, 2), "baseline_rss_mib": before["rss_mib"],
            "peak_rss_mib": after["peak_rss_mib"],
            "added_peak_rss_mib": round(after["peak_rss_mib"] - before["rss_mib"], 1),
            "phases": [{"phase": p, "seconds": seconds[p], "peak_above_baseline_mib": _mib(sampler.peaks[p] - baseline)}
                       for p in (HELD_OUT, TOKENIZER, PREPARE, PLAN)]}


def job_stage_prepare(work: Path, workers: int) -> dict:
    """The stage job's `rosetta prepare`, as a whole."""
    _imported()
    from rosetta_trainer.commands.prepare import prepare_training

    spec = example_spec(work)
    before = _memory()
    started, cpu = time.perf_counter(), _cpu()
    corpus = prepare_training(spec, work / "stage", workers)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    after = _memory()
    return {"pairs": corpus.meta["pairs"], "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
            "baseline_rss_mib": before["rss_mib"], "peak_rss_mib": after["peak_rss_mib"],
            "added_peak_rss_mib": round(after["peak_rss_mib"] - before["rss_mib"], 1)}


def against_datasets(work: Path, pairs: int, workers: int) -> dict:
    """The whole first start of `rosetta train` (one process) and of `rosetta prepare`, and the
    peer's map of the same text, each in a fresh process (data_scale.py --first-start)."""
    runs = {"train": run_spawned("first start, rosetta train", job_first_start, (work, workers)),
            "prepare": run_spawned("first start, rosetta prepare", job_stage_prepare, (work, workers)),
            "datasets_map": run_alone("datasets", work, workers)}
    millions = pairs / 1e6
    return {"runs": runs, "ratios": {
        **{f"{name}_added_mib_per_million_pairs": round(runs[name]["added_peak_rss_mib"] / millions, 1)
           for name in ("train", "prepare")},
        "train_vs_datasets_map_peak_rss": round(runs["datasets_map"]["peak_rss_mib"] / runs["train"]["peak_rss_mib"], 2),
        "train_seconds_vs_datasets_map": round(runs["train"]["seconds"] / runs["datasets_map"]["seconds"], 2)}}


def multi30k_and_ten_times(work: Path, workers: int) -> dict:
    """The example's first start on Multi30k itself and on ×10 (number-word copies)."""
    corpus = run_spawned("corpus", make_corpus, (work, 290_000))
    original = run_spawned("first start, Multi30k", job_first_start, (work, workers, True))
    ten = run_spawned("first start, Multi30k x10", job_first_start, (work, workers))
    return {"corpus": corpus, "multi30k": original, "ten_times": ten,
            "ten_times_adds_mib": round(ten["added_peak_rss_mib"] - original["added_peak_rss_mib"], 1),
            "ten_times_adds_to_peak_rss_mib": round(ten["peak_rss_mib"] - original["peak_rss_mib"], 1)}


def first_step_of_rosetta_train(work: Path, pairs: int) -> dict:
    """`rosetta train` on `pairs` number-word pairs with the example's settings and one step: the
    seconds from the command's start to its first optimizer step's metrics line."""
    corpus = run_spawned("corpus", make_corpus, (work, pairs))

    def files(source: Path, target: Path) -> str:
        return json.dumps([{"format": "pairs", "source": str(source), "target": str(target)}])

    output = work / "run"
    command = [str(Path(sys.executable).parent / "rosetta"), "train", "-f", str(EXAMPLE), "-o", str(output),
               "--no-progress",
               "--set", f"spec.data.train={files(work / 'train.en', work / 'train.de')}",
               "--set", f"spec.data.validation={files(MULTI30K / 'val.en.gz', MULTI30K / 'val.de.gz')}",
               "--set", f"spec.data.test={files(MULTI30K / 'test_2016_flickr.en.gz', MULTI30K / 'test_2016_flickr.de.gz')}",
               "--set", "spec.training.maxSteps=1", "--set", "spec.training.logInterval=1",
               "--set", "spec.evaluation.atEnd=false", "--set", "spec.metrics.port=0"]
    log, metrics = work / "rosetta-train.log", output / "metrics.jsonl"
    started, first_step = time.perf_counter(), None
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        # wait4: the command's own resource use (its tokenizing processes included), not the corpus's.
        while not (waited := os.wait4(proc.pid, os.WNOHANG))[0]:
            if first_step is None and metrics.exists() and '"step"' in metrics.read_text():
                first_step = time.perf_counter() - started
            time.sleep(0.5)
    ended, (_, status, usage) = time.perf_counter() - started, waited
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"rosetta train failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    # A step logged within the last poll's half second: the exit bounds it.
    return {"pairs": pairs, "corpus": corpus, "seconds_to_first_step": round(first_step or ended, 1),
            "seconds_to_exit": round(ended, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "largest_peak_rss_of_a_process_mib": _mib(usage.ru_maxrss * 1024),
            "log": [line for line in log.read_text().splitlines() if " INFO " in line][:40]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--multi30k", action="store_true", help="the example on Multi30k and on ten copies")
    parser.add_argument("--pairs", type=int, help="`rosetta train` itself on this many pairs, to its first step")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--workdir", help="keep the corpus and outputs here (default: a temporary directory)")
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "first_start_multi30k.json"))
    args = parser.parse_args()
    if not args.multi30k and not args.pairs:
        parser.error("give --multi30k or --pairs (data_scale.py --first-start measures the large corpora)")
    with tempfile.TemporaryDirectory(prefix="rosetta-first-start-", dir=args.workdir) as tmp:
        started, load = time.perf_counter(), os.getloadavg()[0]
        figures = first_step_of_rosetta_train(Path(tmp), args.pairs) if args.pairs \
            else multi30k_and_ten_times(Path(tmp), args.workers)
        result = {"date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()}-core CPU, {platform.machine()}",
                  "config": str(EXAMPLE.relative_to(REPO)), "load_average_at_start": load, **figures,
                  "wall_seconds": round(time.perf_counter() - started, 1), "load_average_at_end": os.getloadavg()[0]}
    write_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
