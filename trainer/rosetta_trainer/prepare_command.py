"""`rosetta prepare -f FILE [-o OUTPUT]`, and the stage job's `rosetta stage --prepare OUTPUT`: what a
start of `rosetta train` does before it builds the model, by itself: check the data, train or load
the tokenizer, and write the prepared training data (shards.py) into the training's output.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rosetta_trainer.shards import PREPARED_DIR, ShardedCorpus, find_prepared, prepare_corpus

log = logging.getLogger(__name__)


def prepare_command(args) -> int:
    """`rosetta prepare`: read and check the data, train or load the tokenizer as `rosetta train`
    would, and write the prepared training data under <output>/prepared/."""
    from rosetta_contract.spec import load_for_trainer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    document = load_for_trainer(args.file, args.overrides)
    prepare_training(document.spec, Path(args.output or Path("runs") / document.metadata.name), args.workers)
    return 0


def prepare_training(spec, output: Path, workers: int | None = None) -> ShardedCorpus:
    """What a start of `rosetta train` does before it builds the model: check the data, train or
    load the tokenizer (saved to <output>/tokenizer when trained) and write <output>/prepared/, each
    step skipped when its result is there already, as the training would find it."""
    from rosetta_trainer import checkpoint as ckpt
    from rosetta_trainer.__main__ import _prepare_tokenizer
    from rosetta_trainer.data_checks import SplitReport, describe, read_checked
    from rosetta_trainer.data_identity import data_identity
    from rosetta_trainer.distributed import init_world

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    output.mkdir(parents=True, exist_ok=True)
    world = init_world("cpu")
    ckpt_root = Path(spec.checkpoint.dir) if spec.checkpoint.dir else Path("checkpoints")
    ckpt_root = ckpt_root if ckpt_root.is_absolute() else output / ckpt_root
    d = spec.data
    if not d.train:
        raise ValueError("spec.data.train: no training examples")
    data = read_checked(d, read_train=False)
    use_prefix = spec.uses_task_prefix()
    identity = data_identity(d, use_prefix=use_prefix)
    text = data.training_text.pairs(use_prefix)
    tokenizer = _prepare_tokenizer(spec, text, output, world, ckpt.latest_checkpoint(ckpt_root), identity)
    found = find_prepared(output / PREPARED_DIR, identity, tokenizer, d.max_source_length, d.max_target_length, world)
    if found:
        corpus, report = found
    else:
        corpus, report = prepare_corpus(output / PREPARED_DIR, tokenizer, text, d.max_source_length,
                                        d.max_target_length, world, workers=workers, identity=identity)
    data.reports["train"] = SplitReport.from_dict(report)
    log.info("data: %s", describe(data))
    meta = corpus.meta
    print(f"prepared: {corpus.path}\npairs: {meta['pairs']}   source tokens: {meta['tokens']['source']}   "
          f"target tokens: {meta['tokens']['target']}   ids: {meta['dtype']}", flush=True)
    return corpus
