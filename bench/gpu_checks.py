"""The GPU table of docs/benchmarks.md in two commands: every figure the trainer's GPU claims rest on.

    bench/gpu_checks.sh --part 1 DATA_DIR RESULTS_DIR  # one CUDA GPU, at most 9 minutes
    bench/gpu_checks.sh --part 2 DATA_DIR RESULTS_DIR  # the same machine, at most 4.5 minutes
    bench/gpu_checks.sh --cpu DATA_DIR RESULTS_DIR    # every step at tiny sizes, on the CPU (CI runs it)

DATA_DIR holds Multi30k's {train,val,test_2016_flickr}.{en,de}.gz. Each step runs in a process of its
own under its own time limit, so a step that hangs or fails leaves the others' figures; each step's
figures are appended to RESULTS_DIR/gpu_checks.jsonl the moment it ends, and gpu_checks.md (the
table) is rewritten after every step.

  device             versions; the bf16 matrix-product rate (the practical ceiling of MFU)
  step-counts        ops, kernels (by name) and host-device syncs per step: eager, compiled, CUDA graphs,
                     Seq2SeqTrainer
  transformer-base   transformer-base at 256 pairs of Multi30k lengths: ms per step and MFU, eager /
                     compiled / CUDA graphs
  t5-base            t5-base bf16 at a batch that fills the GPU: the same three
  multi30k-bleu      the shipped recipe (examples/multi30k-en-de.yaml, bf16, CUDA graphs) trained for a
                     fixed time, then test_2016_flickr BLEU (beam 4)
  vs-peer            Rosetta vs Seq2SeqTrainer on one document (bench/hf_seq2seq.py): target tokens/s,
                     transformer-base (on the CPU also t5)
  strategies         DDP vs DeepSpeed ZeRO-2 on that document (bench/strategies.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def source_dirs() -> list[str]:
    """The folders that hold the repository's packages, read from pyproject's package-dir: a GPU
    machine's Python has none of them installed, so this script and every process it starts find
    them through these (an installed checkout finds them either way, which is how a missing one
    once passed the CPU rehearsal and failed on the GPU)."""
    with (REPO / "pyproject.toml").open("rb") as f:
        package_dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return sorted({str(REPO / Path(d).parent) for d in package_dirs.values()})


SOURCE_DIRS = source_dirs()
sys.path[:0] = SOURCE_DIRS

# name -> seconds allowed on a GPU; on the CPU (tiny sizes, but compilation is slow there) CPU_SCALE times.
# Sized from an H100 (2026-11-27), where 45-70 s stopped every compiled variant in its compilation:
# the first call of a compiled step takes tens of seconds there.
STEPS = {"device": 20, "step-counts": 90, "transformer-base": 100, "t5-base": 180, "multi30k-bleu": 150,
         "vs-peer": 150, "strategies": 120}
CPU_SCALE = 4
# A lent GPU gives about 15 minutes in all and 10 per command: two commands on the same machine, the
# step-time and MFU figures first (the reason the script exists), the comparisons second.
PARTS = {"1": "device,step-counts,transformer-base,t5-base,multi30k-bleu", "2": "vs-peer,strategies"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path, help="Multi30k directory")
    p.add_argument("results", type=Path)
    p.add_argument("--cpu", action="store_true", help="every step at tiny sizes on the CPU")
    p.add_argument("--only", default=",".join(STEPS), help="steps to run, comma-separated")
    p.add_argument("--part", choices=sorted(PARTS), help="the steps of one command on a GPU: "
                   + "; ".join(f"{k}: {v}" for k, v in PARTS.items()))
    p.add_argument("--work", type=Path, default=Path(os.environ.get("WORK", "/tmp/rosetta-gpu-checks")))
    p.add_argument("--step", help=argparse.SUPPRESS)  # a child process: run this one step
    args = p.parse_args(argv)
    if args.part:
        args.only = PARTS[args.part]
    unknown = set(args.only.split(",")) - set(STEPS)
    if unknown:
        p.error(f"unknown step(s) {', '.join(sorted(unknown))}; known: {', '.join(STEPS)}")
    return args


# ------------------------------------------------------------------ the driver


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.step:
        record = globals()["step_" + args.step.replace("-", "_")](args)
        print("RESULT " + json.dumps(record), flush=True)
        return 0
    args.results.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.results / "gpu_checks.jsonl"
    log.write_text("")  # this run's steps only
    failed = 0
    for name in args.only.split(","):
        limit = STEPS[name] * (CPU_SCALE if args.cpu else 1)
        print(f"\n== {name} (at most {limit} s, {time.strftime('%H:%M:%S')})", flush=True)
        record = run_step(name, args, limit)
        failed += record["status"] != "ok"
        with log.open("a") as out:
            out.write(json.dumps(record) + "\n")
        (args.results / "gpu_checks.md").write_text(markdown(read_records(log)))
        print(json.dumps(record)[:2000], flush=True)
    print("\n" + (args.results / "gpu_checks.md").read_text(), flush=True)
    return 1 if failed else 0


def run_step(name: str, args, limit: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), str(args.data), str(args.results), "--step", name,
           "--work", str(args.work)] + (["--cpu"] if args.cpu else [])
    started = time.perf_counter()
    log_path = args.work / f"{name}.log"
    env = child_environment()
    if args.cpu:
        # The rehearsal checks that every compiled path captures and runs; inductor's C++ kernels
        # would only add minutes of compilation (a GPU runs Triton's, which a CPU cannot rehearse).
        env["ROSETTA_COMPILE_BACKEND"] = "aot_eager"
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=limit, env=env)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            out = proc.stdout
        except subprocess.TimeoutExpired as exc:
            status, out = f"stopped at its {limit:.0f} s limit", exc.stdout or ""
            out = out.decode() if isinstance(out, bytes) else out
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    record = {"step": name, "status": status, "seconds": round(time.perf_counter() - started, 1),
              "date": time.strftime("%Y-%m-%d"), **(results[-1] if results else {})}
    if status != "ok":
        record["log_tail"] = log_path.read_text(errors="replace")[-1500:]
    return record


def child_environment() -> dict[str, str]:
    """A step's environment, which the processes it starts inherit: the sources first on PYTHONPATH."""
    path = os.pathsep.join(SOURCE_DIRS + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def markdown(records: list[dict]) -> str:
    lines = ["| step | figures | status | s |", "|---|---|---|---:|"]
    for r in records:
        figures = "; ".join(f"{k}: {v}" for k, v in r.get("table", {}).items()) or "–"
        lines.append(f"| {r['step']} | {figures} | {r['status']} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ steps (each in its own process)


def device_of(args):
    import torch

    if args.cpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device is visible (use --cpu for the CPU rehearsal)")
    return torch.device("cuda")


def step_device(args) -> dict:
    import torch
    import transformers

    device = device_of(args)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    try:
        import deepspeed

        versions["deepspeed"] = deepspeed.__version__
    except ImportError as exc:
        versions["deepspeed"] = f"missing ({exc})"
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    seconds = timed(lambda: a @ b, device, repeat=20)
    rate = 2 * n**3 / seconds
    return {"versions": versions, "matmul_flops": rate,
            "table": {"device": versions["device"], f"{dtype} {n}³ matmul": f"{rate / 1e12:.3g} TFLOP/s"}}


def step_step_counts(args) -> dict:
    out = args.work / "step-counts"
    cmd = [sys.executable, str(BENCH / "step_counts.py"), "--results", str(out)]
    if args.cpu:
        cmd += ["--model", "transformer-tiny", "--pairs", "8", "--modes", "none,default", "--steps", "1"]
    else:
        cmd += ["--model", "transformer-base", "--pairs", "256", "--modes", "none,default,reduce-overhead",
                "--device", "cuda"]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    rows = json.loads((out / "step_counts.json").read_text())["rows"]
    return {"rows": rows, "table": {r["variant"]: f"{r['kernels']:.0f} kernels, {r['syncs']:g} syncs" for r in rows}}


def timed(fn, device, repeat: int) -> float:
    """Seconds per call of fn: CUDA events on a GPU, the host clock on a CPU."""
    import torch

    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / repeat
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


def backend_steps(args, model: dict, vocab: int, batches, modes: list[str], warmup: int, repeat: int) -> dict:
    """ms per optimizer step and MFU of the real DDPBackend (forward_loss, backward, step) on the given
    (input_ids, attention_mask, labels) batches, cycled, per training.compile mode."""
    import numpy as np
    import torch
    import torch._dynamo

    from rosetta_contract.documents import parse_document
    from rosetta_trainer.engine.backends import build_backend
    from rosetta_trainer.models.models import build_model
    from rosetta_trainer.planning.flops import Seq2SeqDims, peak_flops, training_flops
    from rosetta_trainer.runtime.distributed import World

    device = device_of(args)
    world = World(rank=0, local_rank=0, size=1, device=device)
    precision = "bf16"
    results = {}
    for mode in modes:
        torch._dynamo.reset()
        doc = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "gpu"},
               "spec": {"model": model, "tokenizer": {"path": "/unused"},
                        **({"gpusPerNode": 1} if device.type == "cuda" else {}),
                        "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated"}],
                                 "maxSourceLength": 512, "maxTargetLength": 512},
                        "training": {"maxSteps": 1000, "batch": {"tokens": 65536}, "precision": precision,
                                     "compile": mode, "device": device.type, "warmupSteps": 100}}}
        spec = parse_document(doc).spec
        torch.manual_seed(0)
        net = build_model(spec.model, vocab, 512)
        backend = build_backend(spec, world, net, total_steps=1000)
        dims = Seq2SeqDims.from_hf_config(backend.module.config)
        on_device = [tuple(t.to(device) for t in b) for b in batches]
        flops = [training_flops(dims, (b[1] > 0).sum(1).cpu().numpy(), (b[2] != -100).sum(1).cpu().numpy())
                 for b in batches]
        cycle = {"i": 0}

        def step():
            ids, mask, labels = on_device[cycle["i"] % len(on_device)]
            cycle["i"] += 1
            loss, _ = backend.forward_loss(ids, mask, labels)
            backend.backward(loss, 1, True)
            backend.step()

        compiling = time.perf_counter()
        for _ in range(max(warmup, len(batches))):  # every shape once: compiled, and its kernels chosen
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        warm_seconds = time.perf_counter() - compiling
        cycle["i"] = 0
        seconds = timed(step, device, repeat)
        mean_flops = float(np.mean([flops[i % len(flops)] for i in range(repeat)]))
        peak = peak_flops(torch.cuda.get_device_name(), precision) if device.type == "cuda" else None
        results[mode] = {"ms_per_step": round(seconds * 1000, 2), "flops_per_step": mean_flops,
                         "mfu": round(mean_flops / seconds / peak, 4) if peak else None,
                         "warmup_seconds": round(warm_seconds, 1),
                         "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None}
        print(mode, results[mode], file=sys.stderr, flush=True)
        backend = net = None  # the next mode starts with the device's memory free
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return results


VOCAB = 32128  # t5's vocabulary; the transformer steps use Multi30k's 8,000
# The rehearsal's vocabulary. The loss is cut into chunks of vocabulary × token budget (logit_chunks) and a
# compiled step unrolls one copy of it per chunk: at 1,024 two (the loop still runs) instead of t5's 63,
# whose capture alone outran the step's time limit on a busy CPU.
CPU_VOCAB = 1024
# One layer a side: the capture's time grows with the layers traced, and a second layer runs no other code.
CPU_MODEL = {"size": "tiny", "encoderLayers": 1, "decoderLayers": 1}


def synthetic(rows: int, src: int, tgt: int, vocab: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, src), generator=g)
    return ids, torch.ones(rows, src, dtype=torch.long), torch.randint(3, vocab, (rows, tgt), generator=g)


