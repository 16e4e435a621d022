"""Rosetta against Hugging Face's Seq2SeqTrainer: the same training, alternated, side by side.

    make bench                                           # the defaults below, about 15 min on 2 cores
    .venv/bin/python bench/hf_seq2seq.py --steps 300 --repeats 2 --model-size small
    .venv/bin/python bench/hf_seq2seq.py --device cuda --bf16 --steps 2000 --batch 256

Both runs get one YAML file (written here) and so the same data (Multi30k EN->DE from
--data when its files are there, else the generated corpus), the same tokenizer directory
(trained once here), the same initial weights (built once here and saved with
save_pretrained), learning rate, warm-up, schedule, label smoothing, batch of N sentences,
steps, seed and precision. Rosetta trains with `python -m rosetta_trainer train`, the peer
with bench/hf_peer.py. Runs alternate (Rosetta, peer, Rosetta, peer, ...), each in a fresh
process, so that a machine that slows down over time penalises both alike.

Reported per system (median over repeats) and as Rosetta/peer ratios:
- throughput: non-pad target tokens per second of training, steps after --skip-steps only;
- time to BLEU: training seconds (validation passes excluded) until the first validation
  BLEU >= --bleu; both are scored by rosetta_trainer.evaluation.evaluate (greedy, same sacreBLEU);
- peak RSS of the run's main process and of its whole process tree (sampled with psutil).

Results go to --results (JSON and a markdown table); run directories to --work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
PEER = Path(__file__).resolve().parent / "hf_peer.py"
SYSTEMS = ("rosetta", "peer")
MULTI30K_FILES = ("train.en.gz", "train.de.gz", "val.en.gz", "val.de.gz")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--repeats", type=int, default=2, help="runs per system, alternated (default 2)")
    p.add_argument("--architecture", default="transformer", choices=["transformer", "t5"],
                   help="from-scratch architecture (default transformer: Marian's; t5: T5's relative attention)")
    p.add_argument("--model-size", default="small", choices=["tiny", "small", "base", "big"],
                   help="preset of rosetta_trainer.models.models (default small; transformer small: 256 dims, 3+3 layers; "
                        "t5 small: t5-small's shape)")
    p.add_argument("--compile", default="none",
                   choices=["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="training.compile for Rosetta; the peer compiles its model in the same mode (default none)")
    p.add_argument("--batch", type=int, default=64, help="sentence pairs per batch (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default steps/10)")
    p.add_argument("--schedule", default="linear", choices=["linear", "cosine", "constant", "noam"],
                   help="noam: inverse square root after the warm-up (the peer's inverse_sqrt); default linear")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--vocab", type=int, default=8000, help="Unigram vocabulary size (default 8000)")
    p.add_argument("--eval-interval", type=int, default=100, help="steps between validations (default 100)")
    p.add_argument("--eval-samples", type=int, default=300, help="validation sentences (default 300)")
    p.add_argument("--bleu", type=float, default=None,
                   help="BLEU threshold for time-to-BLEU (default: 10 on Multi30k, 50 on the generated corpus)")
    p.add_argument("--skip-steps", type=int, default=50,
                   help="warm-up steps left out of the throughput (default 50)")
    p.add_argument("--log-interval", type=int, default=10, help="Rosetta's logInterval (default 10)")
    p.add_argument("--train-limit", type=int, default=None, help="use at most this many training pairs")
    p.add_argument("--seed", type=int, default=1,
                   help="initial weights' seed, and the training seed of the first repeat (default 1)")
    p.add_argument("--same-seed", action="store_true",
                   help="train every repeat with --seed; by default repeat k uses --seed + k - 1 (data order "
                        "and dropout), so that the repeats show how much BLEU moves with the data order")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in both (default fp32)")
    p.add_argument("--rosetta-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for Rosetta's processes, e.g. ROSETTA_CPU_ALLOCATOR=keep (repeatable)")
    p.add_argument("--peer-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the peer's processes, e.g. MALLOC_MMAP_MAX_=0 and "
                        "MALLOC_TRIM_THRESHOLD_=2147483647, glibc's spelling of what ROSETTA_CPU_ALLOCATOR=keep "
                        "sets (repeatable)")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k",
                   help="Multi30k directory with {train,val}.{en,de}.gz (default ../shared/data/multi30k)")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench-hf", help="run directories")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results", help="JSON and markdown output")
    args = p.parse_args(argv)
    args.warmup = args.steps // 10 if args.warmup is None else args.warmup
    if any("=" not in item for item in [*args.peer_env, *args.rosetta_env]):
        p.error("--peer-env and --rosetta-env take KEY=VALUE")
    args.env = {"rosetta": dict(item.split("=", 1) for item in args.rosetta_env),
                "peer": dict(item.split("=", 1) for item in args.peer_env)}
    if args.eval_interval % args.log_interval or args.skip_steps % args.log_interval:
        p.error("--eval-interval and --skip-steps must be multiples of --log-interval")
    if args.skip_steps >= args.steps:
        p.error("--skip-steps must be below --steps")
    return args


# ------------------------------------------------------------------ set-up


def data_section(args) -> tuple[dict, str]:
    if all((args.data / name).is_file() for name in MULTI30K_FILES):
        d = args.data.resolve()
        train = {"format": "pairs", "source": str(d / "train.en.gz"), "target": str(d / "train.de.gz")}
        val = {"format": "pairs", "source": str(d / "val.en.gz"), "target": str(d / "val.de.gz")}
        name = "Multi30k EN->DE"
    else:
        train = {"format": "generated", "size": 20000, "seed": 1}
        val = {"format": "generated", "size": args.eval_samples, "seed": 2}
        name = "generated EN->DE numbers corpus"
    if args.train_limit:
        train["limit"] = args.train_limit
    return {"sourceLang": "en", "targetLangs": ["de"], "train": [train], "validation": [val],
            "maxSourceLength": 96, "maxTargetLength": 96}, name


def prepare(args, work: Path) -> tuple[Path, str]:
    """Tokenizer and initial weights, built once; the YAML both systems read."""
    import torch

    from rosetta_contract.data_fields import DataSpec
    from rosetta_contract.model_fields import ModelSpec, TokenizerTraining
    from rosetta_trainer.data.reader import read_split
    from rosetta_trainer.models.models import build_model, count_parameters
    from rosetta_trainer.models.tokenization import train_tokenizer

    data, data_name = data_section(args)
    examples = read_split(DataSpec.model_validate(data), "train")
    tokenizer = train_tokenizer(TokenizerTraining(type="unigram", vocab_size=args.vocab),
                                [*(e.source for e in examples), *(e.target for e in examples)], work / "tokenizer")
    torch.manual_seed(args.seed)
    model = build_model(ModelSpec(architecture=args.architecture, size=args.model_size, dropout=args.dropout),
                        vocab_size=len(tokenizer), max_length=96)
    model.save_pretrained(str(work / "init-model"))
    tokenizer.save_pretrained(str(work / "init-model"))
    print(f"data: {data_name}, {len(examples)} training pairs; vocabulary {len(tokenizer)}; "
          f"model {count_parameters(model) / 1e6:.1f}M parameters", flush=True)

    document = {
        "apiVersion": "rosetta.dev/v1alpha1",
        "kind": "TranslationTraining",
        "metadata": {"name": "bench-hf-seq2seq"},
        "spec": {
            # A CUDA run is a one-GPU node to the spec's rules, as on the cluster.
            **({"gpusPerNode": 1} if args.device == "cuda" else {}),
            "model": {"name": str((work / "init-model").resolve())},
            "tokenizer": {"path": str((work / "tokenizer").resolve())},
            "data": data,
            "training": {
                "maxSteps": args.steps, "batch": {"sentences": args.batch}, "learningRate": args.lr,
                "schedule": args.schedule, "warmupSteps": args.warmup, "labelSmoothing": args.label_smoothing,
                "precision": "bf16" if args.bf16 else "fp32", "seed": args.seed,
                "logInterval": args.log_interval, "device": args.device, "compile": args.compile,
            },
            # Only the last step is saved (the peer saves nothing; one save is outside the timing).
            "checkpoint": {"interval": args.steps, "keep": 1, "keepBest": False},
            "evaluation": {"interval": args.eval_interval, "beams": 1, "maxSamples": args.eval_samples,
                           "batchSentences": 64, "maxNewTokens": 128, "metrics": ["bleu"], "atEnd": False},
            "metrics": {"port": 0, "tensorboard": False},
        },
    }
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, data_name


# ------------------------------------------------------------------ running


def run_process(cmd: list[str], log_path: Path, extra_env: dict | None = None) -> dict:
    """Run one training process; sample the RSS of it and its children every 0.2 s."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        peak = {"main": 0, "tree": 0}
        done = threading.Event()

        def sample():
            try:
                root = psutil.Process(proc.pid)
            except psutil.NoSuchProcess:
                return
            while not done.is_set():
                try:
                    main = root.memory_info().rss
                    tree = main
                    for child in root.children(recursive=True):
                        try:
                            tree += child.memory_info().rss
                        except psutil.NoSuchProcess:
                            pass
                except psutil.NoSuchProcess:
                    return
                peak["main"], peak["tree"] = max(peak["main"], main), max(peak["tree"], tree)
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    if rc:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}; log {log_path}:\n{tail}")
    return {"wall_seconds": time.perf_counter() - started, "peak_rss_main_bytes": peak["main"],
            "peak_rss_tree_bytes": peak["tree"]}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rosetta_timeline(out: Path) -> tuple[list[tuple[int, int, float, float]], list[dict]]:
    """(first step, last step, target tokens, training seconds) per logged window, and evals.

    Rosetta restarts its window clock right after logging, so a validation run at a log step
    lands in the next window; its own duration (eval.jsonl "seconds") is taken out there.
    """
    evals = [e for e in read_jsonl(out / "eval.jsonl") if e.get("split") == "validation"]
    windows, previous = [], 0
    for record in read_jsonl(out / "metrics.jsonl"):
        steps = record["step"] - previous
        seconds = record["step_time_s"] * steps
        tokens = record["target_tokens_per_s"] * seconds
        seconds -= sum(e["seconds"] for e in evals if previous <= e["step"] < record["step"])
        windows.append((previous + 1, record["step"], tokens, seconds))
        previous = record["step"]
    elapsed, at_step = 0.0, {}
    for _first, last, _, seconds in windows:
        elapsed += seconds
        at_step[last] = elapsed
    for e in evals:
        e["train_seconds"] = at_step.get(e["step"])
    return windows, evals


