"""What the logit chunk size costs a compiled step's first call: capture and compile time per chunk budget.

    python bench/loss_chunks.py [--budgets 128,512,1024] [--tokens 65536] [--vocab 32128]

A compiled step fixes its loss's chunk count from the largest batch the spec allows (the count must not
follow the batch's shape), and the chunk loop is unrolled into the graph: a t5 vocabulary at a 65,536-
token budget makes 63 chunks of 128 MiB of fp32 logits. For each budget (MiB of logits per chunk),
a one-layer t5 with the real vocabulary runs its first compiled forward and backward through dynamo
alone (a backend that runs the captured graph) and through aot_eager (dynamo + AOTAutograd, what
inductor starts from). On the CPU; inductor's own compilation adds to both on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer")]

import torch  # noqa: E402

from rosetta_contract.documents import parse_document  # noqa: E402
from rosetta_trainer.engine.backends import mark_dynamic  # noqa: E402
from rosetta_trainer.models import losses  # noqa: E402
from rosetta_trainer.models.models import build_model  # noqa: E402
from rosetta_trainer.models.seq2seq_loss import Seq2SeqLoss  # noqa: E402


def first_call_seconds(spec, vocab: int, chunks: int, backend) -> float:
    torch._dynamo.reset()
    torch.manual_seed(0)
    step = torch.compile(Seq2SeqLoss(build_model(spec.model, vocab, 64), 0.1, chunks), backend=backend)
    ids, labels = torch.randint(3, vocab, (8, 24)), torch.randint(3, vocab, (8, 24))
    mask = torch.ones_like(ids)
    mark_dynamic(ids, mask, labels)
    started = time.perf_counter()
    loss, _ = step(ids, mask, labels)
    loss.backward()
    return time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", default="128,512,1024", help="MiB of fp32 logits per chunk, comma-separated")
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--vocab", type=int, default=32128)
    args = p.parse_args(argv)
    doc = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "chunks"},
           "spec": {"model": {"architecture": "t5", "size": "tiny", "encoderLayers": 1, "decoderLayers": 1},
                    "tokenizer": {"path": "/unused"},
                    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated"}]},
                    "training": {"maxSteps": 10, "batch": {"tokens": args.tokens}}}}
    spec = parse_document(doc).spec
    print("| MiB per chunk | chunks | dynamo capture, s | aot_eager, s |\n|---:|---:|---:|---:|")
    for mib in (int(b) for b in args.budgets.split(",")):
        chunks = losses.logit_chunks(args.tokens, args.vocab, torch.device("cuda"), budget=mib << 20)
        run = lambda gm, example: gm.forward  # noqa: E731  # dynamo's capture only
        capture = first_call_seconds(spec, args.vocab, chunks, run)
        aot = first_call_seconds(spec, args.vocab, chunks, "aot_eager")
        print(f"| {mib} | {chunks} | {capture:.1f} | {aot:.1f} |", flush=True)
    print(f"(the trainer's budget on an accelerator: {losses.DEVICE_CHUNK_BYTES >> 20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
