"""Label-smoothed cross-entropy whose gradient is computed in the forward pass.

`F.cross_entropy(..., label_smoothing=ε)` on a (tokens × vocabulary) logit matrix runs about
eight full passes over it: log-softmax forward, the NLL and smoothing terms, and in backward the
NLL scatter into a zero-filled matrix, the sum of the two branches and the log-softmax backward.
The logit matrix is the largest tensor of a translation model's step (a batch of 2,000 target
tokens over a 32k vocabulary is 256 MB in fp32), so those passes cost as much as several
transformer layers. The gradient has a closed form,

    ∂loss_i/∂x_ij = softmax(x_i)_j − (1 − ε)·[j = y_i] − ε / V     (0 for ignored positions),

so it is written once, in the forward, into one buffer that backward only scales. On the CPU
the rows are processed in chunks that stay in cache.
"""

from __future__ import annotations

from typing import Any, cast

import torch

# Rows per chunk on the CPU: about 4 MiB of fp32 logits, so that the passes over a chunk hit
# the cache. On GPUs every pass is one kernel and chunking would only add launches.
CPU_CHUNK_BYTES = 4 << 20


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, smoothing: float,
                ignore_index: int) -> torch.Tensor:
        n, vocab = logits.shape
        grad = torch.empty_like(logits)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        rows = max(1, CPU_CHUNK_BYTES // (4 * vocab)) if logits.device.type == "cpu" else max(1, n)
        in_place = grad.dtype == torch.float32  # exp(x - max) then goes straight into the gradient buffer
        for start in range(0, n, rows):
            x = logits[start:start + rows].float()
            y = labels[start:start + rows]
            valid = y != ignore_index
            target = y.masked_fill(~valid, 0).unsqueeze(-1)
            weight = valid.unsqueeze(-1).to(torch.float32)

            out = grad[start:start + rows]
            g = out if in_place else torch.empty_like(x)
            top = x.amax(dim=-1, keepdim=True)
            torch.sub(x, top, out=g).exp_()
            norm = g.sum(dim=-1, keepdim=True)
            loss = top + norm.log() - (1 - smoothing) * x.gather(-1, target)
            if smoothing:
                loss = loss - smoothing * x.mean(dim=-1, keepdim=True)
            total += (loss * weight).sum()

            g.mul_(weight / norm)  # softmax, and 0 on ignored rows
            if smoothing:
                g.sub_(weight * (smoothing / vocab))
            g.scatter_add_(-1, target, weight * -(1 - smoothing))
            if not in_place:
                out.copy_(g)
        ctx.save_for_backward(grad)
        ctx.consumed = False
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        if ctx.consumed:
            raise RuntimeError("label_smoothed_cross_entropy: backward can run only once per forward "
                               "(its gradient buffer is scaled in place)")
        ctx.consumed = True
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_output.to(grad.dtype)), None, None, None


def label_smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Sum over non-ignored positions of the label-smoothed cross-entropy (fp32 scalar).

    The same value and gradient as `F.cross_entropy(logits.float().view(-1, V), labels.view(-1),
    ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum")`; the gradient comes
    back in the logits' dtype. Call backward on a graph containing it at most once.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
    vocab = logits.size(-1)
    # torch leaves autograd.Function.apply unannotated.
    loss: torch.Tensor = _LabelSmoothedCrossEntropy.apply(  # type: ignore[no-untyped-call]
        logits.reshape(-1, vocab), labels.reshape(-1), float(smoothing), int(ignore_index))
    return loss


# The logits of one chunk of rows, in fp32, on an accelerator: large enough that each pass is one
# well-filled kernel, small enough that the whole (tokens × vocabulary) matrix never exists. Not
# smaller: a compiled step unrolls one copy of the loop per chunk, and the first call's compilation
# grows with the copies (bench/loss_chunks.py: 63 chunks of 128 MiB took 2.7x the capture of 16 of
# 512 MiB for t5's vocabulary at 65,536 tokens), as do an eager step's launches. The transient cost
# is about three chunks (logits, their exponent, the gradient).
DEVICE_CHUNK_BYTES = 512 << 20


