"""`rosetta evaluate` (a checkpoint, exported or pretrained model scored on a split) and `rosetta translate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

from rosetta_contract import final_result
from rosetta_contract.config import TrainerSpec
from rosetta_contract.languages import task_prefix
from rosetta_contract.spec import load_for_trainer
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.commands.arguments import generation_overrides
from rosetta_trainer.data.examples import target_langs
from rosetta_trainer.data.reader import read_split
from rosetta_trainer.evaluation.evaluate import Generation, evaluate_examples, translate
from rosetta_trainer.evaluation.inference import (
    load_checkpoint_for_inference,
    load_pretrained_for_inference,
    pick_checkpoint,
)
from rosetta_trainer.runtime.distributed import init_world, pick_device


def evaluate_command(args: argparse.Namespace) -> int:

    world = init_world(getattr(args, "device", "auto"))
    spec: TrainerSpec | None
    if args.checkpoint is None:
        # A pretrained model as it is (mode: evaluate): the YAML's model.name, hub id or path.
        if not args.file:
            raise ConfigError([("--checkpoint", "pass a checkpoint, or -f with a YAML whose model.name to evaluate")])
        spec = load_for_trainer(args.file, args.overrides).spec
        model, tokenizer = load_pretrained_for_inference(spec, world.device)
        checkpoint = Path(cast(str, spec.model.name))  # load_pretrained_for_inference refuses a spec without one
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


def translate_command(args: argparse.Namespace) -> int:
    device = pick_device("auto", 0)
    model, tokenizer, spec = load_checkpoint_for_inference(args.checkpoint, device)
    lines = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if spec is not None:
        target = args.target_lang or target_langs(spec.data)[0]
        if target not in target_langs(spec.data):
            raise ConfigError([("--target-lang", f"'{target}' is not one of {spec.data.target_langs}")])
        if spec.uses_task_prefix():
            lines = [task_prefix(spec.data.source_lang, target, spec.task) + line for line in lines]
    generation = Generation.from_spec(spec.evaluation if spec else None, generation_overrides(args))
    for text in translate(model, tokenizer, lines, generation=generation, batch_sentences=32, device=device,
                          max_source_length=spec.data.max_source_length if spec else 512):
        print(text)
    return 0
