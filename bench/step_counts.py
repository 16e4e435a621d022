"""What one training step asks of the device, eager against compiled, Rosetta against Seq2SeqTrainer.

    python bench/step_counts.py [--model transformer-base|t5-small|...] [--pairs 16] [--modes none,default]

For each variant the same model, weights and batch: operators dispatched, kernels run and host-device
synchronisations per optimizer step (rosetta_trainer/engine/step_counters.py, torch's profiler), plus the
step's wall time on this machine. None of the counts depends on the batch size, so a small batch on
a CPU says what the step launches on a GPU; the seconds are only this machine's.

- rosetta (compile MODE): rosetta_trainer.engine.backends.DDPBackend as the loop drives it (forward_loss,
  backward, step) on a batch made by the loader's Collation.
- seq2seq-trainer: what transformers' Trainer.train runs for one optimizer step, called piece by
  piece on the same batch in its collator's format: get_batch_samples (the token count),
  training_step, then clip, optimizer, scheduler, zero_grad, with the AdamW the Trainer builds.

Writes RESULTS/step_counts.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer")]

from rosetta_contract.documents import parse_document  # noqa: E402
from rosetta_trainer.data.batching import BatchShapes, Collation, EncodedCorpus  # noqa: E402
from rosetta_trainer.engine.backends import build_backend  # noqa: E402
from rosetta_trainer.engine.step_counters import count_step, profile_kernels  # noqa: E402
from rosetta_trainer.models.models import build_model  # noqa: E402
from rosetta_trainer.runtime.distributed import World  # noqa: E402

# --model NAME -> spec.model
MODELS = {
    "transformer-tiny": {"architecture": "transformer", "size": "tiny"},
    "transformer-base": {"architecture": "transformer", "size": "base"},
    "t5-tiny": {"architecture": "t5", "size": "tiny"},
    "t5-small": {"architecture": "t5", "size": "small"},
}
VOCAB = 8000


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="transformer-base", choices=sorted(MODELS))
    p.add_argument("--pairs", type=int, default=16, help="sentence pairs in the batch")
    p.add_argument("--modes", default="none,default", help="training.compile modes to count, comma-separated")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--bf16-parameters", action="store_true",
                   help="training.bf16Parameters for Rosetta's variants (bf16 weights, fp32 masters)")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True, help="count Seq2SeqTrainer too")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after two warm-up steps)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    return p.parse_args(argv)


def document(model: dict, compile_mode: str, precision: str, pairs: int, device: str,
             bf16_parameters: bool = False) -> dict:
    return {
        "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "step-counts"},
        "spec": {
            "model": {**model, "dropout": 0.1},
            "tokenizer": {"path": "/unused"},
            "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 10}]},
            "training": {"maxSteps": 100, "batch": {"sentences": pairs}, "precision": precision,
                         "compile": compile_mode, "device": device, "warmupSteps": 10,
                         "bf16Parameters": bf16_parameters},
        },
    }


def corpus(pairs: int, seed: int = 0) -> EncodedCorpus:
    """Sentences of Multi30k-like lengths (9 to 30 tokens), ids past the special tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(9, 31, (2, pairs), generator=g).tolist()
    ids = [[torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in side] for side in lengths]
    return EncodedCorpus(*ids)


def rosetta_step(mode: str, args, batch: dict):
    spec = parse_document(document(MODELS[args.model], mode, args.precision, args.pairs, args.device,
                                   args.bf16_parameters)).spec
    world = World(rank=0, local_rank=0, size=1, device=torch.device(args.device))
    torch.manual_seed(0)
    backend = build_backend(spec, world, build_model(spec.model, VOCAB, 64), total_steps=100)
    dev = world.device

    def step():
        loss, _ = backend.forward_loss(*(batch[k].to(dev, non_blocking=True)
                                         for k in ("input_ids", "attention_mask", "labels")))
        backend.backward(loss, 1, True)
        backend.step()
    return step


def peer_step(args, batch: dict):
    """Seq2SeqTrainer's training step and the optimizer step Trainer.train takes after it."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    spec = parse_document(document(MODELS[args.model], "none", args.precision, args.pairs, args.device)).spec
    torch.manual_seed(0)
    model = build_model(spec.model, VOCAB, 64).to(args.device)
    hf_args = Seq2SeqTrainingArguments(output_dir="/tmp/step-counts-peer", bf16=args.precision == "bf16",
                                       use_cpu=args.device == "cpu", learning_rate=5e-4, max_grad_norm=1.0,
                                       report_to=[], label_smoothing_factor=0.1, warmup_steps=10)
    trainer = Seq2SeqTrainer(model=model, args=hf_args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    model = trainer.accelerator.prepare(model)
    # What DataCollatorForSeq2Seq(model=...) gives: the decoder's inputs made from the labels.
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["labels"],
              "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])}

    def step():
        # As Trainer.train's inner loop: count the batch's target tokens, then the training step.
        samples, items = trainer.get_batch_samples(iter([inputs]), 1, trainer.args.device)
        trainer.current_gradient_accumulation_steps = len(samples)
        trainer.training_step(model, samples[0], items)
        trainer.accelerator.clip_grad_norm_(model.parameters(), hf_args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
    return step


def measure(name: str, step, steps: int) -> dict:
    step()
    step()  # the first call compiles and creates the optimizer's state; the second may recompile once
    started = time.perf_counter()
    step()
    seconds = time.perf_counter() - started
    counts = count_step(step, steps, where=True)
    row = {"variant": name, **counts.row(), "seconds": round(seconds, 4)}
    if counts.syncs:
        row["sync_sites"] = counts.sync_sites
    if counts.kernel_names:
        row["kernel_names"] = counts.kernel_names
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    eager = next((r for r in rows if r["variant"] == "rosetta (compile none)"), None)
    weights = ", bf16 parameters (fp32 masters) for Rosetta" if meta.get("bf16_parameters") else ""
    out = [f"Model {meta['model']}, {meta['pairs']} pairs, {meta['precision']}{weights}, {meta['device']} "
           f"({meta['cpu']}), torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}.", "",
           "| variant | ops per step | kernels per step | syncs per step | kernels vs eager | step (s, this machine) |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['kernels'] / eager['kernels']:.2f}" if eager and eager["kernels"] else "-"
        out.append(f"| {r['variant']} | {r['ops']:,.0f} | {r['kernels']:,.0f} | {r['syncs']:g} | {ratio} | "
                   f"{r['seconds']:.3f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers

    profile_kernels()
    batch = Collation(0, BatchShapes(multiple=8))(corpus(args.pairs), list(range(args.pairs)))
    rows = []
    for mode in args.modes.split(","):
        rows.append(measure(f"rosetta (compile {mode})", rosetta_step(mode, args, batch), args.steps))
    if args.peer:
        rows.append(measure("seq2seq-trainer", peer_step(args, batch), args.steps))
    meta = {"model": args.model, "pairs": args.pairs, "precision": args.precision, "device": args.device,
            "bf16_parameters": args.bf16_parameters,
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d")}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "step_counts.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    table = markdown(rows, meta)
    (args.results / "step_counts.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
