"""The fused label-smoothed cross-entropy against torch's F.cross_entropy: value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from rosetta_trainer.models import losses
from rosetta_trainer.models.losses import label_smoothed_cross_entropy


def reference(logits, labels, smoothing):
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                           label_smoothing=smoothing, reduction="sum")


def both(logits, labels, smoothing, scale=0.37):
    """Loss and gradient of each implementation, with a non-trivial upstream gradient."""
    out = []
    for fn in (reference, label_smoothed_cross_entropy):
        x = logits.detach().clone().requires_grad_(True)
        loss = fn(x, labels, smoothing)
        (loss * scale).backward()
        out.append((loss.detach(), x.grad))
    return out


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.35])
@pytest.mark.parametrize("shape", [(3, 7, 50), (130, 11), (1, 1, 5)])
def test_value_and_gradient_match_torch(smoothing, shape):
    torch.manual_seed(0)
    logits = torch.randn(*shape) * 4
    labels = torch.randint(0, shape[-1], shape[:-1])
    labels.view(-1)[::3] = -100  # padding positions
    (ref_loss, ref_grad), (loss, grad) = both(logits, labels, smoothing)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    # Ignored positions (every shape has at least one) get no gradient at all.
    assert grad.reshape(-1, shape[-1])[labels.reshape(-1) == -100].abs().max() == 0


def test_chunked_rows_match_one_chunk(monkeypatch):
    torch.manual_seed(1)
    logits, labels = torch.randn(37, 64), torch.randint(0, 64, (37,))
    labels[5] = -100
    (_, ref_grad), (whole_loss, whole_grad) = both(logits, labels, 0.1)
    monkeypatch.setattr(losses, "CPU_CHUNK_BYTES", 4 * 64 * 4)  # 4 rows per chunk, the last one partial
    (_, _), (loss, grad) = both(logits, labels, 0.1)
    torch.testing.assert_close(loss, whole_loss)
    torch.testing.assert_close(grad, whole_grad)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_logit_chunks_follow_the_device_budget_or_the_one_given():
    # t5's vocabulary at a 65,536-token batch: 8 GiB of fp32 logits.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert losses.logit_chunks(65536, 32128, cuda) == 16  # 512 MiB chunks, the last one partial
    assert losses.logit_chunks(65536, 32128, cuda, budget=128 << 20) == 63
    assert losses.logit_chunks(65536, 32128, cpu) == 2008  # 4 MiB chunks, an exact fit
    assert losses.logit_chunks(1, 10, cuda) == 1


def test_bf16_logits_get_a_bf16_gradient_close_to_fp32():
    torch.manual_seed(2)
    logits, labels = torch.randn(4, 9, 40), torch.randint(0, 40, (4, 9))
    x = logits.to(torch.bfloat16).requires_grad_(True)
    loss = label_smoothed_cross_entropy(x, labels, 0.1)
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    (ref_loss, ref_grad), _ = both(logits.to(torch.bfloat16).float(), labels, 0.1, scale=1.0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(x.grad.float(), ref_grad, rtol=2e-2, atol=2e-3)


def test_all_positions_ignored_gives_zero_loss_and_gradient():
    logits = torch.randn(2, 3, 8, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.full((2, 3), -100), 0.1)
    loss.backward()
    assert loss.item() == 0 and logits.grad.abs().sum() == 0


def test_non_finite_logits_give_a_non_finite_loss():
    # The NaN policy relies on a non-finite loss reaching the gradient norm.
    logits = torch.randn(2, 6, requires_grad=True)
    with torch.no_grad():
        logits[1, 2] = float("nan")
    loss = label_smoothed_cross_entropy(logits, torch.tensor([1, 3]), 0.1)
    loss.backward()
    assert not torch.isfinite(loss) and not torch.isfinite(logits.grad).all()


def test_second_backward_is_refused_and_bad_smoothing_is_named():
    logits = torch.randn(2, 6, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.tensor([1, 3]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    with pytest.raises(ValueError, match=r"label smoothing must be in \[0, 1\), got 1.0"):
        label_smoothed_cross_entropy(logits, torch.tensor([1, 3]), 1.0)


# ------------------------------------------------------------------ the head and the loss in chunks


def linear_reference(hidden, weight, bias, labels, smoothing):
    """In float64, through the logit matrix."""
    logits = hidden.double() @ weight.double().t() + (0 if bias is None else bias.double())
    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=smoothing, reduction="sum")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_linear_cross_entropy_is_the_head_then_the_loss(bias, chunks):
    torch.manual_seed(1)
    rows, width, vocab = 50, 16, 97
    h = torch.randn(rows, width, requires_grad=True)
    w = (torch.randn(vocab, width) * 0.3).requires_grad_(True)
    b = (torch.randn(vocab) * 0.3).requires_grad_(True) if bias else None
    y = torch.randint(0, vocab, (rows,))
    y[::4] = -100
    loss = losses.linear_cross_entropy(h, w, b, y, 0.1, chunks=chunks)
    grads = torch.autograd.grad(loss * 0.37, [t for t in (h, w, b) if t is not None])
    ref_inputs = [t.detach().double().requires_grad_(True) for t in (h, w, b) if t is not None]
    ref = linear_reference(ref_inputs[0], ref_inputs[1], ref_inputs[2] if bias else None, y, 0.1)
    ref_grads = torch.autograd.grad(ref * 0.37, ref_inputs)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-4)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    assert grads[0][y == -100].abs().max() == 0  # ignored rows pass nothing back


def test_linear_cross_entropy_projects_in_autocasts_dtype():
    torch.manual_seed(2)
    h, w = torch.randn(40, 16, requires_grad=True), (torch.randn(60, 16) * 0.3).requires_grad_(True)
    y = torch.randint(0, 60, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = losses.linear_cross_entropy(h, w, None, y, 0.1, chunks=2)
    loss.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    ref = linear_reference(h.detach(), w.detach(), None, y, 0.1)
    # bf16 operands: about 3 significant digits, as an nn.Linear under autocast gives.
    torch.testing.assert_close(loss.double(), ref, rtol=1e-2, atol=0)


def peak_bytes(fn) -> int:
    """The most bytes that torch's CPU allocator held at once while `fn` ran, over what it held before."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Allocations inside an operator count as its own ("self") memory, frees outside any as "[memory]"
    # events: in time order, their running sum is what the allocator held.
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def test_linear_cross_entropy_never_holds_the_logits():
    """The point of the chunks: the (tokens × vocabulary) matrix, in fp32 or otherwise, never exists."""
    torch.manual_seed(3)
    rows, width, vocab = 2048, 32, 4000
    h = torch.randn(rows, width, requires_grad=True)
    w = (torch.randn(vocab, width) * 0.1).requires_grad_(True)
    y = torch.randint(0, vocab, (rows,))
    logits_bytes = rows * vocab * 4

    def through_logits():
        label_smoothed_cross_entropy(h @ w.t(), y, 0.1).backward()

    def chunked():
        losses.linear_cross_entropy(h, w, None, y, 0.1).backward()

    assert peak_bytes(through_logits) >= 2 * logits_bytes  # the logits and their gradient
    assert peak_bytes(chunked) < logits_bytes / 4
