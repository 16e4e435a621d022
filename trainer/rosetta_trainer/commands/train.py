"""Train a TranslationTraining. The same code runs alone and under torchrun:

    rosetta train -f examples/quickstart.yaml                      # one process
    torchrun --nproc-per-node 2 -m rosetta_trainer train -f FILE   # DDP on one node
    torchrun --nnodes 2 --node-rank R --master-addr HOST --master-port 29500 \\
        --nproc-per-node 8 -m rosetta_trainer train -f FILE        # two nodes

`python -m rosetta_trainer ARGS` is the same as `rosetta ARGS`. A run whose
output directory already holds a complete checkpoint resumes from it. On more
than one node the checkpoint directory must be one that every node mounts (the
run stops at start, naming it, if not); rank 0 sends the tokenizer it trains.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rosetta_contract.config import TrainerSpec
from rosetta_contract.documents import apply_overrides, read_yaml
from rosetta_contract.strict_model import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rosetta_contract.checkpoint_fields import AverageSpec
    from rosetta_contract.spec import TranslationTraining
    from rosetta_trainer.data.examples import Example
    from rosetta_trainer.engine.deepspeed_backend import DeepSpeedBackend
    from rosetta_trainer.runtime.distributed import World
    from rosetta_trainer.telemetry.telemetry import Telemetry

log = logging.getLogger(__name__)


def train_from_file(path: str, output: str | None = None, overrides: list[str] | None = None,
                    progress: bool = True) -> dict[str, Any]:
    from rosetta_contract.spec import parse_for_trainer

    raw = apply_overrides(read_yaml(path), overrides or [], str(path))
    document = parse_for_trainer(raw, str(path))  # fails before any work, listing every error
    if document.spec.mode == "evaluate":
        raise ConfigError([("spec.mode", "evaluate trains nothing: run `rosetta evaluate -f FILE` "
                                         "(or `rosetta run -f FILE`)")])
    out = Path(output or Path("runs") / document.metadata.name)
    return train(document, out, progress=progress)


def train(document: TranslationTraining, output: Path, progress: bool = True) -> dict[str, Any]:
    # torch, transformers and the modules that load them are imported here, so that `rosetta --help`
    # and a document's errors (train_from_file) stay instant.
    import torch
    import transformers

    from rosetta_contract import final_result
    from rosetta_contract.saved_training import dump_training
    from rosetta_trainer.checkpoints import checkpoint as ckpt
    from rosetta_trainer.checkpoints.deepspeed_checkpoints import is_deepspeed_checkpoint
    from rosetta_trainer.engine.deepspeed_backend import partitioned_loading
    from rosetta_trainer.engine.loop import Position, Trainer
    from rosetta_trainer.models.models import build_model, count_parameters, load_pretrained, model_from_config
    from rosetta_trainer.preparation.data_checks import describe
    from rosetta_trainer.preparation.prepare_data import prepare_data
    from rosetta_trainer.runtime.cpu_allocator import keep_freed_memory
    from rosetta_trainer.runtime.distributed import barrier, close, init_world
    from rosetta_trainer.telemetry.telemetry import Telemetry

    spec = document.spec
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Our own bar and log lines report progress; per-save "Writing model shards" bars are noise.
    transformers.utils.logging.disable_progress_bar()
    world = init_world(spec.training.device, timeout_s=spec.fault_tolerance.collective_timeout_seconds)
    logging.basicConfig(level=logging.INFO if world.is_main else logging.WARNING,
                        format=f"%(asctime)s rank{world.rank} %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("rosetta_trainer")
    if world.device.type == "cpu" and keep_freed_memory():
        log.info("CPU allocator: freed memory stays in the process (ROSETTA_CPU_ALLOCATOR=keep)")
    preflight = None
    if spec.fault_tolerance.preflight.enabled:  # before any work: a bad node costs seconds, not a model load
        from rosetta_trainer.runtime.preflight import run_preflight

        preflight = run_preflight(spec.fault_tolerance.preflight, world)
    output.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(spec.checkpoint.dir) if spec.checkpoint.dir else Path("checkpoints")
    ckpt_root = ckpt_root if ckpt_root.is_absolute() else output / ckpt_root
    ckpt.check_shared(ckpt_root, world)  # ranks on several nodes: one directory for all, or a clear error
    resume_from = ckpt.latest_checkpoint(ckpt_root)
    mirror = None
    if spec.checkpoint.s3 is not None:
        from rosetta_trainer.checkpoints import s3_mirror

        # An empty node resumes from the newest complete copy in S3.
        resume_from = s3_mirror.resume_point(spec.checkpoint.s3, ckpt_root, world)
        mirror = s3_mirror.start(spec.checkpoint, ckpt_root, world, output)  # rank 0 only
    checkpoints = ckpt.CheckpointManager(ckpt_root, world, keep=spec.checkpoint.keep, keep_best=spec.checkpoint.keep_best,
                                         on_complete=mirror.submit if mirror else None)

    # 1. data, checked on the raw text: bad files stop here, filtered pairs are counted.
    # Every rank reads the validation and test text; the training text is read by the one
    # process that tokenizes it into <output>/prepared/, as it streams (shards.py), and a restart
    # whose data files are unchanged maps the ids prepared before without reading it at all.
    data, tokenizer, corpus = prepare_data(spec, output, world, resume_from)
    log.info("data: %s", describe(data))
    for warning in data.warnings:
        log.warning("%s", warning)
    validation, test = data.validation, data.test

    # 3. model: the same initial weights on every rank, then per-rank dropout streams
    _seed_everything(spec.training.seed)
    if resume_from is not None and is_deepspeed_checkpoint(resume_from):
        # Only the config is in model/: the engine loads the weights from the ZeRO shards.
        model = model_from_config(str(resume_from / "model"), spec.model.attention)
    elif resume_from is not None:
        model = load_pretrained(str(resume_from / "model"), spec.model.attention)
    else:
        with partitioned_loading(spec, world.device.type == "cuda"):
            model = build_model(spec.model, vocab_size=len(tokenizer),
                                max_length=max(spec.data.max_source_length, spec.data.max_target_length))
    _seed_everything(spec.training.seed + world.rank)
    # The CPU threads per process: more than the cores a pod was given and the ranks wait on each other.
    log.info("model %s, %.1fM parameters, %d training pairs, world size %d, device %s, %d CPU threads",
             type(model).__name__, count_parameters(model) / 1e6, len(corpus), world.size, world.device,
             torch.get_num_threads())

    # 4. position: fresh, or exactly where the newest complete checkpoint stopped
    position = Position()
    state = rng = None
    if resume_from is not None:
        state, rng = ckpt.load_trainer_state(resume_from, world)
        position = Position(step=state["step"], epoch=state["epoch"], batch=state["batch"],
                            best_score=_saved(state, "best_score", "best_bleu"), best_step=state.get("best_step"),
                            last_score=_saved(state, "last_score", "last_bleu"))
        saved_world = ckpt.read_meta(resume_from).get("world_size")
        if saved_world != world.size:
            log.warning("resuming a world-size-%s checkpoint with %d processes: the data order "
                        "and dropout streams differ from an uninterrupted run", saved_world, world.size)
        log.info("resuming from %s (step %d)", resume_from, position.step)

    telemetry = Telemetry(output, name=document.metadata.name, namespace=document.metadata.namespace,
                          port=spec.metrics.port, tensorboard=spec.metrics.tensorboard,
                          enabled=world.is_main, resumed_step=position.step, tracking=spec.tracking,
                          config=spec.model_dump(mode="json", by_alias=True, exclude_none=True,
                                                 include=set(TrainerSpec.model_fields)))
    # Set by the JobSet (and `rosetta run`) on every pod: how often the gang was restarted.
    restart_attempt = int(os.environ.get("ROSETTA_RESTART_ATTEMPT") or 0)
    telemetry.set_static(restarts=restart_attempt, resumed_from_step=position.step, best_bleu=position.best_score)
    if resume_from is not None:
        telemetry.log_checkpoint(step=position.step, path=resume_from)
    trainer = Trainer(spec=spec, world=world, model=model, tokenizer=tokenizer, train_corpus=corpus,
                      validation=validation, test=test, checkpoints=checkpoints, telemetry=telemetry,
                      document_yaml=dump_training(document), position=position, progress=progress)
    if world.is_main and spec.distributed.backend == "deepspeed":
        import json

        # The config DeepSpeed actually ran with (generated + the spec's overrides).
        (output / "deepspeed_config.json").write_text(
            json.dumps(cast("DeepSpeedBackend", trainer.backend).config, indent=2))
    if state is not None:
        trainer.load_state_dict(state, cast(Path, resume_from))  # state comes from resume_from
        if rng is not None:
            ckpt.set_rng_state(rng)

    # 5. train, then report
    try:
        summary = trainer.run()
        if mirror is not None:  # the final (or preemption) checkpoint reaches S3 before we exit,
            # unless that would outlast the pod's grace period: S3 then keeps its previous complete one.
            summary["s3_mirror"] = mirror.finish(timeout=trainer.stop.remaining_grace())
            mirror = None
        summary["resumed_from_step"] = state["step"] if state else None
        summary["restart_attempt"] = restart_attempt
        summary["output"] = str(output)
        summary["data"] = data.report
        if preflight is not None:
            summary["preflight"] = preflight.as_dict()
        if spec.checkpoint.average is not None and summary.get("completed") and not summary.get("stopped_early"):
            summary["averaged"] = average_at_end(spec, summary, ckpt_root, world, tokenizer, validation, test,
                                                 telemetry)
        if spec.distributed.backend == "deepspeed" and world.is_main:
            summary["export"] = _export_deepspeed(summary, output)
        if world.is_main:
            path = telemetry.write_summary(summary)
            _print_result(summary, path)
            if summary.get("completed"):
                final_result.report(summary)  # for the operator: the last scrape may predate the end
        barrier(world)
        return summary
    finally:
        if mirror is not None:  # the run failed: still let the queued upload land
            mirror.finish(timeout=trainer.stop.remaining_grace())
        telemetry.close()
        trainer.backend.release()
        close(world)
        del torch


def _export_deepspeed(summary: dict[str, Any], output: Path) -> dict[str, str]:
    """ZeRO checkpoints hold shards: gather the final and best ones into Hugging Face models
    under <output>/export/ (what `rosetta evaluate`/`translate` and from_pretrained load)."""
    from rosetta_trainer.checkpoints.deepspeed_checkpoints import export_hf  # torch, as in train()

    exported: dict[str, str] = {}
    for which, key in (("final", "latest_checkpoint"), ("best", "best_checkpoint")):
        path = summary.get(key)
        if path and Path(path).is_dir():
            exported[which] = str(export_hf(Path(path), output / "export" / which))
    return exported


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _saved(state: dict[str, Any], key: str, before: str) -> Any:
    """A trainer-state value, also from a checkpoint written before `before` was renamed `key`."""
    return state[key] if key in state else state.get(before)


def _print_result(summary: dict[str, Any], summary_path: Path | None) -> None:
    from rosetta_contract.metrics import LABELS

    metric = LABELS[summary.get("primary_metric", "bleu")]
    bleu, best, best_step = summary.get("final_score"), summary.get("best_score"), summary.get("best_step")
    bleu_text = "-" if bleu is None else f"{bleu:.2f}"
    best_text = "-" if best is None else f"{best:.2f} (step {best_step})"
    lines = [
        f"steps: {summary['steps']}/{summary['total_steps']}   world size: {summary['world_size']}   "
        f"wall: {summary['wall_seconds']:.0f}s   tokens/s: {summary['tokens_per_s'] or 0:.0f}",
        f"validation {metric}: {bleu_text}   best: {best_text}",
    ]
    test = summary.get("test") or {}
    test_scores = [f"{label}: {test[name]:.2f}" for name, label in LABELS.items() if test.get(name) is not None]
    if test_scores:
        lines.append("test " + "   ".join(test_scores))
    averaged = summary.get("averaged") or {}
    if averaged.get("path"):
        scores = averaged.get("test") or averaged.get("validation") or {}
        split = "test" if averaged.get("test") else "validation"
        figures = [f"{label}: {scores[name]:.2f}" for name, label in LABELS.items() if scores.get(name) is not None]
        lines.append(f"averaged ({averaged['selection']}) {split} " + "   ".join(figures))
    elif averaged.get("error"):
        lines.append(f"averaged: not written: {averaged['error']}")
    lines.append(f"checkpoint: {summary['latest_checkpoint']}")
    if summary.get("best_checkpoint"):
        lines.append(f"best checkpoint: {summary['best_checkpoint']}")
    if averaged.get("path"):
        lines.append(f"averaged checkpoint: {averaged['path']}")
    lines.append(f"summary: {summary_path}")
    print("\n".join(lines), flush=True)


def average_at_end(spec: TrainerSpec, summary: dict[str, Any], ckpt_root: Path, world: World,
                   tokenizer: PreTrainedTokenizerBase, validation: list[Example], test: list[Example],
                   telemetry: Telemetry) -> dict[str, Any]:
    """checkpoint.average after a completed run. Collective: rank 0 averages into
    <checkpoint dir>/averaged, then every rank loads it and evaluates its share of the validation
    (the same sample as during training) and test sets. Returns summary["averaged"].

    A run that cannot average (too few checkpoints, e.g. after an `epochs` run shorter than
    expected) still succeeds: the error is in the summary and the log, and the checkpoints are
    there for `rosetta average`. Failing the run would only restart it into the same error.
    """
    # These load torch, as in train().
    from rosetta_trainer.checkpoints.averaging import AVERAGED_DIR, AveragingError, average_checkpoints, select
    from rosetta_trainer.evaluation.evaluate import evaluate_examples
    from rosetta_trainer.models.models import load_pretrained
    from rosetta_trainer.runtime.distributed import barrier, broadcast_object

    average = cast("AverageSpec", spec.checkpoint.average)  # the caller averages only with one set
    result: dict[str, Any] = {"selection": f"{average.selection} {average.count}"}
    error = None
    if world.is_main:
        try:
            chosen = select(ckpt_root, **{average.selection: average.count})
            out = average_checkpoints(chosen, ckpt_root / AVERAGED_DIR, result["selection"])
            result.update(path=str(out), checkpoints=[p.name for p in chosen])
        except AveragingError as exc:
            error = str(exc)
    error = broadcast_object(world, error)
    if error is not None:
        log.warning("checkpoint.average: %s; the final model stands alone", error)
        return {**result, "error": error}
    barrier(world)
    # transformers types PreTrainedModel.to through a decorator that loses its signature.
    model = load_pretrained(str(ckpt_root / AVERAGED_DIR / "model")).to(world.device)  # type: ignore[arg-type]
    ev = spec.evaluation
    for split, examples in (("validation", validation[: ev.max_samples] if ev.max_samples else validation),
                            ("test", test)):
        if examples and ev.at_end:
            with telemetry.phase("evaluate"):  # a beat per batch, as during training
                scores, _ = evaluate_examples(model, tokenizer, examples, spec, world, on_batch=telemetry.beat)
            result[split] = scores
            if world.is_main:
                telemetry.log_eval({"step": summary["steps"], "split": f"{split}-averaged", **scores})
    del model
    if world.is_main:
        log.info("averaged %s into %s", ", ".join(result.get("checkpoints", [])), result.get("path"))
    return result
