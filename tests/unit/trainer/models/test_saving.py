"""A model written by models.saving.save_pretrained: Hugging Face's files, and DeepSpeed left unimported."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

SAVE = textwrap.dedent("""
    import sys
    from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel
    from rosetta_trainer.models.saving import save_pretrained

    model = MarianMTModel(MarianConfig(vocab_size=32, pad_token_id=0, decoder_start_token_id=0, d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2,
                                       encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16))
    save_pretrained(model, sys.argv[1], safe_serialization=True)
    print("deepspeed" in sys.modules)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1])
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
""")


@pytest.mark.slow  # ~8 s: a fresh interpreter, so that nothing else has imported DeepSpeed
def test_saving_a_model_does_not_import_deepspeed(tmp_path):
    # Installed by the [deepspeed] extra, as in the trainer image; without it the test would prove nothing.
    assert importlib.util.find_spec("deepspeed") is not None
    result = subprocess.run([sys.executable, "-c", SAVE, str(tmp_path / "model")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False"], result.stdout
    assert (tmp_path / "model" / "model.safetensors").is_file() and (tmp_path / "model" / "config.json").is_file()


def test_the_probe_is_back_after_saving(tmp_path):
    from accelerate.utils import other
    from transformers import MarianConfig, MarianMTModel

    from rosetta_trainer.models.saving import save_pretrained

    probe = other.is_deepspeed_available
    model = MarianMTModel(MarianConfig(vocab_size=32, pad_token_id=0, decoder_start_token_id=0, d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2,
                                       encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16))
    save_pretrained(model, tmp_path / "model", safe_serialization=True)
    assert other.is_deepspeed_available is probe