def step_t5_base(args) -> dict:
    if args.cpu:
        model, batch, warmup, repeat = {"architecture": "t5", **CPU_MODEL}, (4, 16, 16), 2, 2
    else:
        # nanoT5's t5-base pre-training batch is 128 × 512 inputs; a translation-length batch that fills
        # an H100 as well: 128 pairs of 256 source and 256 target tokens.
        model, batch, warmup, repeat = {"architecture": "t5", "size": "base"}, (128, 256, 256), 6, 10
    vocab = CPU_VOCAB if args.cpu else VOCAB
    results = backend_steps(args, {**model, "dropout": 0.0}, vocab, [synthetic(*batch, vocab)],
                            ["none", "default", "reduce-overhead"], warmup, repeat)
    return {"batch": batch, "modes": results, "table": {
        f"t5-base {m}": f"{r['ms_per_step']:.1f} ms, MFU {r['mfu'] if r['mfu'] is not None else '-'}"
        for m, r in results.items()}}


def multi30k_like(pairs: int, count: int, vocab: int):
    """Batches of Multi30k's sentence lengths (about 9 to 30 tokens), padded as the trainer pads for a
    compiled step (multiples of 8), with a few distinct shapes, as an epoch shows."""
    import numpy as np

    from rosetta_trainer.data.batching import BatchShapes, Collation, EncodedCorpus

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        src = rng.integers(9, 31, pairs)
        tgt = np.maximum(3, src + rng.integers(-2, 5, pairs))
        corpus = EncodedCorpus([rng.integers(3, vocab, n).tolist() for n in src],
                               [rng.integers(3, vocab, n).tolist() for n in tgt])
        b = Collation(0, BatchShapes(multiple=8))(corpus, list(range(pairs)))
        out.append((b["input_ids"], b["attention_mask"], b["labels"]))
    return out


