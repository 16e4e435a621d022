"""The optimizer and its learning-rate schedule, built alike for the DDP and the DeepSpeed backend."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.engine.schedules import lr_multiplier


def param_groups(model: torch.nn.Module, weight_decay: float,
                 named: Iterable[tuple[str, torch.Tensor]] | None = None) -> list[dict[str, Any]]:
    """AdamW groups: no weight decay on biases, norms and other 1-d parameters. `named`: the
    (name, parameter) pairs to group, when not the model's own (fp32 masters)."""
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for name, p in named if named is not None else model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(spec: TrainerSpec, groups: list[dict[str, Any]], fused: bool) -> torch.optim.AdamW:
    """torch's AdamW with the spec's settings, fused (one kernel over all parameters, CUDA and CPU
    alike, and able to skip a step on a device flag) or foreach."""
    t = spec.training
    kwargs: dict[str, Any] = dict(lr=t.learning_rate, betas=tuple(t.adam_betas), eps=t.adam_eps)
    kwargs["fused" if fused else "foreach"] = True
    return torch.optim.AdamW(groups, **kwargs)


def make_scheduler(spec: TrainerSpec, total_steps: int) -> Callable[[torch.optim.Optimizer], LambdaLR]:
    """A callable optimizer → LambdaLR, so DeepSpeed can build it around its own optimizer."""
    t = spec.training

    def build(optimizer: torch.optim.Optimizer) -> LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(t.schedule, t.warmup_steps, total_steps))
    return build
