"""DDP, DDP + torch.compile and DeepSpeed ZeRO-2/3 on one YAML: throughput, MFU and peak memory.

    .venv/bin/python bench/hf_seq2seq.py ... --work runs/bench-hf     # writes runs/bench-hf/bench.yaml
    .venv/bin/python bench/strategies.py --config runs/bench-hf/bench.yaml --steps 300

Each variant is the same document (model, tokenizer, data, batch, precision, seed) with only
`distributed` or `training.compile` changed, launched as the pod launches it: torchrun, one process
per device (`--nproc`), NCCL on CUDA and gloo on the CPU. Validation is off (one run at the last step
is outside the measured windows); the first --skip-steps are left out of the throughput, as are
compilation and DeepSpeed's set-up. MFU and peak device memory are the trainer's own figures
(metrics.jsonl: `mfu`, `gpu_memory_bytes`). Results go to --results as JSON and markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

VARIANTS = {
    "ddp": {"distributed": {"backend": "ddp"}},
    "ddp+compile": {"distributed": {"backend": "ddp"}, "compile": "default"},
    "ddp+cudagraphs": {"distributed": {"backend": "ddp"}, "compile": "reduce-overhead"},
    "zero2": {"distributed": {"backend": "deepspeed", "zeroStage": 2}},
    "zero3": {"distributed": {"backend": "deepspeed", "zeroStage": 3}},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, required=True, help="a TranslationTraining YAML (e.g. hf_seq2seq's)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per variant (default 300)")
    p.add_argument("--skip-steps", type=int, default=50, help="steps left out of the throughput (default 50)")
    p.add_argument("--nproc", type=int, default=1, help="processes (devices) per variant (default 1)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per variant before it is stopped")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench-strategies")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s) {', '.join(sorted(unknown))}; known: {', '.join(VARIANTS)}")
    if args.skip_steps >= args.steps:
        p.error("--skip-steps must be below --steps")
    return args


def variant_document(base: dict, name: str, steps: int) -> dict:
    document = json.loads(json.dumps(base))
    spec = document["spec"]
    change = VARIANTS[name]
    spec["distributed"] = change["distributed"]
    spec["training"]["compile"] = change.get("compile", "none")
    spec["training"]["maxSteps"] = steps
    spec["checkpoint"] = {"interval": steps, "keep": 1, "keepBest": False}
    spec["evaluation"] = {**spec.get("evaluation", {}), "interval": steps, "atEnd": False, "maxSamples": 50}
    spec["metrics"] = {**spec.get("metrics", {}), "port": 0, "tensorboard": False}
    return document


def measure(out: Path, skip_steps: int) -> dict:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    kept, previous = [], 0
    for record in records:
        if previous >= skip_steps:
            kept.append((record["step"] - previous, record))
        previous = record["step"]
    seconds = sum(steps * r["step_time_s"] for steps, r in kept)
    tokens = sum(steps * r["step_time_s"] * r["tokens_per_s"] for steps, r in kept)
    mfus = [r["mfu"] for _, r in kept if r.get("mfu") is not None]
    return {
        "tokens_per_s": tokens / seconds if seconds else None,
        "step_time_ms": 1000 * seconds / sum(steps for steps, _ in kept) if kept else None,
        "mfu": sum(mfus) / len(mfus) if mfus else None,
        "gpu_memory_bytes": max((r.get("gpu_memory_bytes") or 0 for r in records), default=0) or None,
        "final_loss": records[-1]["loss"] if records else None,
    }


def run_variant(name: str, base: dict, args) -> dict:
    out = args.work / name.replace("+", "-")
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(variant_document(base, name, args.steps), sort_keys=False))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "rosetta_trainer", "train", "-f", str(config), "--output", str(out / "run")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    with (out / "log.txt").open("w") as log:
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result = {"variant": name, "wall_seconds": time.perf_counter() - started, "exit": rc}
    if rc == 0:
        result.update(measure(out / "run", args.skip_steps))
    else:
        result["log_tail"] = (out / "log.txt").read_text(errors="replace")[-2000:]
    print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}), flush=True)
    return result


def markdown(results: list[dict], meta: dict) -> str:
    def fmt(value, spec):
        return "–" if value is None else format(value, spec)

    lines = [f"{meta['date']}, {meta['device']}, {meta['steps']} steps ({meta['skip_steps']} skipped), "
             f"{meta['nproc']} process(es)", "",
             "| variant | tokens/s | step ms | MFU | peak device memory (GiB) | loss at end | exit |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        memory = r.get("gpu_memory_bytes")
        lines.append(f"| {r['variant']} | {fmt(r.get('tokens_per_s'), ',.0f')} | {fmt(r.get('step_time_ms'), '.1f')} "
                     f"| {fmt(r.get('mfu'), '.1%')} | {fmt(memory / 2**30 if memory else None, '.2f')} "
                     f"| {fmt(r.get('final_loss'), '.3f')} | {r['exit']} |")
    return "\n".join(lines) + "\n"


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores (torch {torch.__version__})"


def main(argv=None) -> int:
    args = parse_args(argv)
    base = yaml.safe_load(args.config.read_text())
    results = [run_variant(name, base, args) for name in args.variants.split(",")]
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "device": device_name(),
            "steps": args.steps, "skip_steps": args.skip_steps, "nproc": args.nproc, "config": str(args.config)}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "strategies.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    table = markdown(results, meta)
    (args.results / "strategies.md").write_text(table)
    print(table)
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
