"""Train a TranslationTraining. The same code runs alone and under torchrun:

    rosetta train -f examples/quickstart.yaml                      # one process
    torchrun --nproc-per-node 2 -m rosetta_trainer train -f FILE   # DDP on one node
    torchrun --nnodes 2 --node-rank R --master-addr HOST --master-port 29500 \\
        --nproc-per-node 8 -m rosetta_trainer train -f FILE        # two nodes

`python -m rosetta_trainer ARGS` is the same as `rosetta ARGS`. A run whose
output directory already holds a complete checkpoint resumes from it.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from pathlib import Path

import numpy as np
import yaml

from rosetta_trainer.config import TrainingDocument, apply_overrides, parse_document, read_yaml


def train_from_file(path: str, output: str | None = None, overrides: list[str] | None = None,
                    progress: bool = True) -> dict:
    raw = apply_overrides(read_yaml(path), overrides or [])
    document = parse_document(raw, str(path))  # fails before any work, listing every error
    out = Path(output or Path("runs") / document.metadata.name)
    return train(document, yaml.safe_dump(raw, sort_keys=False), out, progress=progress)


def train(document: TrainingDocument, document_yaml: str, output: Path, progress: bool = True) -> dict:
    # Heavy imports here, so that `rosetta --help` and config errors stay instant.
    import torch
    import transformers

    from rosetta_trainer import checkpoint as ckpt
    from rosetta_trainer.batching import encode
    from rosetta_trainer.data import read_split
    from rosetta_trainer.distributed import barrier, close, init_world
    from rosetta_trainer.evaluate import model_inputs
    from rosetta_trainer.loop import Position, Trainer
    from rosetta_trainer.models import build_model, count_parameters, load_pretrained
    from rosetta_trainer.telemetry import Telemetry

    spec = document.spec
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Our own bar and log lines report progress; per-save "Writing model shards" bars are noise.
    transformers.utils.logging.disable_progress_bar()
    world = init_world(spec.training.device)
    logging.basicConfig(level=logging.INFO if world.is_main else logging.WARNING,
                        format=f"%(asctime)s rank{world.rank} %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("rosetta_trainer")
    output.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(spec.checkpoint.dir) if spec.checkpoint.dir else Path("checkpoints")
    ckpt_root = ckpt_root if ckpt_root.is_absolute() else output / ckpt_root
    checkpoints = ckpt.CheckpointManager(ckpt_root, world, keep=spec.checkpoint.keep, keep_best=spec.checkpoint.keep_best)
    resume_from = ckpt.latest_checkpoint(ckpt_root)

    # 1. data
    train_examples = read_split(spec.data, "train")
    validation, test = read_split(spec.data, "validation"), read_split(spec.data, "test")
    if not train_examples:
        raise ValueError("spec.data.train: no training examples")
    use_prefix = spec.uses_task_prefix()

    # 2. tokenizer (trained once by rank 0, then read by every rank)
    d = spec.data
    tokenizer = _prepare_tokenizer(spec, model_inputs(train_examples, d.source_lang, use_prefix),
                                   [e.target for e in train_examples], output, world, resume_from)
    corpus = encode(tokenizer, model_inputs(train_examples, d.source_lang, use_prefix),
                    [e.target for e in train_examples], d.max_source_length, d.max_target_length)

    # 3. model: the same initial weights on every rank, then per-rank dropout streams
    _seed_everything(spec.training.seed)
    if resume_from is not None:
        model = load_pretrained(str(resume_from / "model"), spec.model.attention)
    else:
        model = build_model(spec.model, vocab_size=len(tokenizer),
                            max_length=max(d.max_source_length, d.max_target_length))
    _seed_everything(spec.training.seed + world.rank)
    log.info("model %s, %.1fM parameters, %d training pairs, world size %d, device %s",
             type(model).__name__, count_parameters(model) / 1e6, len(train_examples), world.size, world.device)

    # 4. position: fresh, or exactly where the newest complete checkpoint stopped
    position = Position()
    state = rng = None
    if resume_from is not None:
        state, rng = ckpt.load_trainer_state(resume_from, world)
        position = Position(step=state["step"], epoch=state["epoch"], batch=state["batch"],
                            best_bleu=state.get("best_bleu"), best_step=state.get("best_step"),
                            last_bleu=state.get("last_bleu"))
        saved_world = ckpt.read_meta(resume_from).get("world_size")
        if saved_world != world.size:
            log.warning("resuming a world-size-%s checkpoint with %d processes: the data order "
                        "and dropout streams differ from an uninterrupted run", saved_world, world.size)
        log.info("resuming from %s (step %d)", resume_from, position.step)

    telemetry = Telemetry(output, name=document.metadata.name, namespace=document.metadata.namespace,
                          port=spec.metrics.port, tensorboard=spec.metrics.tensorboard,
                          enabled=world.is_main, resumed_step=position.step)
    # Set by the JobSet (and `rosetta run`) on every pod: how often the gang was restarted.
    restart_attempt = int(os.environ.get("ROSETTA_RESTART_ATTEMPT") or 0)
    telemetry.set_static(restarts=restart_attempt, resumed_from_step=position.step, best_bleu=position.best_bleu)
    if resume_from is not None:
        telemetry.log_checkpoint(step=position.step, path=resume_from)
    trainer = Trainer(spec=spec, world=world, model=model, tokenizer=tokenizer, train_corpus=corpus,
                      validation=validation, test=test, checkpoints=checkpoints, telemetry=telemetry,
                      document_yaml=document_yaml, position=position, progress=progress)
    if state is not None:
        trainer.load_state_dict(state)
        if rng is not None:
            ckpt.set_rng_state(rng)

    # 5. train, then report
    try:
        summary = trainer.run()
        summary["resumed_from_step"] = state["step"] if state else None
        summary["restart_attempt"] = restart_attempt
        summary["output"] = str(output)
        if world.is_main:
            path = telemetry.write_summary(summary)
            _print_result(summary, path)
        barrier(world)
        return summary
    finally:
        telemetry.close()
        close(world)
        del torch


def _prepare_tokenizer(spec, sources, targets, output: Path, world, resume_from):
    """A resumed run reuses its checkpoint's tokenizer; a new one is trained by rank 0 only."""
    from rosetta_trainer.distributed import barrier
    from rosetta_trainer.tokenization import load_tokenizer, train_tokenizer

    if resume_from is not None:
        return load_tokenizer(str(resume_from / "tokenizer"))
    if spec.tokenizer.path is not None:
        return load_tokenizer(spec.tokenizer.path)
    if spec.tokenizer.train is None:
        return load_tokenizer(spec.model.name)
    out = output / "tokenizer"
    if world.is_main:
        train_tokenizer(spec.tokenizer.train, [*sources, *targets], out)
    barrier(world)
    return load_tokenizer(str(out))


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _print_result(summary: dict, summary_path) -> None:
    bleu, best, best_step = summary.get("final_bleu"), summary.get("best_bleu"), summary.get("best_step")
    bleu_text = "-" if bleu is None else f"{bleu:.2f}"
    best_text = "-" if best is None else f"{best:.2f} (step {best_step})"
    lines = [
        f"steps: {summary['steps']}/{summary['total_steps']}   world size: {summary['world_size']}   "
        f"wall: {summary['wall_seconds']:.0f}s   tokens/s: {summary['tokens_per_s'] or 0:.0f}",
        f"validation BLEU: {bleu_text}   best: {best_text}",
    ]
    if summary.get("test"):
        lines.append(f"test BLEU: {summary['test']['bleu']:.2f}   chrF: {summary['test'].get('chrf', 0):.2f}")
    lines.append(f"checkpoint: {summary['latest_checkpoint']}")
    if summary.get("best_checkpoint"):
        lines.append(f"best checkpoint: {summary['best_checkpoint']}")
    lines.append(f"summary: {summary_path}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    from rosetta_trainer.cli import main

    sys.exit(main())