def peer_timeline(out: Path) -> tuple[list[tuple[int, int, float, float]], list[dict]]:
    steps = [(r["step"], r["step"], float(r["target_tokens"]), r["seconds"]) for r in read_jsonl(out / "metrics.jsonl")]
    return steps, read_jsonl(out / "eval.jsonl")


LATE_STEPS = 100


def late_loss(losses: list[tuple[int, float]], steps: int) -> float | None:
    """Mean training loss over the logged windows of the last LATE_STEPS steps.

    One logged window is a poor reading: the Trainer's length-grouped sampler walks each
    megabatch of 50 batches from the longest sentences to the shortest, so a window's loss
    depends on where in that walk it falls (its log steps, multiples of 10 and 50, always land
    at the short end). Over 100 steps both systems see every length.
    """
    late = [loss for step, loss in losses if step > steps - LATE_STEPS]
    return sum(late) / len(late) if late else None


def measure(system: str, out: Path, process: dict, args) -> dict:
    windows, evals = (rosetta_timeline if system == "rosetta" else peer_timeline)(out)
    kept = [w for w in windows if w[0] > args.skip_steps]
    tokens, seconds = sum(w[2] for w in kept), sum(w[3] for w in kept)
    reached = next((e for e in evals if e["bleu"] >= args.bleu), None)
    summary = json.loads((out / "summary.json").read_text())
    if system == "rosetta":
        records = read_jsonl(out / "metrics.jsonl")
        gpu = max((r.get("gpu_memory_bytes") or 0 for r in records), default=0) or None
        losses = [(r["step"], r["loss"]) for r in records]
    else:
        gpu = summary.get("gpu_memory_bytes")
        losses = [tuple(pair) for pair in summary.get("losses", [])]
    return {
        "system": system,
        "target_tokens_per_s": tokens / seconds if seconds else None,
        "measured_steps": f"{kept[0][0]}-{kept[-1][1]}" if kept else None,
        "train_seconds": sum(w[3] for w in windows),
        "bleu_threshold": args.bleu,
        "seconds_to_bleu": reached["train_seconds"] if reached else None,
        "steps_to_bleu": reached["step"] if reached else None,
        "validation": [{"step": e["step"], "bleu": round(e["bleu"], 2), "train_seconds": round(e["train_seconds"], 1),
                        "eval_seconds": e.get("seconds")} for e in evals],
        "final_bleu": evals[-1]["bleu"] if evals else None,
        "final_loss": late_loss(losses, args.steps),
        "gpu_memory_bytes": gpu,
        **process,
    }


