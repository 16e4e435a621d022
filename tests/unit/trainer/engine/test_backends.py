"""The DDP backend's numerical guards: a non-finite gradient is never applied, and a model with
non-finite weights is recognised (the loop then refuses to checkpoint it)."""

import pytest
import torch

from rosetta_contract.documents import parse_document
from rosetta_trainer.engine.backends import DDPBackend, build_backend, gradient_norm, non_finite
from rosetta_trainer.models.models import build_model
from rosetta_trainer.runtime.distributed import World
from support.training import TINY, deep_update

CPU = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))


def backend(patch: dict | None = None) -> DDPBackend:
    spec = parse_document(deep_update(TINY, {"spec": patch or {}})).spec
    torch.manual_seed(0)
    return build_backend(spec, CPU, build_model(spec.model, vocab_size=50, max_length=16), total_steps=10)


def backward_once(b: DDPBackend, poison: bool = False) -> None:
    ids = torch.randint(3, 50, (2, 6))
    loss, _ = b.forward_loss(ids, torch.ones_like(ids), ids)
    b.backward(loss * float("nan") if poison else loss, accumulation=1, boundary=True)


def weights(b: DDPBackend) -> list[torch.Tensor]:
    return [p.detach().clone() for p in b.module.parameters()]


def test_a_finite_step_is_applied_and_advances_the_schedule():
    b = backend()
    before, lr = weights(b), b.last_lr()
    backward_once(b)
    norm, skipped = b.step()
    assert float(skipped) == 0.0 and torch.isfinite(norm)
    assert any(not torch.equal(x, y) for x, y in zip(before, weights(b)))
    assert b.last_lr() != lr


def test_a_non_finite_gradient_is_not_applied_and_the_schedule_is_taken_back():
    b = backend()
    before, lr = weights(b), b.last_lr()
    backward_once(b, poison=True)
    norm, skipped = b.step()
    # Flags on the device, read by the loop later: the step itself never asked.
    assert float(skipped) == 1.0 and not torch.isfinite(norm)
    assert all(torch.equal(x, y) for x, y in zip(before, weights(b)))
    assert all(p.grad is None for p in b.module.parameters())  # nothing left to leak into the next step
    assert b.weights_finite()
    b.unskip_schedule(1)
    assert b.last_lr() == lr and b.optimizer.param_groups[0]["lr"] == lr
    backward_once(b)
    b.step()  # the next applied step runs at the learning rate of the skipped one's place
    fresh = backend()
    backward_once(fresh)
    fresh.step()
    assert b.last_lr() == fresh.last_lr()


@pytest.mark.parametrize("scale", [0.0, 1e-3, 1.0, 1e3])
@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_the_gradient_norm_clips_as_torch_does(scale, max_norm):
    torch.manual_seed(0)
    grads = [torch.randn(5, 3) * scale, torch.randn(7) * scale]
    ours, theirs = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads], [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm if max_norm is not None else float("inf"))
    torch.testing.assert_close(gradient_norm(ours, max_norm), expected)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("norm, flag", [(0.0, 0.0), (3.5, 0.0), (float("inf"), 1.0), (float("-inf"), 1.0), (float("nan"), 1.0)])
def test_non_finite_flags_a_float_for_the_fused_optimizer(norm, flag):
    found = non_finite(torch.tensor(norm))
    assert found.dtype == torch.float32 and found.item() == flag


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


# ------------------------------------------------------------------ bf16 parameters, fp32 masters


def test_bf16_parameters_train_fp32_masters_and_checkpoint_them(tmp_path):
    b = backend({"training": {"precision": "bf16", "bf16Parameters": True}})
    assert {p.dtype for p in b.module.parameters()} == {torch.bfloat16}
    masters = b.masters.master
    assert {m.dtype for m in masters} == {torch.float32}
    before = [m.detach().clone() for m in masters]
    backward_once(b)
    norm, skipped = b.step()
    assert float(skipped) == 0.0 and torch.isfinite(norm)
    # The optimizer moved the masters, and the bf16 parameters are their rounding.
    assert any(not torch.equal(x, m) for x, m in zip(before, masters))
    for p, m in zip(b.masters.params, masters):
        assert torch.equal(p, m.to(torch.bfloat16))
    # Checkpoints hold the masters (fp32), not their bf16 rounding.
    b.save_model(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    name, master = b.masters.named_master()[0]
    torch.testing.assert_close(saved[name], master.detach(), rtol=0, atol=0)
    # ...and so does the config: from_pretrained would otherwise load them back in bf16.
    assert '"bfloat16"' not in (tmp_path / "model" / "config.json").read_text()


def test_bf16_parameters_leave_autocast_nothing_to_cast():
    from rosetta_trainer.engine.step_counters import count_step

    def casts(patch):
        b = backend({"training": {"precision": "bf16", **patch}})

        def step():
            backward_once(b)
            b.step()
        step()
        counts = count_step(step)
        assert counts.syncs == 0
        return counts.kernels

    assert casts({"bf16Parameters": True}) < 0.8 * casts({})


def test_a_skipped_step_leaves_the_masters_and_the_parameters_alone():
    b = backend({"training": {"precision": "bf16", "bf16Parameters": True}})
    before = [m.detach().clone() for m in b.masters.master]
    params = [p.detach().clone() for p in b.masters.params]
    backward_once(b, poison=True)
    _, skipped = b.step()
    assert float(skipped) == 1.0
    assert all(torch.equal(x, m) for x, m in zip(before, b.masters.master))
    assert all(torch.equal(x, p) for x, p in zip(params, b.masters.params))


def test_bf16_parameters_need_bf16_and_ddp():
    from rosetta_contract.strict_model import ConfigError

    with pytest.raises((ConfigError, ValueError), match="bf16Parameters needs training.precision bf16"):
        backend({"training": {"bf16Parameters": True}})
    with pytest.raises((ConfigError, ValueError), match="ddp backend"):
        backend({"training": {"precision": "bf16", "bf16Parameters": True}, "distributed": {"backend": "deepspeed"}})