def step_transformer_base(args) -> dict:
    if args.cpu:
        # Two batches are enough to cycle through them; every extra one is a step of each mode.
        model, pairs, count, vocab = {"architecture": "transformer", **CPU_MODEL}, 8, 2, CPU_VOCAB
        warmup, repeat = 2, 2
    else:
        model, pairs, count, vocab = {"architecture": "transformer", "size": "base"}, 256, 4, 8000
        warmup, repeat = 12, 40
    results = backend_steps(args, {**model, "dropout": 0.1}, vocab, multi30k_like(pairs, count, vocab),
                            ["none", "default", "reduce-overhead"], warmup, repeat)
    return {"pairs": pairs, "modes": results, "table": {
        f"transformer-base {m}": f"{r['ms_per_step']:.1f} ms, MFU {r['mfu'] if r['mfu'] is not None else '-'}"
        for m, r in results.items()}}


def hf_comparison(args, architecture: str, size: str, work: Path) -> dict:
    cmd = [sys.executable, str(BENCH / "hf_seq2seq.py"), "--data", str(args.data), "--work", str(work),
           "--results", str(work / "results"), "--repeats", "1", "--architecture", architecture,
           "--model-size", size, "--schedule", "noam", "--lr", "1e-3"]
    if args.cpu:
        # Two logged windows, the second measured, and one validation; the vocabulary as the other steps'
        # (the strategies step trains on this run's tokenizer too).
        cmd += ["--steps", "10", "--skip-steps", "5", "--batch", "8", "--warmup", "5", "--eval-interval", "10",
                "--eval-samples", "8", "--train-limit", "2000", "--log-interval", "5", "--vocab", str(CPU_VOCAB)]
    else:
        # The example's schedule (noam, a warm-up of hundreds of steps); the peer's inverse_sqrt.
        cmd += ["--device", "cuda", "--bf16", "--compile", "reduce-overhead", "--steps", "200", "--skip-steps", "100",
                "--batch", "256", "--warmup", "400", "--eval-interval", "200", "--eval-samples", "100"]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    result = json.loads((work / "results" / "hf-seq2seq.json").read_text())
    med = result["summary"]["median"]
    return {"rosetta_target_tokens_per_s": med["rosetta"]["target_tokens_per_s"],
            "peer_target_tokens_per_s": med["peer"]["target_tokens_per_s"],
            "ratio": result["summary"]["ratios"]["throughput"], "config": str(work / "bench.yaml")}