# ------------------------------------------------------------------ report


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs: list[dict], args) -> dict:
    by = {s: [r for r in runs if r["system"] == s] for s in SYSTEMS}
    keys = ("target_tokens_per_s", "seconds_to_bleu", "steps_to_bleu", "final_bleu", "final_loss",
            "peak_rss_main_bytes", "peak_rss_tree_bytes", "gpu_memory_bytes", "wall_seconds", "train_seconds")
    med = {s: {k: median([r[k] for r in by[s]]) for k in keys} for s in SYSTEMS}
    for s in SYSTEMS:
        med[s]["reached_bleu"] = f"{sum(r['seconds_to_bleu'] is not None for r in by[s])}/{len(by[s])}"

    def ratio(key):
        a, b = med["rosetta"][key], med["peer"][key]
        return a / b if a is not None and b else None

    return {"median": med, "ratios": {
        "throughput": ratio("target_tokens_per_s"),  # higher is better for Rosetta
        "time_to_bleu_speedup": (med["peer"]["seconds_to_bleu"] / med["rosetta"]["seconds_to_bleu"]
                                 if med["rosetta"]["seconds_to_bleu"] and med["peer"]["seconds_to_bleu"] else None),
        "peak_rss_main": ratio("peak_rss_main_bytes"),
        "peak_rss_tree": ratio("peak_rss_tree_bytes"),
        "gpu_memory": ratio("gpu_memory_bytes"),
        "wall": ratio("wall_seconds"),
    }}


