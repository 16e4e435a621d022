"""The training loop: steps, accumulation, logging, evaluation and checkpoints.

Per-step work avoids host synchronisation: losses, token counts and gradient
norms stay on the device and are read (and all-reduced) once per log interval.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, cast

import torch
import torch.distributed as dist

from rosetta_contract.config import TrainerSpec
from rosetta_contract.metrics import LABELS
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.checkpoints.checkpoint import CheckpointManager, directory_bytes
from rosetta_trainer.data import batching
from rosetta_trainer.data.batching import Corpus, batch_shapes
from rosetta_trainer.data.examples import Example
from rosetta_trainer.engine.backends import build_backend, compile_stats
from rosetta_trainer.engine.preemption import StopRequested
from rosetta_trainer.engine.step_clock import StepClock
from rosetta_trainer.engine.step_window import BATCH_COUNTS, STEP_CLOCK, Stat, new_window
from rosetta_trainer.evaluation.evaluate import evaluate_examples, primary_metric, validation_loss
from rosetta_trainer.planning.flops import Seq2SeqDims, peak_for_run, training_flops
from rosetta_trainer.runtime.distributed import (
    World,
    all_gather_objects,
    all_reduce_sum,
    all_reduce_sum_async,
    control_group,
)
from rosetta_trainer.runtime.fault_hooks import FaultHooks
from rosetta_trainer.telemetry.telemetry import Telemetry

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Position:
    """Where the run is: optimizer steps taken and the next batch of this rank's epoch plan."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    best_score: float | None = None  # of the primary metric (Trainer.metric), as are the two below
    best_step: int | None = None
    last_score: float | None = None
    # Newest validation loss, carried on every metrics.jsonl line (not saved: a resumed run
    # reports none until its first evaluation).
    last_val_loss: float | None = None


