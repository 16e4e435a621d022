"""The DDP backend's numerical guards: a non-finite gradient is never applied, and a model with
non-finite weights is recognised (the loop then refuses to checkpoint it)."""

import pytest
import torch

from rosetta_contract.documents import parse_document
from rosetta_trainer.backends import DDPBackend, build_backend
from rosetta_trainer.distributed import World
from rosetta_trainer.models import build_model
from support.training import TINY, deep_update

CPU = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))


def backend(patch: dict | None = None) -> DDPBackend:
    spec = parse_document(deep_update(TINY, {"spec": patch or {}})).spec
    torch.manual_seed(0)
    return build_backend(spec, CPU, build_model(spec.model, vocab_size=50, max_length=16), total_steps=10)


def backward_once(b: DDPBackend, poison: bool = False) -> None:
    ids = torch.randint(3, 50, (2, 6))
    loss = b.forward(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=ids).logits.mean()
    b.backward(loss * float("nan") if poison else loss, accumulation=1, boundary=True)


def weights(b: DDPBackend) -> list[torch.Tensor]:
    return [p.detach().clone() for p in b.module.parameters()]


def test_a_finite_step_is_applied_and_advances_the_schedule():
    b = backend()
    before, lr = weights(b), b.last_lr()
    backward_once(b)
    norm, applied = b.step()
    assert applied and torch.isfinite(norm)
    assert any(not torch.equal(x, y) for x, y in zip(before, weights(b)))
    assert b.last_lr() != lr


def test_a_non_finite_gradient_is_not_applied_and_the_schedule_waits():
    b = backend()
    before, lr = weights(b), b.last_lr()
    backward_once(b, poison=True)
    norm, applied = b.step()
    assert not applied and not torch.isfinite(norm)
    assert all(torch.equal(x, y) for x, y in zip(before, weights(b)))
    assert b.last_lr() == lr
    assert all(p.grad is None for p in b.module.parameters())  # nothing left to leak into the next step
    assert b.weights_finite()


def test_non_finite_weights_are_recognised():
    b = backend()
    assert b.weights_finite()
    with torch.no_grad():
        next(iter(b.module.parameters()))[0].fill_(float("inf"))
    assert not b.weights_finite()


def test_fp16_without_cuda_is_refused_for_either_backend():
    for distributed in ({}, {"backend": "deepspeed"}):
        with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
            backend({"training": {"precision": "fp16"}, "distributed": distributed})