def fmt(value, spec=",.0f", suffix=""):
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown(result: dict) -> str:
    med, ratios, args = result["summary"]["median"], result["summary"]["ratios"], result["args"]
    r, p = med["rosetta"], med["peer"]
    mib = 2**20
    rows = [
        ("target tokens/s (steps after %d)" % args["skip_steps"], fmt(r["target_tokens_per_s"]),
         fmt(p["target_tokens_per_s"]), fmt(ratios["throughput"], ".2f", "x")),
        (f"training s to validation BLEU ≥ {args['bleu']:g}",
         f"{fmt(r['seconds_to_bleu'], '.0f')} (step {fmt(r['steps_to_bleu'], '.0f')}, {r['reached_bleu']} runs)",
         f"{fmt(p['seconds_to_bleu'], '.0f')} (step {fmt(p['steps_to_bleu'], '.0f')}, {p['reached_bleu']} runs)",
         fmt(ratios["time_to_bleu_speedup"], ".2f", "x faster")),
        (f"validation BLEU at step {args['steps']}", fmt(r["final_bleu"], ".2f"), fmt(p["final_bleu"], ".2f"), ""),
        (f"training loss, mean of the last {LATE_STEPS} steps", fmt(r["final_loss"], ".3f"),
         fmt(p["final_loss"], ".3f"), ""),
        ("peak RSS, main process (MiB)", fmt(r["peak_rss_main_bytes"] and r["peak_rss_main_bytes"] / mib),
         fmt(p["peak_rss_main_bytes"] and p["peak_rss_main_bytes"] / mib), fmt(ratios["peak_rss_main"], ".2f", "x")),
        ("peak RSS, process tree (MiB)", fmt(r["peak_rss_tree_bytes"] and r["peak_rss_tree_bytes"] / mib),
         fmt(p["peak_rss_tree_bytes"] and p["peak_rss_tree_bytes"] / mib), fmt(ratios["peak_rss_tree"], ".2f", "x")),
    ]
    if r["gpu_memory_bytes"] or p["gpu_memory_bytes"]:
        rows.append(("peak GPU memory allocated (MiB)", fmt(r["gpu_memory_bytes"] and r["gpu_memory_bytes"] / mib),
                     fmt(p["gpu_memory_bytes"] and p["gpu_memory_bytes"] / mib), fmt(ratios["gpu_memory"], ".2f", "x")))
    rows.append(("process wall s (start-up, training, validation)", fmt(r["wall_seconds"]), fmt(p["wall_seconds"]),
                 fmt(ratios["wall"], ".2f", "x")))
    lines = [f"| median of {args['repeats']} runs each | Rosetta | Seq2SeqTrainer | Rosetta / peer |",
             "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines += ["", "| run | system | seed | target tokens/s | validation BLEU by step (training s) | peak RSS main / tree (MiB) | wall s |",
              "|---|---|---|---|---|---|---|"]
    for i, run in enumerate(result["runs"], 1):
        curve = ", ".join(f"{v['step']}: {v['bleu']:.1f} ({v['train_seconds']:.0f})" for v in run["validation"])
        lines.append(f"| {i} | {run['system']} | {run['seed']} | {fmt(run['target_tokens_per_s'])} | {curve} | "
                     f"{run['peak_rss_main_bytes'] / mib:,.0f} / {run['peak_rss_tree_bytes'] / mib:,.0f} | "
                     f"{run['wall_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def environment() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)  # a Rosetta run would resume from old checkpoints
    work.mkdir(parents=True)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible")
    config, data_name = prepare(args, work)
    if args.bleu is None:
        args.bleu = 10.0 if data_name.startswith("Multi30k") else 50.0

    runs = []
    document = yaml.safe_load(config.read_text())
    for repeat in range(1, args.repeats + 1):
        seed = args.seed if args.same_seed else args.seed + repeat - 1
        document["spec"]["training"]["seed"] = seed
        run_config = work / f"bench-seed{seed}.yaml"
        run_config.write_text(yaml.safe_dump(document, sort_keys=False))
        for system in SYSTEMS:
            out = work / f"{system}-{repeat}"
            if system == "rosetta":
                cmd = [sys.executable, "-m", "rosetta_trainer", "train", "-f", str(run_config), "--output", str(out),
                       "--no-progress"]
            else:
                cmd = [sys.executable, str(PEER), "--config", str(run_config), "--output", str(out)]
            print(f"[{repeat}/{args.repeats}] {system}: {' '.join(cmd)}", flush=True)
            out.mkdir(parents=True)
            run = measure(system, out, run_process(cmd, out / "stdout.log", args.env[system]), args)
            run["repeat"], run["seed"] = repeat, seed
            runs.append(run)
            print(f"    target tokens/s {fmt(run['target_tokens_per_s'])}, BLEU "
                  f"{[v['bleu'] for v in run['validation']]}, seconds to BLEU {args.bleu:g}: "
                  f"{fmt(run['seconds_to_bleu'], '.0f')}, peak RSS {run['peak_rss_main_bytes'] / 2**20:,.0f} MiB, "
                  f"wall {run['wall_seconds']:.0f} s", flush=True)

    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "data": data_name,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "env"},
        "environment": environment(),
        "runs": runs,
    }
    result["summary"] = aggregate(runs, args)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "hf-seq2seq.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (args.results / "hf-seq2seq.md").write_text(table)
    print("\n" + table, flush=True)
    print(f"results: {args.results / 'hf-seq2seq.json'}, {args.results / 'hf-seq2seq.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