def logit_chunks(tokens: int, vocab: int, device: torch.device, budget: int | None = None) -> int:
    """Into how many row chunks linear_cross_entropy cuts `tokens` rows of a `vocab`-wide head.

    `budget` is the bytes of fp32 logits per chunk; by default the device's.
    """
    if budget is None:
        budget = CPU_CHUNK_BYTES if device.type == "cpu" else DEVICE_CHUNK_BYTES
    return max(1, -(-tokens * vocab * 4 // budget))


class _LinearCrossEntropy(torch.autograd.Function):
    """The output projection and the label-smoothed cross-entropy, chunk by chunk over the rows.

    Each chunk's logits are made, turned into the loss and their closed-form gradient (as in
    _LabelSmoothedCrossEntropy), and that gradient is pushed through the projection at once: into the
    hidden states' gradient (rows of the chunk) and the weight's (summed over chunks, in fp32). The
    saved tensors are gradients of the hidden states and of the weight, the size of the model's own,
    not of the logits.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                smoothing: float, ignore_index: int, chunks: int) -> torch.Tensor:
        vocab = weight.size(0)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_bias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if bias is not None else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for h, y, gh in zip(hidden.tensor_split(chunks), labels.tensor_split(chunks),
                            grad_hidden.tensor_split(chunks)):
            x = (h @ weight.t()).float()
            if bias is not None:
                x = x + bias.float()
            valid = y != ignore_index
            target = y.masked_fill(~valid, 0).unsqueeze(-1)
            w = valid.unsqueeze(-1).to(torch.float32)
            top = x.amax(dim=-1, keepdim=True)
            loss = top - (1 - smoothing) * x.gather(-1, target)
            if smoothing:
                loss = loss - smoothing * x.mean(dim=-1, keepdim=True)
            g = x.sub_(top).exp_()  # x is a fresh fp32 buffer: reused for the softmax and the gradient
            norm = g.sum(dim=-1, keepdim=True)
            total += ((loss + norm.log()) * w).sum()
            g.mul_(w / norm)
            if smoothing:
                g.sub_(w * (smoothing / vocab))
            g.scatter_add_(-1, target, w * -(1 - smoothing))
            if grad_bias is not None:
                grad_bias += g.sum(0)
            g = g.to(hidden.dtype)
            torch.mm(g, weight, out=gh)
            grad_weight += g.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype),
                              grad_bias.to(cast(torch.Tensor, bias).dtype) if grad_bias is not None else None)
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_output.to(grad_hidden.dtype)
        return (grad_hidden * scale, grad_weight * scale.to(grad_weight.dtype),
                None if grad_bias is None else grad_bias * scale.to(grad_bias.dtype), None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         labels: torch.Tensor, smoothing: float = 0.0, ignore_index: int = -100,
                         chunks: int | None = None) -> torch.Tensor:
    """label_smoothed_cross_entropy(hidden @ weight.T + bias, labels, ...) without the logit matrix.

    `hidden` (..., d) and `labels` (...) are flattened to rows; `weight` is (vocabulary, d). Under
    autocast the projection runs in autocast's dtype, as an nn.Linear would, and the softmax in fp32.
    `chunks` defaults to logit_chunks(); it must not depend on the batch under torch.compile with
    dynamic shapes (a Python loop's length is specialised), so the trainer fixes it per run.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
    hidden = hidden.reshape(-1, hidden.size(-1))
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    if chunks is None:
        chunks = logit_chunks(hidden.size(0), weight.size(0), hidden.device)
    loss: torch.Tensor = _LinearCrossEntropy.apply(  # type: ignore[no-untyped-call]  # as above
        hidden, weight, bias, labels.reshape(-1), float(smoothing), int(ignore_index), int(chunks))
    return loss