def tokens_by_node(per_rank: list[float], ranks_per_node: int) -> dict[str, float]:
    """Sum each node's ranks (node = rank // ranks per node, as torchrun numbers them)."""
    out: dict[str, float] = {}
    for rank, tokens in enumerate(per_rank):
        node = str(rank // ranks_per_node)
        out[node] = out.get(node, 0.0) + tokens
    return out


class NonFiniteError(RuntimeError):
    """The loss or gradients stopped being finite and spec.training.nanPolicy is 'stop'."""


class Trainer:
    def __init__(self, *, spec: TrainerSpec, world: World, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 train_corpus: Corpus,
                 validation: list[Example], test: list[Example], checkpoints: CheckpointManager,
                 telemetry: Telemetry, document_yaml: str, position: Position, progress: bool) -> None:
        self.spec, self.world, self.tokenizer = spec, world, tokenizer
        self.corpus, self.validation, self.test = train_corpus, validation, test
        self.checkpoints, self.telemetry, self.document_yaml = checkpoints, telemetry, document_yaml
        self.pos, self.progress = position, progress
        t = spec.training
        self.dims = Seq2SeqDims.from_hf_config(model.config)
        self.pad_id = tokenizer.pad_token_id
        self.shapes = batch_shapes(spec)
        self.src_len, self.tgt_len = train_corpus.lengths()
        self.batches_per_epoch = len(self._plan(0))
        if self.batches_per_epoch == 0:
            raise ValueError("spec.training.batch: the training data gives no batch for every rank "
                             f"(world size {world.size}); add data or lower the world size")
        # TrainingSpec sets one of maxSteps and epochs.
        self.total_steps = t.max_steps or max(1, math.ceil(cast(float, t.epochs) * self.batches_per_epoch
                                                            / t.gradient_accumulation))
        self.backend = build_backend(spec, world, model, self.total_steps)
        self.model = self.backend.model
        self.skipped_steps: list[int] = []
        # (step, gradient norm, skipped flag) of the steps since the flags were last read: device
        # tensors, read together once per log interval (and before a checkpoint), not once per step.
        self._unread: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        gpu = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else None
        try:
            self.peak, peak_source = peak_for_run(gpu, t.precision, spec.metrics.peak_flops)
        except ValueError as exc:  # a bad $ROSETTA_PEAK_FLOPS (the spec's field is validated already)
            raise ConfigError([("env", str(exc))]) from None
        if world.is_main:
            if self.peak is not None:
                log.info("MFU against %.4g FLOP/s per device (%s)", self.peak, peak_source)
            elif gpu is not None:
                log.info("no peak FLOP/s known for %s at %s: set spec.metrics.peakFlops to report MFU", gpu, t.precision)
        self.stop = StopRequested()
        self.faults = FaultHooks.from_env(world.rank)
        self._control_group = control_group(world)
        self._stop_vote: tuple[dist.Work, torch.Tensor] | None = None
        self.stop_checkpoint_seconds: float | None = None
        # The validation score that picks the best checkpoint: BLEU, or ROUGE-L for summarization.
        # Position's, the trainer state's and the summary's *_score fields and a checkpoint meta's
        # "score" hold it, next to its name; the Prometheus gauge keeps its name, rosetta_best_bleu.
        self.metric = primary_metric(spec)
        ev = spec.evaluation
        self.eval_interval = ev.interval or spec.checkpoint.interval
        self.eval_set = validation[: ev.max_samples] if ev.max_samples else validation

    # ---------------------------------------------------------------- set-up
    def _plan(self, epoch: int) -> batching.EpochPlan:
        b = self.spec.training.batch
        plan = batching.plan_epoch(self.src_len, self.tgt_len, seed=self.spec.training.seed, epoch=epoch,
                                   max_tokens=b.tokens, max_sentences=b.sentences, world_size=self.world.size,
                                   shapes=self.shapes)
        return batching.rank_batches(plan, self.world.rank, self.world.size)

    def state_dict(self) -> dict[str, Any]:
        p = self.pos
        return {
            **self.backend.state_dict(),
            "step": p.step, "epoch": p.epoch, "batch": p.batch, "best_score": p.best_score,
            "best_step": p.best_step, "last_score": p.last_score, "metric": self.metric, "total_steps": self.total_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        self.backend.load_state_dict(state, checkpoint)
        self.skipped_steps = list(state.get("skipped_steps", []))

    # ------------------------------------------------------------------ loop
    def _batches(self) -> Generator[tuple[int, int, dict[str, torch.Tensor]], None, None]:
        """Endless stream of (epoch, index-in-epoch, batch) from the saved position on."""
        epoch, start = self.pos.epoch, self.pos.batch
        pin = self.world.device.type == "cuda"
        b = self.spec.training.batch
        collation = batching.Collation(self.pad_id, self.shapes, b.tokens, b.sentences,
                                       functools.partial(training_flops, self.dims))
        while True:
            plan = self._plan(epoch)
            batches = batching.iterate(self.corpus, plan, collation, start, pin)
            for i, batch in enumerate(batches, start):
                yield epoch, i, batch
            epoch, start = epoch + 1, 0

    def _micro_step(self, batch: dict[str, torch.Tensor], boundary: bool, accumulation: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.world.device
        input_ids = batch["input_ids"].to(dev, non_blocking=True)
        attention = batch["attention_mask"].to(dev, non_blocking=True)
        labels = batch["labels"].to(dev, non_blocking=True)
        loss, n_tokens = self.backend.forward_loss(input_ids, attention, labels)
        self.backend.backward(loss, accumulation, boundary)
        return loss.detach(), n_tokens

    def run(self) -> dict[str, Any]:
        t, world, pos = self.spec.training, self.world, self.pos
        accum = t.gradient_accumulation
        self.stop.install()
        self.telemetry.set_static(total_steps=self.total_steps, world_size=world.size)
        stream = self._batches()
        window = new_window()
        clock = StepClock(world.device)
        loss_window = torch.zeros((), device=world.device)
        window_start = time.perf_counter()
        run_start = time.perf_counter()
        totals = {"tokens": 0.0, "seconds": 0.0}
        grad_norm = torch.zeros((), device=world.device)
        last_record: dict[str, Any] = {}
        bar = self._progress_bar()
        self.model.train()
        stopped_early = False
        # Closing the stream shuts its loader worker down through the loader's queue; on an error
        # the worker (which ignores SIGTERM, see batching.py) would otherwise hold up the exit.
        try:
            while pos.step < self.total_steps:
                for micro in range(accum):
                    waited = time.perf_counter()
                    epoch, index, batch = next(stream)
                    window[Stat.DATA_WAIT_S] += time.perf_counter() - waited
                    started = clock.mark()
                    loss, _ = self._micro_step(batch, boundary=micro == accum - 1, accumulation=accum)
                    clock.add("compute", started)
                    loss_window += loss / accum
                    window[BATCH_COUNTS] += batch["counts"]
                    pos.epoch, pos.batch = epoch, index + 1
                started = clock.mark()
                grad_norm = self._optimizer_step()
                clock.add("optimizer", started)
                pos.step += 1
                window[Stat.STEPS] += 1
                self.telemetry.beat()
                if bar is not None:
                    bar.update(1)

                if pos.step % t.log_interval == 0 or pos.step == self.total_steps:
                    self._read_step_flags()
                    window[STEP_CLOCK] = torch.tensor(clock.take(), dtype=torch.float64)
                    last_record = self._log(window, loss_window, grad_norm, time.perf_counter() - window_start, totals)
                    if bar is not None:
                        bar.set_postfix(loss=f"{last_record['loss']:.3f}", tok_s=f"{last_record['tokens_per_s']:.0f}",
                                        bleu="-" if pos.last_score is None else f"{pos.last_score:.1f}")
                    window.zero_()
                    loss_window.zero_()
                    window_start = time.perf_counter()

                if pos.step % self.eval_interval == 0 and self.eval_set:
                    self._evaluate("validation", self.eval_set)
                stop_now = self._stop_agreed()
                if pos.step % self.spec.checkpoint.interval == 0 or pos.step == self.total_steps or stop_now:
                    self._save()
                if stop_now:
                    stopped_early = True
                    # Every rank reports its own signal (maybe only one got it); the summary the slowest.
                    written = all_gather_objects(world, self.stop.checkpoint_written(pos.step))
                    self.stop_checkpoint_seconds = max((w for w in written if w is not None), default=None)
                    break
                self.faults.after_step(pos.step)
        finally:
            stream.close()
        self._read_step_flags()
        if bar is not None:
            bar.close()
        self.stop.restore()
        return self._finish(last_record, totals, time.perf_counter() - run_start, stopped_early)

    def _optimizer_step(self) -> torch.Tensor:
        grad_norm, skipped = self.backend.step()
        self._unread.append((self.pos.step + 1, grad_norm, skipped))
        return grad_norm

    def _read_step_flags(self) -> None:
        """Read the skipped-step flags of the steps since the last read, in one transfer, and apply
        spec.training.nanPolicy to each skipped one."""
        if not self._unread:
            return
        unread, self._unread = self._unread, []
        read = torch.stack([torch.stack([norm.float(), flag]) for _, norm, flag in unread]).cpu().tolist()
        skipped = [(step, norm) for (step, _, _), (norm, flag) in zip(unread, read) if flag]
        if skipped:
            self.backend.unskip_schedule(len(skipped))
        for step, norm in skipped:
            self._non_finite(step, norm)

    def _non_finite(self, step: int, grad_norm: float) -> None:
        """A step whose loss or gradients were not finite was not applied: record it, then
        go on (nanPolicy: skip) or stop with the weights of the last applied step (stop)."""
        self.skipped_steps.append(step)
        message = (f"step {step}: non-finite gradient norm ({grad_norm:g}); the update was "
                   f"not applied ({len(self.skipped_steps)} skipped so far)")
        if self.world.is_main:
            self.telemetry.log_event({"event": "non_finite", "step": step, "grad_norm": grad_norm,
                                      "policy": self.spec.training.nan_policy})
        if self.spec.training.nan_policy == "stop":
            raise NonFiniteError(message + "; spec.training.nanPolicy is 'stop'. The newest checkpoint "
                                 "is unaffected; lower the learning rate or set nanPolicy: skip")
        log.warning("%s; nanPolicy is 'skip'", message)

    def _stop_agreed(self) -> bool:
        """All ranks must stop at the same step, even when only some received the signal.

        Each step starts a sum-reduce of the local flags on a CPU (gloo) group without waiting
        for it, and the next step reads the result: no host sync on the GPU stream, and every
        rank stops on the step after the one where any rank saw the signal.
        """
        if not self.world.distributed:
            return self.stop.flag
        agreed = False
        if self._stop_vote is not None:
            work, flag = self._stop_vote
            work.wait()
            agreed = bool(flag.item() > 0)
            self._stop_vote = None
        if not agreed and self.pos.step < self.total_steps:
            flag = torch.tensor([1.0 if self.stop.flag else 0.0])
            self._stop_vote = (all_reduce_sum_async(self.world, flag, self._control_group), flag)
        return agreed

    def _log(self, window: torch.Tensor, loss_window: torch.Tensor, grad_norm: torch.Tensor, seconds: float,
             totals: dict[str, float]) -> dict[str, Any]:
        world, pos = self.world, self.pos
        w = window.clone()
        w[Stat.LOSS] = float(loss_window.item())
        # Each rank's tokens in its own slot, summed in the same collective: tokens/s per node.
        mine = torch.zeros(world.size, dtype=torch.float64)
        mine[world.rank] = window[Stat.TOKENS]
        reduced = all_reduce_sum(world, torch.cat([w, mine]).to(world.device)).cpu()
        steps = max(1.0, float(window[Stat.STEPS]))
        loss = float(reduced[Stat.LOSS]) / world.size / steps
        tokens, tgt_tokens, samples, flops = (float(x) for x in reduced[BATCH_COUNTS])
        data_wait, compute, optimizer = (float(x) / world.size / steps
                                         for x in reduced[Stat.DATA_WAIT_S:Stat.OPTIMIZER_S + 1])
        per_node = tokens_by_node(reduced[len(Stat):].tolist(), world.local_size or world.size)
        totals["tokens"] += tokens
        totals["seconds"] += seconds
        flops_per_s = flops / seconds if seconds > 0 else None
        record = {
            "step": pos.step,
            "total_steps": self.total_steps,
            "epoch": round(pos.epoch + pos.batch / max(1, self.batches_per_epoch), 4),
            "loss": loss,
            "lr": self.backend.last_lr(),
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "target_tokens_per_s": tgt_tokens / seconds if seconds > 0 else None,
            "samples_per_s": samples / seconds if seconds > 0 else None,
            "grad_norm": float(grad_norm.item()),
            "flops_per_s": flops_per_s,
            "mfu": (flops_per_s / (self.peak * world.size)) if (self.peak and flops_per_s) else None,
            "step_time_s": seconds / steps,
            "data_wait_s": data_wait,
            "compute_s": compute,
            "optimizer_s": optimizer,
            "node_tokens_per_s": {n: v / seconds for n, v in per_node.items()} if seconds > 0 else None,
            "skipped_steps": len(self.skipped_steps),
            "val_loss": pos.last_val_loss,
        }
        gpu_memory = self._gpu_memory_by_rank()
        if gpu_memory is not None:
            record["gpu_memory_bytes"] = max(gpu_memory)
        if world.is_main:
            self.telemetry.log_step(record)
            if gpu_memory is not None:
                self.telemetry.log_rank_values("gpu_memory_bytes", gpu_memory)
        return record

    def _gpu_memory_by_rank(self) -> list[float] | None:
        """Peak bytes PyTorch allocated on each rank's GPU; None on CPU (no collective either:
        every rank of a run has the same device type)."""
        world = self.world
        if world.device.type != "cuda":
            return None
        mine = torch.zeros(world.size, dtype=torch.float64, device=world.device)
        mine[world.rank] = float(torch.cuda.max_memory_allocated(world.device))
        return [float(x) for x in all_reduce_sum(world, mine).cpu()]

    def _evaluate(self, split: str, examples: list[Example]) -> dict[str, Any]:
        # A beat per batch: an evaluation of any length is progress, only a stuck batch is a stall.
        with self.telemetry.phase("evaluate"):
            scores, _ = evaluate_examples(self.model, self.tokenizer, examples, self.spec, self.world,
                                          on_batch=self.telemetry.beat)
            loss = validation_loss(self.model, self.tokenizer, examples, self.spec, self.world,
                                   on_batch=self.telemetry.beat)
        record = {"step": self.pos.step, "split": split, "loss": loss, **scores}
        if split == "validation":
            self.pos.last_val_loss = loss
        metric = self.metric
        if split == "validation" and scores.get(metric) is not None:
            self.pos.last_score = scores[metric]
            if self.pos.best_score is None or scores[metric] > self.pos.best_score:
                self.pos.best_score, self.pos.best_step = scores[metric], self.pos.step
        if self.world.is_main:
            self.telemetry.log_eval(record)
            self.telemetry.set_static(best_bleu=self.pos.best_score)
            value = scores.get(metric)
            log.info("step %d %s %s %s", self.pos.step, split, LABELS[metric], "-" if value is None else f"{value:.2f}")
        self.model.train()
        return record

    def _save(self) -> Path:
        self._read_step_flags()  # a stop (nanPolicy: stop) comes before the checkpoint, not after it
        evaluated_now = self.pos.step % self.eval_interval == 0 and bool(self.eval_set)
        # "score" is the primary metric's value (what best() ranks by); "metric" says which one it is.
        meta = {"epoch": self.pos.epoch, "score": self.pos.last_score if evaluated_now else None,
                "metric": self.metric}
        if not self.backend.weights_finite():
            raise NonFiniteError(f"step {self.pos.step}: the model has non-finite weights; no checkpoint "
                                 "was written (the newest one on disk is unaffected)")
        started = time.perf_counter()
        with self.telemetry.phase("checkpoint"):
            path = self.checkpoints.save(step=self.pos.step, backend=self.backend, tokenizer=self.tokenizer,
                                         trainer_state=self.state_dict(), document_yaml=self.document_yaml,
                                         meta=meta)
        if self.world.is_main:
            self.telemetry.log_checkpoint(step=self.pos.step, path=path, seconds=time.perf_counter() - started,
                                          size_bytes=directory_bytes(path))
        return path

    def _finish(self, last: dict[str, Any], totals: dict[str, float], wall: float,
                stopped_early: bool) -> dict[str, Any]:
        pos = self.pos
        metric = self.metric
        final_val = test = None
        if not stopped_early and self.spec.evaluation.at_end:
            if self.eval_set:
                already = pos.step % self.eval_interval == 0
                final_val = {metric: pos.last_score} if already else self._evaluate("validation", self.eval_set)
            if self.test:
                test = self._evaluate("test", self.test)
        best = self.checkpoints.best()
        return {
            "steps": pos.step,
            "total_steps": self.total_steps,
            "completed": pos.step >= self.total_steps,
            "stopped_early": stopped_early,
            "stop_checkpoint_seconds": self.stop_checkpoint_seconds,
            "skipped_steps": self.skipped_steps,
            "backend": self.backend.name,
            "zero_stage": self.backend.zero_stage,
            "epochs": round(pos.epoch + pos.batch / max(1, self.batches_per_epoch), 4),
            "final_loss": last.get("loss"),
            "primary_metric": metric,
            "final_score": (final_val or {}).get(metric, pos.last_score),
            "best_score": pos.best_score,
            "best_step": pos.best_step,
            # The names of earlier versions, whatever the metric; kept for scripts that read them.
            "final_bleu": (final_val or {}).get(metric, pos.last_score),
            "best_bleu": pos.best_score,
            "test": test,
            "wall_seconds": round(wall, 3),
            "tokens_per_s": totals["tokens"] / totals["seconds"] if totals["seconds"] else None,
            "world_size": self.world.size,
            "device": str(self.world.device),
            "precision": self.spec.training.precision,
            "peak_flops": self.peak,
            "compile": compile_stats() if self.spec.training.compile != "none" else None,
            "latest_checkpoint": str(self.checkpoints.root / f"step-{pos.step:08d}"),
            "best_checkpoint": str(best) if best else None,
        }

    def _progress_bar(self) -> Any:  # a tqdm bar, or None
        if not (self.progress and self.world.is_main):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.total_steps, initial=self.pos.step, desc="train", unit="step", dynamic_ncols=True)
