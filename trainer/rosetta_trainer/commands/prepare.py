"""`rosetta prepare -f FILE [-o OUTPUT]`, and the stage job's `rosetta stage --prepare OUTPUT`: what a
start of `rosetta train` does before it builds the model, by itself: check the data, train or load
the tokenizer, and write the prepared training data (shards.py) into the training's output.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.checkpoints import checkpoint as ckpt
from rosetta_trainer.preparation.data_checks import describe
from rosetta_trainer.preparation.prepare_data import prepare_data
from rosetta_trainer.preparation.shards import ShardedCorpus
from rosetta_trainer.runtime.distributed import init_world

log = logging.getLogger(__name__)


def prepare_command(args: argparse.Namespace) -> int:
    """`rosetta prepare`: read and check the data, train or load the tokenizer as `rosetta train`
    would, and write the prepared training data under <output>/prepared/."""
    from rosetta_contract.spec import load_for_trainer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    document = load_for_trainer(args.file, args.overrides)
    prepare_training(document.spec, Path(args.output or Path("runs") / document.metadata.name), args.workers)
    return 0


def prepare_training(spec: TrainerSpec, output: Path, workers: int | None = None) -> ShardedCorpus:
    """What a start of `rosetta train` does before it builds the model: check the data, train or
    load the tokenizer (saved to <output>/tokenizer when trained) and write <output>/prepared/, each
    step skipped when its result is there already, as the training would find it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    output.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(spec.checkpoint.dir) if spec.checkpoint.dir else Path("checkpoints")
    ckpt_root = ckpt_root if ckpt_root.is_absolute() else output / ckpt_root
    data, _, corpus = prepare_data(spec, output, init_world("cpu"), ckpt.latest_checkpoint(ckpt_root), workers)
    log.info("data: %s", describe(data))
    meta = corpus.meta
    print(f"prepared: {corpus.path}\npairs: {meta['pairs']}   source tokens: {meta['tokens']['source']}   "
          f"target tokens: {meta['tokens']['target']}   ids: {meta['dtype']}", flush=True)
    return corpus