def step_vs_peer(args) -> dict:
    runs = {}
    # On a GPU, transformer-base alone: a second model's two trainings do not fit the command's time.
    models = [("transformer", "tiny"), ("t5", "tiny")] if args.cpu else [("transformer", "base")]
    for architecture, size in models:
        runs[f"{architecture}-{size}"] = hf_comparison(args, architecture, size, args.work / f"peer-{architecture}")
        print(architecture, runs[f"{architecture}-{size}"], file=sys.stderr, flush=True)
    return {"runs": runs, "table": {
        name: f"{r['ratio']:.2f}x Seq2SeqTrainer ({r['rosetta_target_tokens_per_s']:,.0f} vs "
              f"{r['peer_target_tokens_per_s']:,.0f} target tokens/s)" for name, r in runs.items()}}


def step_strategies(args) -> dict:
    config = args.work / "peer-transformer" / "bench.yaml"
    if not config.is_file():
        raise SystemExit(f"{config} is missing: the vs-peer step writes it")
    out = args.work / "strategies"
    steps, skip = (10, 5) if args.cpu else (100, 40)
    # The variants a GPU runs, so the rehearsal runs those. ZeRO-3 on one GPU shards nothing and says
    # nothing about speed (it ran at half DDP's rate on an H200); tests/training/test_deepspeed.py
    # trains it.
    variants = "ddp,zero2"
    if args.cpu:
        # A model this young never ends a sentence, so validation decodes to maxNewTokens: 8 tokens
        # run the same generation as 128, in each of the three variants.
        import yaml

        document = yaml.safe_load(config.read_text())
        document["spec"]["evaluation"]["maxNewTokens"] = 8
        out.mkdir(parents=True, exist_ok=True)
        config = out / "bench.yaml"
        config.write_text(yaml.safe_dump(document, sort_keys=False))
    # A variant that fails (DeepSpeed missing, say) is a row with its exit, not the end of the step.
    subprocess.run([sys.executable, str(BENCH / "strategies.py"), "--config", str(config), "--variants",
                    variants, "--steps", str(steps), "--skip-steps", str(skip), "--timeout",
                    str(60 * (CPU_SCALE if args.cpu else 1)), "--work", str(out), "--results", str(out / "results")],
                   stdout=sys.stderr)
    rows = json.loads((out / "results" / "strategies.json").read_text())["results"]
    for row in rows:
        row.pop("log_tail", None)
    return {"results": rows, "table": {
        r["variant"]: (f"{r['step_time_ms']:.1f} ms, MFU {r['mfu']:.1%}" if r.get("mfu") is not None
                       else f"{r['step_time_ms']:.1f} ms" if r.get("step_time_ms") else f"exit {r['exit']}")
        for r in rows}}


