"""The peer: the same TranslationTraining trained with transformers' Seq2SeqTrainer.

Written the way transformers' examples/pytorch/translation/run_translation.py trains: a
tokenized dataset, DataCollatorForSeq2Seq(model=...), Seq2SeqTrainingArguments and
Seq2SeqTrainer.train(). Every setting is read from the Rosetta YAML that the Rosetta run gets,
so the two cannot drift apart:

    python bench/hf_peer.py --config runs/bench-hf/rosetta.yaml --output runs/bench-hf/peer-1

Writes, like a Rosetta run, `metrics.jsonl` (one line per optimizer step: non-pad target
tokens and training seconds, evaluation excluded), `eval.jsonl` (validation BLEU every
`evaluation.interval` steps, scored by rosetta_trainer.evaluation.evaluate so decoding and sacreBLEU are
identical to Rosetta's) and `summary.json`.

Two departures from run_translation.py, both measurement only: the training set is a list of
dicts instead of a `datasets.Dataset` (the Trainer accepts any indexable dataset; `datasets`
would add pyarrow and pandas to the environment), and a callback times the steps and runs the
validation instead of the Trainer's own evaluation loop (which would decode with different
settings than Rosetta's).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from rosetta_contract.documents import load_document
from rosetta_trainer.evaluation.evaluate import evaluate_examples, model_inputs  # noqa: E402
from rosetta_trainer.models.models import freeze_fixed_positions  # noqa: E402
from rosetta_trainer.preparation.data_checks import read_checked  # noqa: E402
from rosetta_trainer.runtime.distributed import World, pick_device  # noqa: E402

IGNORE_INDEX = -100
# Rosetta's schedule names -> the Trainer's lr_scheduler_type. noam (inverse square root) has
# a Trainer counterpart, but with a different warm-up; the benchmark uses linear in both.
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup",
             "noam": "inverse_sqrt"}


class CountingCollator:
    """DataCollatorForSeq2Seq, plus a count of each batch's non-pad target tokens."""

    def __init__(self, inner):
        self.inner, self.pending = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        self.pending.append(int((batch["labels"] != IGNORE_INDEX).sum()))
        return batch


class Meter(TrainerCallback):
    """Per-step target tokens and seconds; validation BLEU every `interval` steps.

    A step's seconds run from the end of the previous step to the end of this one, so they
    include fetching and collating the batch, as Rosetta's do. Validation time is excluded.
    """

    def __init__(self, collator, spec, tokenizer, examples, world, out: Path):
        self.collator, self.spec, self.tokenizer, self.examples, self.world = collator, spec, tokenizer, examples, world
        self.metrics = (out / "metrics.jsonl").open("w")
        self.evals = (out / "eval.jsonl").open("w")
        self.train_seconds = 0.0
        self.last = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.world.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        seconds = now - self.last
        self.train_seconds += seconds
        tokens, self.collator.pending = sum(self.collator.pending), []
        self.metrics.write(json.dumps({"step": state.global_step, "target_tokens": tokens, "seconds": seconds,
                                       "train_seconds": self.train_seconds}) + "\n")
        self.metrics.flush()
        interval = self.spec.evaluation.interval or self.spec.checkpoint.interval
        if self.examples and state.global_step % interval == 0:
            scores, _ = evaluate_examples(model, self.tokenizer, self.examples, self.spec, self.world)
            self.evals.write(json.dumps({"step": state.global_step, "split": "validation",
                                         "train_seconds": self.train_seconds, **scores}) + "\n")
            self.evals.flush()
            model.train()
        self.last = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        self.metrics.close()
        self.evals.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the Rosetta TranslationTraining YAML")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    spec = load_document(args.config).spec
    d, t, ev = spec.data, spec.training, spec.evaluation
    if t.batch.sentences is None or t.max_steps is None or t.gradient_accumulation != 1:
        raise SystemExit("the peer needs training.batch.sentences, training.maxSteps and no gradient accumulation")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    world = World(rank=0, local_rank=0, size=1, device=pick_device(t.device, 0))

    # Data and tokenizer: the files and tokenizer directory the Rosetta run reads.
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer.path)
    # The same checked and filtered pairs Rosetta trains on (spec.data.checks).
    data = read_checked(d)
    train_examples, validation = data.train, data.validation
    validation = validation[: ev.max_samples] if ev.max_samples else validation
    prefix = spec.uses_task_prefix()

    # run_translation.py's preprocess_function.
    inputs = tokenizer(model_inputs(train_examples, d.source_lang, prefix),
                       max_length=d.max_source_length, truncation=True)
    labels = tokenizer(text_target=[e.target for e in train_examples], max_length=d.max_target_length,
                       truncation=True)
    train_dataset = [{"input_ids": i, "attention_mask": a, "labels": lab}
                     for i, a, lab in zip(inputs["input_ids"], inputs["attention_mask"], labels["input_ids"])]

    model = AutoModelForSeq2SeqLM.from_pretrained(spec.model.name, attn_implementation=spec.model.attention)
    # from_pretrained makes Marian's sinusoidal position table trainable again; freeze it as
    # Rosetta's loader does, so both runs train the same parameters.
    freeze_fixed_positions(model)
    collator = CountingCollator(DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=IGNORE_INDEX))

    training_args = Seq2SeqTrainingArguments(
        output_dir=str(out / "trainer"),
        max_steps=t.max_steps,
        per_device_train_batch_size=t.batch.sentences,
        learning_rate=t.learning_rate,
        lr_scheduler_type=SCHEDULES[t.schedule],
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_betas[0],
        adam_beta2=t.adam_betas[1],
        adam_epsilon=t.adam_eps,
        max_grad_norm=t.clip_grad_norm if t.clip_grad_norm is not None else 0.0,
        label_smoothing_factor=t.label_smoothing,
        seed=t.seed,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        use_cpu=world.device.type == "cpu",
        # The Trainer's length bucketing (formerly group_by_length=True).
        train_sampling_strategy="group_by_length",
        # The Trainer compiles its model's forward, in torch's default mode: its batches change shape
        # at every step, which CUDA graphs (Rosetta's reduce-overhead, on padded shapes) would re-record.
        torch_compile=t.compile != "none",
        logging_steps=t.log_interval,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    meter = Meter(collator, spec, tokenizer, validation, world, out)
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_dataset,
                             data_collator=collator, processing_class=tokenizer, callbacks=[meter])
    result = trainer.train()
    summary = {
        "steps": result.global_step,
        "final_loss": next((r["loss"] for r in reversed(trainer.state.log_history) if "loss" in r), None),
        # Every logged window: (last step, mean loss), as Rosetta's metrics.jsonl has them.
        "losses": [(r["step"], r["loss"]) for r in trainer.state.log_history if "loss" in r and "step" in r],
        "train_seconds": meter.train_seconds,
        "wall_seconds": time.perf_counter() - started,
        "optimizer": getattr(training_args.optim, "value", str(training_args.optim)),
        "gpu_memory_bytes": torch.cuda.max_memory_allocated() if world.device.type == "cuda" else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
