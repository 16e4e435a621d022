"""How the processes share a step: torch DDP or a DeepSpeed ZeRO engine.

The loop only ever asks a backend to run a micro-batch forward/backward, to
take the optimizer step at the end of an accumulation window, and to save or
load its state. Everything that differs between DDP and DeepSpeed (who owns
the optimizer, loss scaling, gradient reduction, sharded checkpoints) lives
behind that interface.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.engine.deepspeed_backend import DeepSpeedBackend
from rosetta_trainer.engine.master_weights import MasterWeights
from rosetta_trainer.engine.optimization import make_optimizer, make_scheduler, param_groups
from rosetta_trainer.models.losses import logit_chunks
from rosetta_trainer.models.saving import save_pretrained
from rosetta_trainer.models.seq2seq_loss import Seq2SeqLoss
from rosetta_trainer.runtime.distributed import World

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_stats() -> dict[str, int]:
    """What torch.compile captured in this process: graphs (more than a handful means it kept
    recompiling) and graph breaks (each one a return to eager Python inside the model)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


# Compilations a run may make before dynamo gives up and runs eagerly: the step is compiled with
# dynamic batch and length dimensions, so a handful covers every shape of an epoch (dynamo's
# default of 8 is for functions that specialise on every shape).
RECOMPILE_LIMIT = 16


# torch.compile's backend: inductor (the default) generates the kernels; "aot_eager" stops after the
# graph capture and autograd's partition, which shows in seconds, not minutes, whether a model
# compiles whole (bench/gpu_checks.py --cpu rehearses with it; also a first step when a compiled run fails).
COMPILE_BACKEND_ENV = "ROSETTA_COMPILE_BACKEND"


def compile_step(module: torch.nn.Module, mode: str, backend: str | None = None) -> torch.nn.Module:
    """torch.compile `module` in `mode` ("default", "reduce-overhead", "max-autotune", ...), with
    `backend` (default: $ROSETTA_COMPILE_BACKEND, else inductor)."""
    import os

    import torch._dynamo

    backend = backend or os.environ.get(COMPILE_BACKEND_ENV) or "inductor"
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    # Compiling a module gives an OptimizedModule, a module; torch annotates it as a plain callable.
    if backend != "inductor":
        return cast(torch.nn.Module, torch.compile(module, backend=backend))
    return cast(torch.nn.Module, torch.compile(module, mode=None if mode == "default" else mode))


def mark_dynamic(*tensors: torch.Tensor) -> None:
    """Batch and length dimensions vary from batch to batch: compile them as symbols once, rather
    than specialising on the first shape and recompiling on the next. `maybe_`: a dimension the
    model's code does specialise stays static instead of failing."""
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
        torch._dynamo.maybe_mark_dynamic(tensor, 1)


