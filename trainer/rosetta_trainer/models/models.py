"""Seq2seq models from `transformers`: pretrained weights, or a from-scratch config.

Nothing here defines layers: a from-scratch `transformer` is a MarianConfig
(post-norm encoder-decoder of "Attention is all you need" with sinusoidal
positions and shared embeddings) and `t5` is a T5Config.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
from transformers import AutoModelForSeq2SeqLM, MarianConfig, PretrainedConfig, PreTrainedModel, T5Config

from rosetta_contract.model_fields import ModelSpec

log = logging.getLogger(__name__)

# (d_model, encoder layers, decoder layers, heads, ffn dim); "base" is transformer-base.
TRANSFORMER_SIZES = {
    "tiny": (64, 2, 2, 4, 256),
    "small": (256, 3, 3, 4, 1024),
    "base": (512, 6, 6, 8, 2048),
    "big": (1024, 6, 6, 16, 4096),
}
# T5 sizes follow the published t5-small/base/large shapes; "big" is t5-large.
T5_SIZES = {
    "tiny": (64, 2, 2, 4, 256),
    "small": (512, 6, 6, 8, 2048),
    "base": (768, 12, 12, 12, 3072),
    "big": (1024, 24, 24, 16, 4096),
}

# The trained tokenizers use T5's special-token layout; the configs must agree.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def _dims(spec: ModelSpec) -> dict[str, Any]:
    table = T5_SIZES if spec.architecture == "t5" else TRANSFORMER_SIZES
    d_model, enc, dec, heads, ffn = table[spec.size]
    return {
        "d_model": spec.d_model or d_model,
        "encoder_layers": spec.encoder_layers or enc,
        "decoder_layers": spec.decoder_layers or dec,
        "heads": spec.heads or heads,
        "ffn_dim": spec.ffn_dim or ffn,
        "dropout": 0.1 if spec.dropout is None else spec.dropout,
    }


def scratch_config(spec: ModelSpec, vocab_size: int, max_length: int) -> T5Config | MarianConfig:
    """The transformers config for a from-scratch model."""
    d = _dims(spec)
    if d["d_model"] % d["heads"]:
        raise ValueError(f"spec.model: dModel {d['d_model']} is not divisible by heads {d['heads']}")
    ids: dict[str, Any] = dict(pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=PAD_ID)
    if spec.architecture == "t5":
        # T5Config's annotations leave out tie_word_embeddings, a PretrainedConfig field it passes on.
        return T5Config(  # type: ignore[call-arg]
            vocab_size=vocab_size, d_model=d["d_model"], d_kv=d["d_model"] // d["heads"], d_ff=d["ffn_dim"],
            num_layers=d["encoder_layers"], num_decoder_layers=d["decoder_layers"], num_heads=d["heads"],
            dropout_rate=d["dropout"], feed_forward_proj="relu", tie_word_embeddings=True, **ids,
        )
    return MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d["d_model"],
        encoder_layers=d["encoder_layers"], decoder_layers=d["decoder_layers"],
        encoder_attention_heads=d["heads"], decoder_attention_heads=d["heads"],
        encoder_ffn_dim=d["ffn_dim"], decoder_ffn_dim=d["ffn_dim"],
        max_position_embeddings=spec.max_positions or max(512, max_length + 2),
        dropout=d["dropout"], attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        forced_eos_token_id=EOS_ID, **ids,
    )


def build_model(spec: ModelSpec, vocab_size: int, max_length: int) -> PreTrainedModel:
    """A fresh model (weights from the current torch RNG) or pretrained weights."""
    if spec.name is not None:
        return load_pretrained(spec.name, spec.attention)
    config = scratch_config(spec, vocab_size, max_length)
    model: PreTrainedModel = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=spec.attention)
    return model


def load_pretrained(name_or_path: str, attention: str = "sdpa") -> PreTrainedModel:
    try:
        model: PreTrainedModel = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, attn_implementation=attention)
    except ValueError as exc:
        # Older architectures without an SDPA path: fall back rather than refuse to train.
        if attention != "sdpa" or "sdpa" not in str(exc).lower():
            raise
        log.warning("%s does not support SDPA attention; using eager attention", name_or_path)
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, attn_implementation="eager")
    freeze_fixed_positions(model)
    return model


def model_from_config(path: str, attention: str = "sdpa") -> PreTrainedModel:
    """A model with the architecture saved in `path` and fresh weights (to be overwritten)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    model: PreTrainedModel = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attention)
    if separate_output_in_config(config):
        untie_output(model)
    freeze_fixed_positions(model)
    return model


# T5 v1.1, flan-T5 and mT5 checkpoints store an output projection (lm_head) separate from the
# shared embedding, but transformers 5 builds every T5/mT5 config with tie_word_embeddings=True
# and decides from the weights instead: from_pretrained unties the two when a checkpoint holds
# both with different values. A model built from its config alone (a DeepSpeed checkpoint, whose
# weights come from ZeRO shards afterwards) is tied, and loading such weights into it would keep
# one of the two matrices for both. These helpers make from-config models match their weights.

def separate_output_in_config(config: PretrainedConfig) -> bool:
    """Whether checkpoints of this config keep their own lm_head, read from the config alone.

    T5 configs keep the saved tie_word_embeddings=False of v1.1/flan-T5 as
    scale_decoder_outputs=False, which save_pretrained writes and from_pretrained reads back,
    so a config Rosetta saved (DeepSpeed checkpoints) still says it; MT5Config drops the flag,
    and every published mT5 is untied.
    """
    if config.model_type == "mt5":
        return True
    if config.model_type == "t5":
        return getattr(config, "scale_decoder_outputs", True) is False
    return not getattr(config, "tie_word_embeddings", True)


def _weight_name(model: PreTrainedModel, module: torch.nn.Module | None) -> str | None:
    return next((f"{name}.weight" for name, m in model.named_modules() if m is module), None)


def output_is_untied(model: PreTrainedModel) -> bool:
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    return out is not None and inp is not None and out.weight is not inp.weight


def untie_output(model: PreTrainedModel) -> None:
    """Give the output projection its own weight (a copy of the current one), for good: later
    tie_weights() calls and save_pretrained treat it as a separate parameter."""
    out = model.get_output_embeddings()
    name = _weight_name(model, out)
    if name is None:
        return
    if not output_is_untied(model):
        out.weight = torch.nn.Parameter(out.weight.detach().clone(), requires_grad=out.weight.requires_grad)
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    tied.pop(name, None)


def untie_output_for(model: PreTrainedModel, state: Mapping[str, torch.Tensor]) -> None:
    """Untie the output projection when `state` (a full state dict) holds a different one."""
    name = _weight_name(model, model.get_output_embeddings())
    inp_name = _weight_name(model, model.get_input_embeddings())
    if (name is not None and inp_name is not None and name in state and inp_name in state
            and not torch.equal(state[name], state[inp_name])):
        untie_output(model)


def freeze_fixed_positions(model: PreTrainedModel) -> None:
    # Sinusoidal position tables are constants that from_config creates frozen, but loading
    # them back makes them trainable again: AdamW would then update them after a resume (and
    # the optimizer state saved before it no longer matches the parameter groups).
    for module in model.modules():
        if "Sinusoidal" in type(module).__name__:
            for param in module.parameters(recurse=False):
                param.requires_grad_(False)


def count_parameters(model: torch.nn.Module) -> int:
    # Under ZeRO-3 a parameter is an empty placeholder; DeepSpeed keeps its real size in ds_numel.
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
