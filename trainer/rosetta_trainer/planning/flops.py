"""Matmul FLOPs of an encoder-decoder transformer, and model FLOPs utilisation (MFU).

Torch-free (numpy): the trainer counts FLOPs from the batch's real token lengths,
so padding (which the GPU does compute) never inflates MFU.

Conventions
-----------
* 2 FLOPs per multiply-add; only matrix multiplies count (norms, softmax,
  activations, biases, dropout and embedding lookups are a few percent at most
  and are not what peak FLOP/s numbers describe).
* Attention scores are counted for the full S x S (or T x T) matrix, causal
  decoder self-attention included: eager attention and the SDPA/flash kernels
  compute (or are conventionally credited with) the whole square, and this is
  also what ``torch.utils.flop_counter`` reports, so the two agree.
* Each sequence contributes its own length squared to attention; a batch padded
  to its longest member is not charged for the pad positions.
* Training = 3 x forward (backward computes gradients for activations and for
  weights, each about one forward). Activation recomputation is not counted:
  MFU, unlike hardware FLOPs utilisation, credits only the model's own work.
* Teacher-forced forward only; incremental decoding with a KV cache does
  different (smaller) work and is not described here.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass
class Seq2SeqDims:
    """The shapes that decide an encoder-decoder's matmul FLOPs."""

    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    d_kv: int  # per head; heads * d_kv may differ from d_model (T5 allows it)
    ffn_dim: int
    vocab_size: int  # output size of the LM head (Marian's decoder_vocab_size)
    gated_ffn: bool = False  # T5 v1.1 / mT5 / flan gated-gelu: wi_0, wi_1 and wo
    # A tied head still multiplies by the embedding matrix: kept for parameter
    # accounting, it does not change FLOPs.
    tied_lm_head: bool = True
    decoder_ffn_dim: int | None = None  # Marian/BART allow a different decoder FFN

    @property
    def inner_dim(self) -> int:
        return self.heads * self.d_kv

    @classmethod
    def from_hf_config(cls, config: Any) -> "Seq2SeqDims":
        """Read a transformers T5Config/MT5Config or a Marian/BART/M2M100-style config."""
        if hasattr(config, "d_kv") and hasattr(config, "num_heads"):  # T5, mT5, UMT5
            return cls(
                d_model=config.d_model,
                encoder_layers=config.num_layers,
                decoder_layers=config.num_decoder_layers or config.num_layers,
                heads=config.num_heads,
                d_kv=config.d_kv,
                ffn_dim=config.d_ff,
                vocab_size=config.vocab_size,
                gated_ffn=bool(getattr(config, "is_gated_act", False)),
                tied_lm_head=bool(getattr(config, "tie_word_embeddings", True)),
            )
        if hasattr(config, "encoder_attention_heads") and hasattr(config, "encoder_ffn_dim"):
            heads = config.encoder_attention_heads
            if config.d_model % heads:
                raise ValueError(f"d_model {config.d_model} is not divisible by {heads} heads")
            if config.decoder_attention_heads and config.d_model % config.decoder_attention_heads:
                raise ValueError(
                    f"d_model {config.d_model} is not divisible by {config.decoder_attention_heads} decoder heads"
                )
            # Heads only split d_model here, so the decoder's head count does not change FLOPs.
            return cls(
                d_model=config.d_model,
                encoder_layers=config.encoder_layers,
                decoder_layers=config.decoder_layers,
                heads=heads,
                d_kv=config.d_model // heads,
                ffn_dim=config.encoder_ffn_dim,
                decoder_ffn_dim=config.decoder_ffn_dim,
                vocab_size=getattr(config, "decoder_vocab_size", None) or config.vocab_size,
                gated_ffn=False,
                tied_lm_head=bool(getattr(config, "tie_word_embeddings", True)),
            )
        raise ValueError(f"cannot read encoder-decoder dimensions from {type(config).__name__}")


def _ffn(d_model: int, ffn_dim: int, gated: bool) -> int:
    return (3 if gated else 2) * 2 * d_model * ffn_dim


