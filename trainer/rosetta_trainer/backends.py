"""How the processes share a step: torch DDP or a DeepSpeed ZeRO engine.

The loop only ever asks a backend to run a micro-batch forward/backward, to
take the optimizer step at the end of an accumulation window, and to save or
load its state. Everything that differs between DDP and DeepSpeed (who owns
the optimizer, loss scaling, gradient reduction, sharded checkpoints) lives
behind that interface.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.distributed import World
from rosetta_trainer.schedules import lr_multiplier


def param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases, norms and other 1-d parameters."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(spec: TrainerSpec, groups: list[dict], cuda: bool) -> torch.optim.AdamW:
    """torch's AdamW with the spec's settings: fused kernels on CUDA, foreach on the CPU."""
    t = spec.training
    kwargs = dict(lr=t.learning_rate, betas=tuple(t.adam_betas), eps=t.adam_eps)
    kwargs["fused" if cuda else "foreach"] = True
    return torch.optim.AdamW(groups, **kwargs)


def make_scheduler(spec: TrainerSpec, total_steps: int):
    """A callable optimizer → LambdaLR, so DeepSpeed can build it around its own optimizer."""
    t = spec.training

    def build(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(t.schedule, t.warmup_steps, total_steps))
    return build


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_stats() -> dict:
    """What torch.compile captured in this process: graphs (more than a handful means it kept
    recompiling) and graph breaks (each one a return to eager Python inside the model)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


class DDPBackend:
    """torch DistributedDataParallel (or the bare model in a world of one) with AdamW."""

    name = "ddp"
    zero_stage = 0

    def __init__(self, spec: TrainerSpec, world: World, model, total_steps: int):
        self.spec, self.world = spec, world
        t = spec.training
        self.module = model.to(world.device)
        wrapped = torch.compile(self.module) if t.compile else self.module
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [world.device.index] if world.device.type == "cuda" else None
            wrapped = DDP(wrapped, device_ids=ids)
        self.model = wrapped
        self.optimizer = make_optimizer(spec, param_groups(self.module, t.weight_decay), world.device.type == "cuda")
        self.scheduler = make_scheduler(spec, total_steps)(self.optimizer)
        self.scaler = torch.amp.GradScaler("cuda") if t.precision == "fp16" else None

    def forward(self, **inputs):
        with autocast(self.spec.training.precision, self.world.device):
            return self.model(**inputs)

    def backward(self, loss: torch.Tensor, accumulation: int, boundary: bool) -> None:
        # Only the last micro-batch of a window all-reduces gradients.
        sync = contextlib.nullcontext() if boundary or not self.world.distributed else self.model.no_sync()
        scaled = loss / accumulation
        if self.scaler:
            scaled = self.scaler.scale(scaled)
        with sync:
            scaled.backward()

    def step(self) -> tuple[torch.Tensor, bool]:
        """Clip and step. Returns (gradient norm, whether the step was applied).

        A non-finite gradient norm skips the update (one host sync per step; every rank sees
        the same all-reduced gradients, so all agree without a collective).
        """
        t = self.spec.training
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = t.clip_grad_norm if t.clip_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm).detach()
        applied = True
        if self.scaler:
            # fp16: the scaler skips overflowing steps and lowers the scale; that is routine
            # loss scaling, not a numerical fault.
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not bool(torch.isfinite(grad_norm)):
            applied = False
        else:
            self.optimizer.step()
        if applied:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    def last_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def weights_finite(self) -> bool:
        # One host sync for the whole model, not one per tensor.
        return bool(torch.stack([torch.isfinite(p).all() for p in self.module.parameters()]).all())

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict, checkpoint: Path) -> None:
        if state.get("optimizer") is None:
            raise ValueError(f"{checkpoint} was written by the DeepSpeed backend; resume it with "
                             "spec.distributed.backend: deepspeed")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def save_model(self, directory: Path) -> None:
        """Collective. DDP replicas are identical: rank 0 writes Hugging Face weights."""
        if self.world.is_main:
            self.module.save_pretrained(directory / "model", safe_serialization=True)


def enable_activation_checkpointing(model) -> None:
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


def build_backend(spec: TrainerSpec, world: World, model, total_steps: int):
    if spec.training.precision == "fp16" and world.device.type != "cuda":
        raise ValueError("spec.training.precision: fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if spec.training.activation_checkpointing:
        enable_activation_checkpointing(model)
    if spec.distributed.backend == "deepspeed":
        from rosetta_trainer.deepspeed_backend import DeepSpeedBackend

        return DeepSpeedBackend(spec, world, model, total_steps)
    return DDPBackend(spec, world, model, total_steps)
