"""Steps 1 and 2 of a training's start, shared with `rosetta prepare` and the stage job: the data checked,
the tokenizer trained or loaded, the training data tokenized into <output>/prepared/ (shards.py), each
skipped when its result is there."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.models.tokenization import load_tokenizer, train_tokenizer
from rosetta_trainer.preparation.data_checks import CheckedData, SplitReport, TrainingText, read_checked
from rosetta_trainer.preparation.data_identity import data_identity
from rosetta_trainer.preparation.shards import PREPARED_DIR, ShardedCorpus, find_prepared, prepare_corpus
from rosetta_trainer.preparation.tokenizer_reuse import forget, remember, reusable, trained_from
from rosetta_trainer.runtime.cpu_allocator import give_back_freed_memory
from rosetta_trainer.runtime.distributed import World, broadcast_object, failure, raise_failures

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def prepare_data(spec: TrainerSpec, output: Path, world: World, resume_from: Path | None,
                 workers: int | None = None) -> tuple[CheckedData, PreTrainedTokenizerBase, ShardedCorpus]:
    """(checked data, tokenizer, prepared training corpus): steps 1 and 2 of a start, shared with
    `rosetta prepare` and the stage job (prepare_command.py), each skipped when its result is there."""
    d = spec.data
    if not d.train:
        raise ValueError("spec.data.train: no training examples")
    use_prefix = spec.uses_task_prefix()
    identity = data_identity(d, use_prefix=use_prefix)
    data = read_checked(d, read_train=False)
    text = cast(TrainingText, data.training_text).pairs(use_prefix)  # read_train=False: set
    # The checkpoint's tokenizer, the named one, or one trained once by rank 0 (or reused when
    # trained from these very files before, e.g. by `rosetta prepare`), then sent to every rank.
    tokenizer = prepare_tokenizer(spec, text, output, world, resume_from, identity)
    found = find_prepared(output / PREPARED_DIR, identity, tokenizer, d.max_source_length, d.max_target_length, world)
    report: dict[str, Any] | None
    if found:
        corpus, report = found
    else:
        corpus, report = prepare_corpus(output / PREPARED_DIR, tokenizer, text, d.max_source_length,
                                        d.max_target_length, world, workers=workers, identity=identity)
    data.reports["train"] = SplitReport.from_dict(cast("dict[str, Any]", report))  # TrainingPairs report
    return data, tokenizer, corpus


def prepare_tokenizer(spec: TrainerSpec, text: Iterable[tuple[str, str]], output: Path, world: World,
                      resume_from: Path | None, identity: str | None = None) -> PreTrainedTokenizerBase:
    """A resumed run reuses its checkpoint's tokenizer; a new one is trained by rank 0 only, from
    `text` ((source, target) pairs, read as they stream), which saves it to <output>/tokenizer and
    sends its files to the other ranks: they load it from a private directory, so no rank needs
    to see rank 0's output (a pod's own disk on another node). A tokenizer <output>/tokenizer
    holds already, trained with these settings from data files of this `identity`
    (data_identity.py), is reused without reading the text: the one `rosetta prepare` (the stage
    job of data.prepare: BeforeTraining) trained before the training started."""
    if resume_from is not None:
        return load_tokenizer(str(resume_from / "tokenizer"))
    if spec.tokenizer.path is not None:
        return load_tokenizer(spec.tokenizer.path)
    if spec.tokenizer.train is None:
        return load_tokenizer(cast(str, spec.model.name))  # no tokenizer of its own: the model's
    out = output / "tokenizer"
    files: dict[str, bytes] | None = None
    failed: tuple[str, str] | None = None
    if world.is_main:
        try:
            record = trained_from(spec.tokenizer.train, identity)
            if reusable(out, record):
                logging.getLogger("rosetta_trainer").info(
                    "tokenizer: reusing %s, trained with these settings from these data files", out)
            else:
                forget(out)  # a tokenizer half-overwritten below must not pass for the old one
                train_tokenizer(spec.tokenizer.train, text, out)
                give_back_freed_memory()
                remember(out, record)
        except Exception as exc:  # reading the text can fail: the other ranks must hear of it
            if not world.distributed:
                raise
            failed = failure(exc, world.rank, "train the tokenizer")
        else:
            files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    files, failed = broadcast_object(world, (files, failed))
    raise_failures([failed] if failed else [])
    if world.is_main:
        return load_tokenizer(str(out))
    with tempfile.TemporaryDirectory(prefix="rosetta-tokenizer-") as private:
        for name, data in cast("dict[str, bytes]", files).items():  # rank 0 failed: raised above
            path = Path(private) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return load_tokenizer(private)  # read into memory: the directory may go
