"""The training criterion of a seq2seq model as one module: the region a compiled step compiles.

`Seq2SeqLoss(model)(input_ids, attention_mask, labels)` shifts the labels into decoder inputs, runs
the encoder and the decoder, and returns the mean label-smoothed cross-entropy per target token and
the number of target tokens. Two things in it are for the accelerator's sake:

- The padding mask goes in as a 4-D mask. Given the usual (batch, length) mask, transformers' mask
  helpers ask the device whether it holds any padding (`padding_mask.all()`), host-device
  synchronisations in every eager step; a 4-D mask is taken as it is (decoder_mask() for the
  decoder's own).
- For the architectures whose decoder output and head it knows (Marian/BART-style `model.model`,
  T5/mT5's stacks), the head and the loss are one chunked function (losses.linear_cross_entropy):
  the (tokens × vocabulary) logits never exist whole, in fp32 or otherwise. Any other model runs
  its own forward and the loss takes its logits.
"""

from __future__ import annotations

from typing import Any

import torch

from rosetta_trainer.models.losses import label_smoothed_cross_entropy, linear_cross_entropy

# A Hugging Face seq2seq model, whose parts (encoder, decoder, lm_head, final_logits_bias) differ by
# architecture and are looked up by name.
Model = Any

IGNORE_INDEX = -100  # batching.IGNORE_INDEX; repeated so that this module needs no data code

_T5_FAMILY = ("t5", "mt5", "umt5")


def padding_mask_4d(attention_mask: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """(batch, 1, 1, source length): a mask every attention over the source broadcasts, the encoder's
    own and the decoder's cross-attention alike. SDPA and flex take booleans (True: attend); the
    eager implementation adds it to the scores, so it is 0 or the dtype's lowest value there."""
    keep = attention_mask[:, None, None, :].bool()
    if implementation == "eager":
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
    return keep


def causal_mask_4d(length: int, implementation: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1, 1, length, length): each target position sees itself and the ones before it."""
    keep = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    if implementation == "eager":
        return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)
    return keep


def decoder_mask(model: Model, decoder_input_ids: torch.Tensor) -> torch.Tensor | None:
    """The decoder's self-attention mask to pass, or None to let the model make its causal one.

    Marian/BART-style decoders, run eagerly without a mask, make a (batch, length) one of ones and
    then ask the device whether it is all ones: a synchronisation per step. An explicit causal mask
    is taken as it is. Compiled, the model skips that check (and with no mask SDPA may take its
    causal kernels), and T5's stack never makes it: None there."""
    if model.config.model_type in _T5_FAMILY or torch.compiler.is_compiling():
        return None
    return causal_mask_4d(decoder_input_ids.size(1), model.config._attn_implementation, model.dtype,
                          decoder_input_ids.device)


def fused_head(model: Model) -> bool:
    """Whether decoder_states() knows where `model`'s decoder output and head are."""
    if getattr(model.config, "model_type", None) in _T5_FAMILY:
        return hasattr(model, "encoder") and hasattr(model, "decoder") and hasattr(model, "lm_head")
    base = getattr(model, "model", None)
    return (getattr(model.config, "is_encoder_decoder", False) and base is not None
            and hasattr(base, "encoder") and hasattr(base, "decoder") and hasattr(model, "lm_head")
            and getattr(model.lm_head, "bias", None) is None)


def decoder_states(model: Model, input_ids: torch.Tensor, mask: torch.Tensor,
                   decoder_input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(the hidden states the head projects, its weight, its bias or None): model(...).logits is
    `hidden @ weight.T + bias`, to the last bit (tests/unit/trainer/models/test_seq2seq_loss.py)."""
    config = model.config
    if config.model_type in _T5_FAMILY:
        encoded = model.encoder(input_ids=input_ids, attention_mask=mask)[0]
        hidden = model.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoded,
                               encoder_attention_mask=mask)[0]
        if getattr(config, "scale_decoder_outputs", False):
            hidden = hidden * (config.d_model ** -0.5)
        return hidden, model.lm_head.weight, None
    hidden = model.model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids,
                         decoder_attention_mask=decoder_mask(model, decoder_input_ids))[0]
    bias = getattr(model, "final_logits_bias", None)  # Marian, BART: a (1, vocabulary) buffer
    return hidden, model.lm_head.weight, None if bias is None else bias.reshape(-1)


class Seq2SeqLoss(torch.nn.Module):
    """The model and its criterion; forward returns (loss per target token, target tokens)."""

    def __init__(self, model: Model, smoothing: float, chunks: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.smoothing = smoothing
        # A fixed count: under torch.compile with dynamic shapes a loop whose length depends on the
        # batch would be specialised on it (a recompile per batch size).
        self.chunks = chunks
        self.fused = fused_head(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels)
        mask = padding_mask_4d(attention_mask, model.config._attn_implementation, model.dtype)
        if self.fused:
            hidden, weight, bias = decoder_states(model, input_ids, mask, decoder_input_ids)
            loss_sum = linear_cross_entropy(hidden, weight, bias, labels, self.smoothing, IGNORE_INDEX, self.chunks)
        else:
            logits = model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids,
                           decoder_attention_mask=decoder_mask(model, decoder_input_ids)).logits
            loss_sum = label_smoothed_cross_entropy(logits, labels, self.smoothing, IGNORE_INDEX)
        tokens = (labels != IGNORE_INDEX).sum()
        return loss_sum / tokens.clamp(min=1), tokens