@torch.no_grad()
def gradient_norm(parameters: Sequence[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """The global gradient norm, on the device, after clipping the gradients to `max_norm` (None: no
    clipping). torch's clip_grad_norm_ in fewer launches: one multi-tensor norm, one norm of those,
    the clip divisor, one multi-tensor division (a step's tail is launch-bound on a GPU)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm is not None:
        # Dividing by max(norm / max_norm, 1) is clip_grad_norm_'s min(max_norm / norm, 1) scale in two
        # launches, with no epsilon: a zero norm divides by 1. Non-finite norms make a non-finite
        # divisor; that step is skipped anyway (non_finite).
        torch._foreach_div_(grads, torch.div(total, max_norm).clamp_min_(1.0))
    return total


def non_finite(norm: torch.Tensor) -> torch.Tensor:
    """1.0 where `norm` is NaN or infinite, else 0.0, as the fused optimizer's found_inf flag wants it:
    0 · x is NaN exactly for those, which one comparison finds (isfinite takes four kernels), written
    straight into a float (no cast)."""
    zero = norm * 0
    return torch.ne(zero, zero, out=torch.empty((), dtype=torch.float32, device=norm.device))


class DDPBackend:
    """torch DistributedDataParallel (or the bare model in a world of one) with AdamW.

    The step is written so that nothing in it waits for the device: the loss and the token count
    come back as device tensors, the gradient norm stays on the device, and a non-finite norm
    skips the update through the fused optimizer's `found_inf` flag (the loop reads the flags once
    per log interval). With training.compile, the forward, the loss and (through AOTAutograd) the
    backward are one compiled region; the optimizer is not compiled: fused, it is one kernel already.
    """

    name = "ddp"
    zero_stage = 0

    def __init__(self, spec: TrainerSpec, world: World, model: PreTrainedModel, total_steps: int) -> None:
        self.spec, self.world = spec, world
        t = spec.training
        # transformers types PreTrainedModel.to through a decorator that loses its signature.
        self.module = model.to(world.device)  # type: ignore[arg-type]
        # bf16 parameters, fp32 masters for the optimizer (master_weights.py); None: fp32 parameters.
        self.masters = MasterWeights(self.module) if t.bf16_parameters else None
        self.compiled = t.compile != "none"
        chunks = None  # eager: cut each batch by its own size
        if self.compiled:
            # Compiled with dynamic shapes, the count must not follow the batch: fixed for the largest
            # batch the spec allows, in device-sized chunks (on a CPU too: inductor fuses each chunk's
            # passes, so cache-sized chunks would only multiply the matrix products).
            rows = t.batch.tokens or cast(int, t.batch.sentences) * spec.data.max_target_length  # one is set
            vocab = self.module.get_output_embeddings().weight.size(0)
            chunks = logit_chunks(rows, vocab, torch.device("cuda"))
        self.criterion = Seq2SeqLoss(self.module, t.label_smoothing, chunks)
        step = compile_step(self.criterion, t.compile) if self.compiled else self.criterion
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [world.device.index] if world.device.type == "cuda" else None
            # The model's buffers (Marian's logit bias) never change: no broadcast before each forward.
            step = DDP(step, device_ids=ids, forward_sync_buffers=False)
        # The criterion as the step runs it (compiled, in DDP, or neither); None once released.
        self.step_module: Any = step
        # Evaluation and generation run the plain model, eagerly.
        self.model = self.module
        named = self.masters.named_master() if self.masters else None
        self.optimizer = make_optimizer(spec, param_groups(self.module, t.weight_decay, named), fused=True)
        self.scheduler = make_scheduler(spec, total_steps)(self.optimizer)
        self.scaler = torch.amp.GradScaler("cuda") if t.precision == "fp16" else None
        self._no_skip = torch.zeros((), device=world.device)

    def forward_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss per target token, target tokens) of a micro-batch, as device tensors."""
        if self.compiled:
            mark_dynamic(input_ids, attention_mask, labels)
        with autocast(self.spec.training.precision, self.world.device):
            out: tuple[torch.Tensor, torch.Tensor] = self.step_module(input_ids, attention_mask, labels)
            return out

    def backward(self, loss: torch.Tensor, accumulation: int, boundary: bool) -> None:
        # Only the last micro-batch of a window all-reduces gradients.
        sync = contextlib.nullcontext() if boundary or not self.world.distributed else self.step_module.no_sync()
        scaled = loss / accumulation if accumulation > 1 else loss  # two launches fewer, forward and backward
        if self.scaler:
            scaled = self.scaler.scale(scaled)
        with sync:
            scaled.backward()  # type: ignore[no-untyped-call]  # unannotated in torch

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and step. Returns (gradient norm, 1 if the update was skipped else 0), on the device.

        A non-finite gradient norm skips the update: every rank sees the same all-reduced
        gradients, so all skip together without a collective. The learning-rate schedule counts
        the step until the loop reads the flag and calls unskip_schedule.
        """
        t = self.spec.training
        stepped: Sequence[torch.Tensor]
        if self.masters:
            stepped = self.masters.gradients_to_master()
        else:
            stepped = list(self.module.parameters())
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = gradient_norm(stepped, t.clip_grad_norm)
        if self.scaler:
            # fp16: the scaler skips overflowing steps and lowers the scale; that is routine
            # loss scaling, not a numerical fault.
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self._no_skip
        else:
            skipped = non_finite(grad_norm)
            # The fused step reads these two, which torch's annotations of AdamW leave out.
            self.optimizer.grad_scale, self.optimizer.found_inf = None, skipped  # type: ignore[attr-defined]
            self.optimizer.step()
        self.scheduler.step()
        if self.masters:
            self.masters.master_to_parameters()  # a skipped step copies back the unchanged masters
            self.module.zero_grad(set_to_none=True)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def release(self) -> None:
        """Drop the DDP wrapper while its process group is still up. Freed later, its reducer would
        take the group's last reference with it, and the group's destructor then waits for a gloo
        thread that needs the interpreter lock the destructor holds: a hang at exit."""
        self.step_module = None
        gc.collect()

    def unskip_schedule(self, steps: int) -> None:
        """Take back the schedule's count of `steps` skipped updates, once the loop has read their
        flags: from then on the learning rate is where it would be had they never been taken."""
        s = self.scheduler
        s.last_epoch -= steps
        for group, base, factor in zip(self.optimizer.param_groups, s.base_lrs, s.lr_lambdas):
            group["lr"] = base * factor(s.last_epoch)
        s._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def last_lr(self) -> float:
        return cast(float, self.scheduler.get_last_lr()[0])  # LambdaLR's rates are floats

    def weights_finite(self) -> bool:
        # One host sync for the whole model, not one per tensor.
        weights = self.masters.master if self.masters else list(self.module.parameters())
        return bool(torch.stack([torch.isfinite(p).all() for p in weights]).all())

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        if state.get("optimizer") is None:
            raise ValueError(f"{checkpoint} was written by the DeepSpeed backend; resume it with "
                             "spec.distributed.backend: deepspeed")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def save_model(self, directory: Path) -> None:
        """Collective. DDP replicas are identical: rank 0 writes Hugging Face weights."""
        if not self.world.is_main:
            return
        if self.masters is None:
            save_pretrained(self.module, directory / "model", safe_serialization=True)
            return
        save_pretrained(self.module, directory / "model", safe_serialization=True,
                        state_dict=self.masters.state_dict_of(self.module))
        # save_pretrained writes the module's own dtype (bf16) into the config, and from_pretrained
        # loads in the config's dtype: a resumed run must start from the fp32 masters, not their rounding.
        say_float32(directory / "model" / "config.json")


def say_float32(config_file: Path) -> None:
    """Every "dtype" of a saved transformers config (sub-configs too) set to float32."""
    import json

    def widen(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: "float32" if k in ("dtype", "torch_dtype") and v == "bfloat16" else widen(v)
                    for k, v in node.items()}
        return [widen(v) for v in node] if isinstance(node, list) else node

    config_file.write_text(json.dumps(widen(json.loads(config_file.read_text())), indent=2, sort_keys=True) + "\n")


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each encoder/decoder layer in backward instead of keeping its activations.

    Non-reentrant checkpointing: the reentrant kind runs backward inside backward, which DDP
    sees as a parameter being ready twice (it would need static_graph) and which drops the
    gradients of layers whose inputs do not require grad. It keeps the RNG state, so dropout
    in the recomputed forward matches the first one and the loss is the same as without."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"spec.training.activationCheckpointing: {type(model).__name__} does not support it")
    enable = getattr(model, "activation_checkpointing_enable", None)  # the name since transformers 5.x
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_backend(spec: TrainerSpec, world: World, model: PreTrainedModel,
                  total_steps: int) -> DDPBackend | DeepSpeedBackend:
    if spec.training.precision == "fp16" and world.device.type != "cuda":
        raise ValueError("spec.training.precision: fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if spec.training.activation_checkpointing:
        enable_activation_checkpointing(model)
    if spec.distributed.backend == "deepspeed":
        return DeepSpeedBackend(spec, world, model, total_steps)
    return DDPBackend(spec, world, model, total_steps)
