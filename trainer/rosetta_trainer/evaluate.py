"""Batched generation and scoring; also `rosetta evaluate` and `rosetta translate`.

During training every rank translates its shard of the evaluation set and the
hypotheses are gathered, so all ranks compute the same scores (and agree on
which checkpoint is best) without an extra broadcast.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_contract.evaluation_fields import EvaluationSpec
from rosetta_contract.languages import task_prefix
from rosetta_contract.metrics import METRICS, ROUGE_METRICS
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.data import Example
from rosetta_trainer.distributed import World, all_gather_objects
from rosetta_trainer.scoring import corpus_scores, gender_scores, rouge_scores


@dataclass(frozen=True)
class Generation:
    """How translations are generated: spec.evaluation's search settings (the same defaults)."""

    beams: int = 4
    max_new_tokens: int = 128
    max_length_ratio: float | None = 2.0
    max_length_offset: int = 10
    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @classmethod
    def from_spec(cls, evaluation: EvaluationSpec | None, overrides: dict | None = None) -> "Generation":
        """The spec's settings (without a spec, the defaults), then `overrides` (command-line flags)."""
        base = cls() if evaluation is None else cls(**{f.name: getattr(evaluation, f.name) for f in fields(cls)})
        return replace(base, **(overrides or {}))

    def budget(self, source_tokens: int) -> int:
        """Most tokens to generate for sources of this many tokens (fairseq's max_len_a * len + max_len_b).

        A translation much longer than its source is a model that has not learnt to stop yet, and
        letting it run to max_new_tokens makes early evaluations (untrained models, beam search,
        CPU) many times slower for nothing."""
        if self.max_length_ratio is None:
            return self.max_new_tokens
        return max(1, min(self.max_new_tokens, int(self.max_length_ratio * source_tokens) + self.max_length_offset))

    def search_kwargs(self) -> dict:
        """generate() arguments besides the length; the beam-only ones only with beams."""
        kwargs = {"num_beams": self.beams, "do_sample": False}
        if self.beams > 1:
            kwargs.update(early_stopping=True, length_penalty=self.length_penalty)
        if self.no_repeat_ngram_size:
            kwargs["no_repeat_ngram_size"] = self.no_repeat_ngram_size
        return kwargs


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], *, generation: Generation, batch_sentences: int,
              device: torch.device, max_source_length: int = 512, synced: bool = False,
              on_batch: Callable[[], None] | None = None) -> list[str]:
    """Translate in length-sorted batches (less padding), returned in input order.

    `synced`: the model's parameters are sharded across ranks (ZeRO-3), so every forward is
    a collective. Every rank must then call this with the same number of sources, and
    generation keeps stepping on ranks that have finished until all have (synced_gpus).
    A CTranslate2 model (export.CTranslate2Model) translates with its own engine, in the same batches.
    `on_batch` is called after each batch (the trainer's heartbeat).
    """
    if getattr(model, "is_ctranslate2", False):
        return model.translate(sources, generation=generation, batch_sentences=batch_sentences,
                               max_source_length=max_source_length)
    model = getattr(model, "module", model)
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_sentences):
        idx = order[start: start + batch_sentences]
        enc = tokenizer([sources[i] for i in idx], return_tensors="pt", padding=True,
                        truncation=True, max_length=max_source_length).to(device)
        generated = model.generate(
            **enc, max_new_tokens=generation.budget(enc["input_ids"].shape[1]), synced_gpus=synced,
            **generation.search_kwargs(), **_growing_cache(model),
        )
        for i, text in zip(idx, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            out[i] = text.strip()
        if on_batch is not None:
            on_batch()
    model.train(was_training)
    return out


def _growing_cache(model) -> dict:
    """generate() sizes its cache by config.num_hidden_layers, which T5Config takes from the encoder's
    depth: a T5 with more decoder than encoder layers then indexes past the cache's last layer. A
    cache that adds layers as they come fits any depth (a new one per call)."""
    config = model.config
    decoder = getattr(config, "num_decoder_layers", None)
    if decoder is None or decoder <= getattr(config, "num_hidden_layers", decoder):
        return {}
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    return {"past_key_values": EncoderDecoderCache(DynamicCache(), DynamicCache())}


def model_inputs(examples: list[Example], source_lang: str, use_prefix: bool) -> list[str]:
    if not use_prefix:
        return [e.source for e in examples]
    return [task_prefix(source_lang, e.target_lang, e.task) + e.source for e in examples]


def primary_metric(spec: TrainerSpec) -> str:
    """The validation score that picks the best checkpoint: BLEU for translation, ROUGE-L for
    summarization (or the first metric asked for when rougeL is not among them)."""
    if spec.task == "translation":
        return "bleu"
    metrics = spec.evaluation.metrics or []
    return "rougeL" if "rougeL" in metrics else next((m for m in metrics if m != "gender"), "rougeL")


def score(examples: list[Example], hypotheses: list[str], metrics: list[str]) -> dict:
    """Scores per target language; the top-level figures are the mean over languages."""
    by_lang: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        by_lang[e.target_lang].append(i)
    result: dict = {"samples": len(examples), "langs": {}}
    for lang, idx in sorted(by_lang.items()):
        hyps = [hypotheses[i] for i in idx]
        refs = [examples[i].target for i in idx]
        lang_scores = corpus_scores(hyps, refs, lang, [m for m in metrics if m in METRICS])
        rouge = [m for m in metrics if m in ROUGE_METRICS]
        if rouge:
            lang_scores.update(rouge_scores(hyps, refs, rouge, lang))
        gendered = [i for i in idx if examples[i].gender is not None]
        if "gender" in metrics and gendered:
            lang_scores["gender"] = gender_scores(
                [hypotheses[i] for i in gendered],
                [examples[i].target for i in gendered],
                [examples[i].gender for i in gendered],
                [examples[i].counterfactual for i in gendered],
                lang,
            )
        result["langs"][lang] = lang_scores
    for metric in (*METRICS, *ROUGE_METRICS):
        values = [s[metric] for s in result["langs"].values() if s.get(metric) is not None]
        if values:
            result[metric] = sum(values) / len(values)
    if len(result["langs"]) == 1:
        only = next(iter(result["langs"].values()))
        for key in ("bleu_signature", "chrf_signature", "rouge_signature"):
            if key in only:
                result[key] = only[key]
    return result


def evaluate_examples(model, tokenizer, examples: list[Example], spec: TrainerSpec, world: World,
                      generation: Generation | None = None,
                      on_batch: Callable[[], None] | None = None) -> tuple[dict, list[str]]:
    """Collective when distributed: every rank translates examples[rank::size]. `generation`:
    default spec.evaluation's settings; `on_batch`: called after each batch translated."""
    ev = spec.evaluation
    started = time.perf_counter()
    inputs = model_inputs(examples, spec.data.source_lang, spec.uses_task_prefix())
    mine = list(range(world.rank, len(examples), world.size))
    synced = world.distributed and sharded_parameters(model)
    padded = list(mine)
    if synced and examples:
        # Equal shards, hence the same number of generate() calls on every rank: a rank
        # that stopped early would leave the others waiting for its parameter shards.
        padded += [len(examples) - 1] * (-(-len(examples) // world.size) - len(mine))
    hyps_padded = translate(
        model, tokenizer, [inputs[i] for i in padded], generation=generation or Generation.from_spec(ev),
        batch_sentences=ev.batch_sentences, device=world.device, max_source_length=spec.data.max_source_length,
        synced=synced, on_batch=on_batch,
    )
    hyps_mine = hyps_padded[: len(mine)]
    hypotheses = [""] * len(examples)
    for shard in all_gather_objects(world, list(zip(mine, hyps_mine))):
        for i, h in shard:
            hypotheses[i] = h
    scores = score(examples, hypotheses, ev.metrics)
    scores["seconds"] = round(time.perf_counter() - started, 3)
    return scores, hypotheses


@torch.no_grad()
def validation_loss(model, tokenizer, examples: list[Example], spec: TrainerSpec, world: World,
                    on_batch: Callable[[], None] | None = None) -> float | None:
    """The training criterion (label-smoothed cross-entropy per target token) on `examples`,
    teacher-forced: the figure to set beside the training loss to see overfitting.

    Collective when distributed: every rank scores examples[rank::size] and the sums are
    reduced. Every rank runs the same number of forwards (ZeRO-3 gathers parameters in each),
    padding its share with rows whose labels are all ignored."""
    from rosetta_trainer.batching import IGNORE_INDEX, collate, encode
    from rosetta_trainer.distributed import all_reduce_sum
    from rosetta_trainer.losses import label_smoothed_cross_entropy

    if not examples:
        return None
    d, batch = spec.data, spec.evaluation.batch_sentences
    inputs = model_inputs(examples, d.source_lang, spec.uses_task_prefix())
    mine = list(range(world.rank, len(examples), world.size))
    share = -(-len(examples) // world.size)
    corpus = encode(tokenizer, [inputs[i] for i in mine], [examples[i].target for i in mine],
                    d.max_source_length, d.max_target_length) if mine else None
    module = getattr(model, "module", model)  # DDP, a DeepSpeed engine
    # torch.compile: evaluate eagerly, as generate() does; the compiled forward would recompile
    # for evaluation's shapes and modes.
    module = getattr(module, "_orig_mod", module)
    was_training = module.training
    module.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=world.device)  # loss sum, target tokens
    for start in range(0, share, batch):
        rows = list(range(start, min(start + batch, share)))
        real = [r for r in rows if r < len(mine)]
        if corpus is None:  # fewer examples than ranks: a dummy row, fully ignored
            padded = {"input_ids": torch.full((1, 1), tokenizer.pad_token_id),
                      "attention_mask": torch.ones(1, 1, dtype=torch.long), "labels": torch.full((1, 1), IGNORE_INDEX)}
        else:
            padded = collate(corpus, real or [0], tokenizer.pad_token_id)
            if not real:
                padded["labels"].fill_(IGNORE_INDEX)
        labels = padded["labels"].to(world.device)
        decoder_inputs = module.prepare_decoder_input_ids_from_labels(labels=labels)
        logits = module(input_ids=padded["input_ids"].to(world.device),
                        attention_mask=padded["attention_mask"].to(world.device),
                        decoder_input_ids=decoder_inputs).logits
        loss_sum = label_smoothed_cross_entropy(logits.float(), labels, spec.training.label_smoothing, IGNORE_INDEX)
        totals[0] += loss_sum.double()
        totals[1] += (labels != IGNORE_INDEX).sum()
        if on_batch is not None:
            on_batch()
    module.train(was_training)
    totals = all_reduce_sum(world, totals)
    return float(totals[0] / totals[1]) if float(totals[1]) > 0 else None


def sharded_parameters(model) -> bool:
    """True for a DeepSpeed engine under ZeRO-3 (each rank holds only a slice of every weight)."""
    stage = getattr(model, "zero_optimization_stage", None)
    return callable(stage) and stage() == 3


# ------------------------------------------------------------------ command line


def load_checkpoint_for_inference(path: str | Path, device: torch.device):
    """(model, tokenizer, spec) from a checkpoint, averaged or exported model directory; a CTranslate2
    export gives an export.CTranslate2Model, which translate() drives the same way."""
    from rosetta_trainer.export import is_ctranslate2_dir, load_ctranslate2
    from rosetta_trainer.models import load_pretrained
    from rosetta_trainer.tokenization import load_tokenizer

    path = Path(path)
    if is_ctranslate2_dir(path):
        return load_ctranslate2(path, "auto" if device.type == "cuda" else "cpu", device.index or 0)
    model_dir = path / "model" if (path / "model").is_dir() else path
    tok_dir = path / "tokenizer" if (path / "tokenizer").is_dir() else model_dir
    if not (model_dir / "config.json").is_file():
        raise ConfigError([("--checkpoint", f"{path} holds no model (no config.json in {model_dir})")])
    spec = None
    if (path / "training.yaml").is_file():
        from rosetta_contract.spec import load_saved

        spec = load_saved(path / "training.yaml").spec
    from rosetta_trainer.deepspeed_backend import consolidated_model, is_deepspeed_checkpoint

    if is_deepspeed_checkpoint(path):  # ZeRO shards: gather them (an export does this once, ahead)
        model = consolidated_model(path).to(device)
    else:
        model = load_pretrained(str(model_dir)).to(device)
    return model, load_tokenizer(str(tok_dir)), spec


def load_pretrained_for_inference(spec: TrainerSpec, device: torch.device):
    """(model, tokenizer) of spec.model.name: a hub id, or a directory saved with save_pretrained."""
    from rosetta_trainer.models import load_pretrained
    from rosetta_trainer.tokenization import load_tokenizer

    if spec.model.name is None:
        raise ConfigError([("spec.model.name", "evaluating without --checkpoint needs a pretrained model.name")])
    model = load_pretrained(spec.model.name).to(device)
    return model, load_tokenizer(spec.tokenizer.path or spec.model.name)


def pick_checkpoint(root: str | Path, pick: str) -> Path:
    """The checkpoint of a checkpoint directory that `rosetta evaluate --pick` names: the newest
    complete one (final), the best by validation score (best; the newest when none was scored),
    or the averaged model (checkpoint.average)."""
    from rosetta_trainer.averaging import AVERAGED_DIR
    from rosetta_trainer.checkpoint import best_by_score, checkpoint_score, complete_checkpoints, read_meta

    root = Path(root)
    if pick == "averaged":
        if not (root / AVERAGED_DIR).is_dir():
            raise ConfigError([("--pick", f"averaged: {root / AVERAGED_DIR} does not exist "
                                          "(is checkpoint.average set?)")])
        return root / AVERAGED_DIR
    found = complete_checkpoints(root)
    if not found:
        raise ConfigError([("--checkpoint", f"{root} holds no complete checkpoint (step-* with its marker)")])
    if pick == "best":
        best = best_by_score((checkpoint_score(read_meta(p)), p.name, p) for p in found)
        if best is not None:
            return best
        print(f"no checkpoint in {root} has a validation score: evaluating the newest", file=sys.stderr)
    return found[-1]


def evaluate_command(args) -> int:
    from rosetta_contract import final_result
    from rosetta_contract.spec import load_for_trainer
    from rosetta_trainer.cli import generation_overrides
    from rosetta_trainer.data import read_split
    from rosetta_trainer.distributed import init_world

    world = init_world(getattr(args, "device", "auto"))
    if args.checkpoint is None:
        # A pretrained model as it is (mode: evaluate): the YAML's model.name, hub id or path.
        if not args.file:
            raise ConfigError([("--checkpoint", "pass a checkpoint, or -f with a YAML whose model.name to evaluate")])
        spec = load_for_trainer(args.file, args.overrides).spec
        model, tokenizer = load_pretrained_for_inference(spec, world.device)
        checkpoint = Path(spec.model.name)
    else:
        checkpoint = Path(args.checkpoint)
        if getattr(args, "pick", None):
            checkpoint = pick_checkpoint(checkpoint, args.pick)
            if world.is_main:
                print(f"evaluating {checkpoint} ({args.pick}) on {world.device}", file=sys.stderr)
        model, tokenizer, spec = load_checkpoint_for_inference(checkpoint, world.device)
        if args.file:
            spec = load_for_trainer(args.file, args.overrides).spec
    if spec is None:
        raise ConfigError([("-f", f"{args.checkpoint} has no training.yaml; pass the YAML with -f")])
    examples = read_split(spec.data, args.split)
    if not examples:
        raise ConfigError([(f"spec.data.{args.split}", "is empty: nothing to evaluate")])
    limit = args.max_samples
    if limit:
        examples = examples[:limit]
    generation = Generation.from_spec(spec.evaluation, generation_overrides(args))
    scores, hypotheses = evaluate_examples(model, tokenizer, examples, spec, world, generation)
    if world.is_main:
        print(json.dumps(scores, indent=2))
        step = None
        if (checkpoint / "meta.json").is_file():
            step = json.loads((checkpoint / "meta.json").read_text()).get("step")
        final_result.report_evaluation(scores, checkpoint=checkpoint.name, step=step)
        if args.output:
            out = Path(args.output)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{args.split}.scores.json").write_text(json.dumps(scores, indent=2))
            (out / f"{args.split}.hyp.txt").write_text("\n".join(hypotheses) + "\n")
    return 0


def translate_command(args) -> int:
    from rosetta_trainer.cli import generation_overrides
    from rosetta_trainer.distributed import pick_device

    device = pick_device("auto", 0)
    model, tokenizer, spec = load_checkpoint_for_inference(args.checkpoint, device)
    lines = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if spec is not None:
        target = args.target_lang or spec.data.target_langs[0]
        if target not in spec.data.target_langs:
            raise ConfigError([("--target-lang", f"'{target}' is not one of {spec.data.target_langs}")])
        if spec.uses_task_prefix():
            lines = [task_prefix(spec.data.source_lang, target, spec.task) + line for line in lines]
    generation = Generation.from_spec(spec.evaluation if spec else None, generation_overrides(args))
    for text in translate(model, tokenizer, lines, generation=generation, batch_sentences=32, device=device,
                          max_source_length=spec.data.max_source_length if spec else 512):
        print(text)
    return 0
