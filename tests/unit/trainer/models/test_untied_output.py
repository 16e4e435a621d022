"""flan-T5 / T5 v1.1 / mT5 keep their separate output projection (lm_head) through every path.

transformers 5 builds every T5 config tied; from_pretrained unties when a checkpoint stores a
different lm_head. A model built from its config alone (DeepSpeed checkpoints) must be untied
by Rosetta, or one matrix would silently serve as both.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import T5Config, T5ForConditionalGeneration

from rosetta_trainer.models.models import (
    load_pretrained,
    model_from_config,
    output_is_untied,
    separate_output_in_config,
    untie_output_for,
)


@pytest.fixture()
def flan_like(tmp_path):
    """A tiny T5 v1.1-style checkpoint as the hub has them: gated-GELU, its own lm_head."""
    config = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=4,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in model.state_dict().items()
             if k not in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    state["lm_head.weight"] = torch.randn(64, 16)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "tie_word_embeddings": False}))
    return tmp_path, state


def test_pretrained_loading_keeps_the_separate_lm_head_and_saving_keeps_it_too(flan_like, tmp_path):
    path, state = flan_like
    model = load_pretrained(str(path))
    assert output_is_untied(model)
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(model.shared.weight, state["shared.weight"])
    model.save_pretrained(tmp_path / "again")
    assert torch.equal(load_file(str(tmp_path / "again" / "model.safetensors"))["lm_head.weight"],
                       state["lm_head.weight"])
    assert torch.equal(load_pretrained(str(tmp_path / "again")).lm_head.weight, state["lm_head.weight"])


def test_a_from_config_model_is_untied_by_its_saved_config_and_keeps_both_weights(flan_like, tmp_path):
    path, state = flan_like
    trained = load_pretrained(str(path))
    (tmp_path / "ckpt").mkdir()
    trained.config.save_pretrained(tmp_path / "ckpt")  # what a DeepSpeed checkpoint's model/ holds

    rebuilt = model_from_config(str(tmp_path / "ckpt"))
    assert output_is_untied(rebuilt)
    rebuilt.load_state_dict(trained.state_dict())  # what DeepSpeed's load_checkpoint does with the shards
    rebuilt.tie_weights(recompute_mapping=False)
    assert torch.equal(rebuilt.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(rebuilt.shared.weight, state["shared.weight"])
    # A tied T5 (v1.0 style) config, saved the same way, builds a tied model.
    T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=4,
             decoder_start_token_id=0).save_pretrained(tmp_path / "tied")
    assert not output_is_untied(model_from_config(str(tmp_path / "tied")))


def test_untie_from_a_state_dict_only_when_the_weights_differ(flan_like):
    path, state = flan_like
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(path))
    assert not output_is_untied(model)
    untie_output_for(model, {**state, "lm_head.weight": state["shared.weight"].clone()})
    assert not output_is_untied(model)  # equal: a tied model stored twice stays tied

    untie_output_for(model, state)  # what consolidated_model does before loading ZeRO's fp32 weights
    model.load_state_dict(state, strict=False)
    model.tie_weights(recompute_mapping=False)
    assert output_is_untied(model)
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])


def test_which_configs_have_a_separate_output_projection():
    from transformers import MarianConfig, MT5Config

    assert not separate_output_in_config(T5Config(tie_word_embeddings=True))
    assert separate_output_in_config(T5Config(tie_word_embeddings=False))
    assert separate_output_in_config(MT5Config())  # its flag is dropped; every published mT5 is untied
    assert not separate_output_in_config(MarianConfig(tie_word_embeddings=True))
    assert separate_output_in_config(MarianConfig(tie_word_embeddings=False))


def test_consolidated_deepspeed_weights_keep_the_separate_lm_head(flan_like, tmp_path, monkeypatch):
    """consolidated_model (export, evaluate) on fp32 weights as zero_to_fp32 returns them."""
    import deepspeed.utils.zero_to_fp32 as zero_to_fp32

    from rosetta_trainer.checkpoints.deepspeed_checkpoints import consolidated_model

    path, state = flan_like
    trained = load_pretrained(str(path))
    checkpoint = tmp_path / "step-10"
    (checkpoint / "model").mkdir(parents=True)
    trained.config.save_pretrained(checkpoint / "model")
    full = {k: v.clone() for k, v in trained.state_dict().items()
            if k not in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    monkeypatch.setattr(zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint", lambda *a, **k: full)

    model = consolidated_model(checkpoint)
    assert output_is_untied(model)
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(model.shared.weight, state["shared.weight"])
