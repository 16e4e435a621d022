"""Batched generation and scoring (`rosetta evaluate` and `rosetta translate` run them: commands/evaluate.py).

During training every rank translates its shard of the evaluation set and the
hypotheses are gathered, so all ranks compute the same scores (and agree on
which checkpoint is best) without an extra broadcast.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_contract.evaluation_fields import EvaluationSpec
from rosetta_contract.languages import task_prefix
from rosetta_contract.metrics import METRICS, ROUGE_METRICS
from rosetta_trainer.data.batching import IGNORE_INDEX, collate, encode
from rosetta_trainer.data.examples import Example
from rosetta_trainer.evaluation.scoring import corpus_scores, gender_scores, rouge_scores
from rosetta_trainer.models.losses import label_smoothed_cross_entropy
from rosetta_trainer.runtime.distributed import World, all_gather_objects, all_reduce_sum

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A Hugging Face model, bare or wrapped (DDP, a DeepSpeed engine, torch.compile), or a
# CTranslate2Model: the functions below tell them apart by their attributes.
Model = Any


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
    def from_spec(cls, evaluation: EvaluationSpec | None, overrides: dict[str, Any] | None = None) -> "Generation":
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

    def search_kwargs(self) -> dict[str, Any]:
        """generate() arguments besides the length; the beam-only ones only with beams."""
        kwargs: dict[str, Any] = {"num_beams": self.beams, "do_sample": False}
        if self.beams > 1:
            kwargs.update(early_stopping=True, length_penalty=self.length_penalty)
        if self.no_repeat_ngram_size:
            kwargs["no_repeat_ngram_size"] = self.no_repeat_ngram_size
        return kwargs


@torch.no_grad()
def translate(model: Model, tokenizer: PreTrainedTokenizerBase, sources: list[str], *, generation: Generation, batch_sentences: int,
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
        translated: list[str] = model.translate(sources, generation=generation, batch_sentences=batch_sentences,
                                                max_source_length=max_source_length)
        return translated
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


def _growing_cache(model: Model) -> dict[str, Any]:
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


def score(examples: list[Example], hypotheses: list[str], metrics: Sequence[str]) -> dict[str, Any]:
    """Scores per target language; the top-level figures are the mean over languages."""
    by_lang: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        by_lang[e.target_lang].append(i)
    result: dict[str, Any] = {"samples": len(examples), "langs": {}}
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


def evaluate_examples(model: Model, tokenizer: PreTrainedTokenizerBase, examples: list[Example], spec: TrainerSpec, world: World,
                      generation: Generation | None = None,
                      on_batch: Callable[[], None] | None = None) -> tuple[dict[str, Any], list[str]]:
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
    scores = score(examples, hypotheses, cast("list[str]", ev.metrics))  # filled in by EvaluationSpec
    scores["seconds"] = round(time.perf_counter() - started, 3)
    return scores, hypotheses


@torch.no_grad()
def validation_loss(model: Model, tokenizer: PreTrainedTokenizerBase, examples: list[Example], spec: TrainerSpec, world: World,
                    on_batch: Callable[[], None] | None = None) -> float | None:
    """The training criterion (label-smoothed cross-entropy per target token) on `examples`,
    teacher-forced: the figure to set beside the training loss to see overfitting.

    Collective when distributed: every rank scores examples[rank::size] and the sums are
    reduced. Every rank runs the same number of forwards (ZeRO-3 gathers parameters in each),
    padding its share with rows whose labels are all ignored."""
    if not examples:
        return None
    d, batch = spec.data, spec.evaluation.batch_sentences
    inputs = model_inputs(examples, d.source_lang, spec.uses_task_prefix())
    mine = list(range(world.rank, len(examples), world.size))
    share = -(-len(examples) // world.size)
    corpus = encode(tokenizer, [inputs[i] for i in mine], [examples[i].target for i in mine],
                    d.max_source_length, d.max_target_length) if mine else None
    module: Any = getattr(model, "module", model)  # DDP, a DeepSpeed engine
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


def sharded_parameters(model: Model) -> bool:
    """True for a DeepSpeed engine under ZeRO-3 (each rank holds only a slice of every weight)."""
    stage = getattr(model, "zero_optimization_stage", None)
    return callable(stage) and stage() == 3