def step_multi30k_bleu(args) -> dict:
    """The shipped recipe for a fixed time: SIGTERM makes the trainer checkpoint and stop (as a
    preemption would), then that checkpoint is evaluated on test_2016_flickr."""
    import signal

    import yaml

    d = args.data.resolve()
    out = args.work / "multi30k"
    # Training; the rest of the step's time is for beam-4 evaluation. On the CPU a few seconds after
    # the first step leave a checkpoint to evaluate, which is all the rehearsal needs.
    seconds = 5 if args.cpu else 100
    document = yaml.safe_load((REPO / "examples" / "multi30k-en-de.yaml").read_text())
    spec = document["spec"]
    for split, files in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr")):
        spec["data"][split] = [{"format": "pairs", "source": f"{d}/{files}.en.gz", "target": f"{d}/{files}.de.gz"}]
    spec["metrics"]["port"] = 0
    spec["evaluation"]["interval"] = spec["checkpoint"]["interval"] = 100000
    if args.cpu:
        spec["model"].update(CPU_MODEL)
        spec["tokenizer"]["train"]["vocabSize"] = CPU_VOCAB
        spec["data"]["train"][0]["limit"] = 2000
        spec["training"]["batch"]["tokens"] = 1000
        spec["training"]["logInterval"] = 1  # the first step is what starts the clock
    else:
        spec["gpusPerNode"] = 1
        spec["training"].update(device="cuda", precision="bf16", compile="reduce-overhead")
    config = args.work / "multi30k.yaml"
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    cmd = [sys.executable, "-m", "rosetta_trainer", "train", "-f", str(config), "--output", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    # The seconds count from the first logged step: the start (tokenizer, compilation) takes
    # longer on a busy machine, and a SIGTERM before the first step leaves nothing to evaluate.
    started = wait_for_first_step(proc, out / "metrics.jsonl", timeout=600)
    try:
        proc.wait(timeout=seconds if started else 0)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    from rosetta_trainer.checkpoints.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(out / "checkpoints")
    if checkpoint is None:
        raise SystemExit(f"the training wrote no checkpoint (exit {proc.returncode})")
    evaluation = args.work / "multi30k-eval"
    subprocess.run([sys.executable, "-m", "rosetta_trainer", "evaluate", "--checkpoint", str(checkpoint),
                    "--output", str(evaluation)] + (["--max-samples", "16", "--beams", "1"] if args.cpu else []),
                   check=True, stdout=sys.stderr)
    scores = [json.loads(p.read_text()) for p in sorted(evaluation.rglob("*.json"))]
    steps = int(checkpoint.name.split("-")[1])
    bleu = find_bleu(scores)
    return {"train_seconds": seconds, "steps": steps, "scores": scores,
            "table": {"test_2016_flickr BLEU": f"{bleu} after {seconds} s of training ({steps} steps)"}}


def wait_for_first_step(proc: subprocess.Popen, metrics: Path, *, timeout: float) -> bool:
    """Whether the training logged a step within `timeout` s (False: it ended or never got there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.stat().st_size:
            return True
        time.sleep(0.5)
    return False


def find_bleu(scores) -> float | None:
    """The first "bleu" figure in evaluate's JSON, however nested."""
    if isinstance(scores, dict) and isinstance(scores.get("bleu"), (int, float)):
        return round(scores["bleu"], 2)
    for value in scores.values() if isinstance(scores, dict) else scores if isinstance(scores, list) else ():
        found = find_bleu(value)
        if found is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