def forward_flops(dims: Seq2SeqDims, src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> float:
    """Matmul FLOPs of one teacher-forced forward pass over non-pad tokens.

    ``src_lengths[i]`` and ``tgt_lengths[i]`` are the real (unpadded) token
    counts of pair i: source including EOS, target as fed to the decoder.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
    d, inner = dims.d_model, dims.inner_dim
    proj = 2 * d * inner  # one d_model <-> inner projection, per token
    enc_ffn = _ffn(d, dims.ffn_dim, dims.gated_ffn)
    dec_ffn = _ffn(d, dims.decoder_ffn_dim or dims.ffn_dim, dims.gated_ffn)

    # One pass each in numpy (exact in float64 far beyond any batch): the loader counts every batch.
    s, t = np.asarray(src_lengths, dtype=np.float64), np.asarray(tgt_lengths, dtype=np.float64)
    src_tokens, tgt_tokens = float(s.sum()), float(t.sum())
    # QK^T and (softmax)V each cost 2 * inner per score.
    src_sq, tgt_sq, cross = float(s @ s), float(t @ t), float(s @ t)
    scores = 2 * 2 * inner

    encoder = dims.encoder_layers * (src_tokens * (4 * proj + enc_ffn) + src_sq * scores)
    decoder = dims.decoder_layers * (
        tgt_tokens * (4 * proj + dec_ffn)  # self-attention q, k, v, o and FFN
        + tgt_sq * scores
        + tgt_tokens * 2 * proj  # cross-attention q and o
        + src_tokens * 2 * proj  # cross-attention k and v, from the encoder output
        + cross * scores
    )
    lm_head = tgt_tokens * 2 * d * dims.vocab_size
    return float(encoder + decoder + lm_head)


def training_flops(dims: Seq2SeqDims, src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> float:
    """Forward + backward matmul FLOPs (backward is about twice the forward)."""
    return 3.0 * forward_flops(dims, src_lengths, tgt_lengths)


# Dense (no structured sparsity) peak FLOP/s per device as torch sees it, from
# the vendors' datasheets:
#   NVIDIA H100 / H100 NVL datasheet; H200 datasheet; A100 datasheet (SXM and
#   PCIe peaks are equal); A10 datasheet; L4, L40, L40S datasheets; T4 datasheet;
#   V100 datasheet (SXM2 figures); NVIDIA HGX B200 and GB200 NVL72 specifications
#   (per-GPU rows: B200 at 1,000 W, GB200's B200 at 1,200 W); AMD Instinct MI100,
#   MI250X, MI300X datasheets.
# NVIDIA datasheets print sparse figures with an asterisk; these are half of them.
# The number used is the dense Tensor Core figure at that precision: e.g. the H100
# SXM's "BF16 Tensor Core 1,979 TFLOPS*" is 989.4 here, the T4's "Mixed precision
# (FP16/FP32) 65 TFLOPS" is used as printed (Turing's figures are dense), the
# B200's "FP16/BF16 Tensor Core 4.5 PFLOPS" (sparse) is 2,250.
# Any other accelerator (or another figure for one of these): spec.metrics.peakFlops
# or $ROSETTA_PEAK_FLOPS, see peak_for_run.
# "fp32" is plain FP32 (torch's default for matmuls); "tf32" applies when
# torch.backends.cuda.matmul.allow_tf32 is on. AMD fp32 is the matrix-core rate.
# A10G (AWS g5) has no NVIDIA datasheet of its own; the A10 figures are used.
# An MI250X appears to torch as two devices (one per GCD), so its row is half
# the datasheet's per-package figure.
# Order matters: the first key found in the device name wins, so more specific
# names come first ("H100 PCIe" before "H100"). A key must not be followed by a
# letter or digit, so "A10" does not match "RTX A1000" nor "L4" match "L40".
T = 1e12
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51.2 * T},
    "H100 NVL": {"bf16": 835 * T, "fp16": 835 * T, "tf32": 417.5 * T, "fp32": 60 * T},
    "H200 NVL": {"bf16": 835 * T, "fp16": 835 * T, "tf32": 417.5 * T, "fp32": 60 * T},
    # H100 SXM reports as e.g. "NVIDIA H100 80GB HBM3"; GH200 has the same compute as H200.
    # Blackwell: GB200 before B200, which its name contains.
    "GB200": {"bf16": 2500 * T, "fp16": 2500 * T, "tf32": 1250 * T, "fp32": 80 * T},
    "B200": {"bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 75 * T},
    "H100": {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T},
    "H200": {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T},
    "A100": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    "A10G": {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T},
    "A10": {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T},
    "L40S": {"bf16": 366.5 * T, "fp16": 366.5 * T, "tf32": 183 * T, "fp32": 91.6 * T},
    "L40": {"bf16": 181 * T, "fp16": 181 * T, "tf32": 90.5 * T, "fp32": 90.5 * T},
    "L4": {"bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30.3 * T},
    # Turing and Volta have no bf16 or tf32 tensor cores.
    "T4": {"fp16": 65 * T, "fp32": 8.1 * T},
    "V100": {"fp16": 125 * T, "fp32": 15.7 * T},
    "MI100": {"bf16": 92.3 * T, "fp16": 184.6 * T, "fp32": 46.1 * T},
    "MI250X": {"bf16": 191.5 * T, "fp16": 191.5 * T, "fp32": 47.9 * T},
    "MI300X": {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T},
}
del T

_PRECISION_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "tensorfloat32": "tf32",
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s for a torch.cuda.get_device_name() string, or None.

    None means CPU, an accelerator not in the table, or a precision the device
    has no tensor-core rate for; the trainer then reports achieved FLOP/s only.
    """
    if not device_name:
        return None
    precision = _PRECISION_ALIASES.get(precision.lower(), precision.lower())
    name = device_name.lower()
    for key, peaks in PEAK_FLOPS.items():
        if re.search(re.escape(key.lower()) + r"(?![a-z0-9])", name):
            return peaks.get(precision)
    return None


PEAK_FLOPS_ENV = "ROSETTA_PEAK_FLOPS"


def peak_for_run(device_name: str | None, precision: str, override: float | None = None,
                 env: Mapping[str, str] | None = None) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, where it came from) for a run's MFU.

    spec.metrics.peakFlops (`override`) first, then $ROSETTA_PEAK_FLOPS, both for any device,
    the CPU included; then the table, for a GPU's torch.cuda.get_device_name() (`device_name`
    None: not a GPU). (None, None) when nothing gives a peak: MFU is then not reported.
    """
    if override is not None:
        return float(override), "spec.metrics.peakFlops"
    text = (os.environ if env is None else env).get(PEAK_FLOPS_ENV, "").strip()
    if text:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"${PEAK_FLOPS_ENV} is {text!r}: expected the peak FLOP/s of one device, "
                             "a positive number such as 6.5e13")
        return value, f"${PEAK_FLOPS_ENV}"
    peak = peak_flops(device_name or "", precision)
    return (peak, "table") if peak is not None else (None, None)


def mfu(achieved_flops_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0..1), or None without a known peak."""
    if not peak or peak <= 0:
        return None
    return achieved_flops_per_s / peak
