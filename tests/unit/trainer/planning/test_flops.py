"""forward_flops against torch's own FLOP counter on tiny random models.

The counter sees every aten matmul (mm/addmm/bmm) of an eager forward. Eager
attention multiplies the full T x T decoder scores and masks afterwards, and
forward_flops also counts the full square, so causal masking needs no
correction on either side.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSeq2SeqLM, BartConfig, MarianConfig, MT5Config, T5Config

from rosetta_trainer.planning.flops import (
    PEAK_FLOPS,
    PEAK_FLOPS_ENV,
    Seq2SeqDims,
    forward_flops,
    mfu,
    peak_flops,
    peak_for_run,
    training_flops,
)

VOCAB = 97


def t5(gated: bool) -> T5Config:
    # d_kv * heads (3 * 16 = 48) != d_model (32) on purpose: T5 allows it.
    return T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, num_heads=3, d_ff=64, num_layers=2, num_decoder_layers=3,
        feed_forward_proj="gated-gelu" if gated else "relu", dropout_rate=0.0,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )


def marian() -> MarianConfig:
    return MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48,
        max_position_embeddings=64, dropout=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )


CONFIGS = {"t5-relu": lambda: t5(False), "t5-gated": lambda: t5(True), "marian": marian}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_and_dims(request):
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").eval()
    return model, Seq2SeqDims.from_hf_config(config)


def counted_flops(model, batch: int, src_len: int, tgt_len: int) -> int:
    src = torch.randint(3, VOCAB, (batch, src_len))
    tgt = torch.randint(3, VOCAB, (batch, tgt_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=src, decoder_input_ids=tgt, use_cache=False)
    return counter.get_total_flops()


@pytest.mark.parametrize("batch, src_len, tgt_len", [(2, 7, 5), (3, 11, 13)])
def test_forward_flops_match_torch_counter(model_and_dims, batch, src_len, tgt_len):
    model, dims = model_and_dims
    ours = forward_flops(dims, [src_len] * batch, [tgt_len] * batch)
    assert ours == pytest.approx(counted_flops(model, batch, src_len, tgt_len), rel=0.02)


def test_padded_batch_counts_only_real_tokens(model_and_dims):
    model, dims = model_and_dims
    src, tgt = [4, 9, 6], [7, 3, 5]
    # Each pair run alone has no padding: the sum is the work on real tokens only.
    unpadded = sum(counted_flops(model, 1, s, t) for s, t in zip(src, tgt))
    ours = forward_flops(dims, src, tgt)
    assert ours == pytest.approx(unpadded, rel=0.02)
    padded = counted_flops(model, len(src), max(src), max(tgt))
    assert ours < 0.8 * padded


def test_flops_are_additive_and_training_is_three_forwards():
    dims = Seq2SeqDims.from_hf_config(marian())
    assert forward_flops(dims, [5, 8], [6, 2]) == pytest.approx(
        forward_flops(dims, [5], [6]) + forward_flops(dims, [8], [2])
    )
    assert training_flops(dims, [5, 8], [6, 2]) == pytest.approx(3 * forward_flops(dims, [5, 8], [6, 2]))
    assert forward_flops(dims, [], []) == 0.0
    with pytest.raises(ValueError, match="target lengths"):
        forward_flops(dims, [1, 2], [1])


def test_dims_from_configs():
    gated = Seq2SeqDims.from_hf_config(t5(True))
    assert (gated.d_model, gated.heads, gated.d_kv, gated.inner_dim) == (32, 3, 16, 48)
    assert (gated.encoder_layers, gated.decoder_layers, gated.gated_ffn) == (2, 3, True)
    assert Seq2SeqDims.from_hf_config(t5(False)).gated_ffn is False
    mt5 = Seq2SeqDims.from_hf_config(MT5Config(vocab_size=250112))
    assert mt5.gated_ffn and (mt5.d_model, mt5.heads, mt5.d_kv, mt5.vocab_size) == (512, 6, 64, 250112)
    m = Seq2SeqDims.from_hf_config(marian())
    assert (m.d_kv, m.ffn_dim, m.decoder_ffn_dim, m.gated_ffn) == (8, 64, 48, False)
    bart = Seq2SeqDims.from_hf_config(BartConfig(vocab_size=100, d_model=64, encoder_attention_heads=4))
    assert bart.d_kv == 16 and bart.vocab_size == 100
    with pytest.raises(ValueError, match="cannot read"):
        Seq2SeqDims.from_hf_config(object())


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "fp16", 835e12),
        ("nvidia h200", "bf16", 989.4e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5e12),
        ("NVIDIA A10G", "bf16", 125e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 366.5e12),
        ("Tesla T4", "fp16", 65e12),
        ("NVIDIA B200", "bf16", 2250e12),
        ("NVIDIA B200", "tf32", 1100e12),
        ("NVIDIA GB200", "bf16", 2500e12),
        ("NVIDIA H200", "fp16", 989.4e12),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("AMD Instinct MI100", "bf16", 92.3e12),
        ("AMD Instinct MI250X/MI250", "bf16", 191.5e12),
        ("AMD Instinct MI300X", "bf16", 1307.4e12),
    ],
)
def test_peak_flops_lookup(name, precision, expected):
    assert peak_flops(name, precision) == pytest.approx(expected)


@pytest.mark.parametrize(
    "name, precision",
    [("cpu", "fp32"), ("", "bf16"), ("NVIDIA GeForce RTX 4090", "bf16"), ("Tesla T4", "bf16"),
     ("NVIDIA RTX A1000", "fp16")],
)
def test_peak_flops_unknown(name, precision):
    assert peak_flops(name, precision) is None


def test_peak_table_is_dense_and_ordered():
    for key, peaks in PEAK_FLOPS.items():
        assert set(peaks) <= {"bf16", "fp16", "fp32", "tf32"}, key
        # Dense: the largest is GB200's 2.5 PFLOP/s bf16; a sparse figure slipped in would be twice its row's.
        assert all(1e12 < v <= 2.5e15 for v in peaks.values()), key
    keys = list(PEAK_FLOPS)
    assert keys.index("H100 PCIe") < keys.index("H100")
    assert keys.index("GB200") < keys.index("B200")


@pytest.mark.parametrize("name", ["Tesla T4", "NVIDIA L4", "NVIDIA A10G", "NVIDIA A100-SXM4-80GB",
                                  "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200"])
def test_every_gpu_of_the_scenarios_has_a_half_precision_peak(name):
    assert peak_flops(name, "fp16") is not None


def test_peak_for_run_spec_then_env_then_table():
    h100 = "NVIDIA H100 80GB HBM3"
    assert peak_for_run(h100, "bf16", 5e14, env={PEAK_FLOPS_ENV: "7e14"}) == (5e14, "spec.metrics.peakFlops")
    assert peak_for_run(h100, "bf16", None, env={PEAK_FLOPS_ENV: " 7e14 "}) == (7e14, "$ROSETTA_PEAK_FLOPS")
    assert peak_for_run(h100, "bf16", None, env={}) == (pytest.approx(989.4e12), "table")
    assert peak_for_run(h100, "bf16", None, env={PEAK_FLOPS_ENV: ""}) == (pytest.approx(989.4e12), "table")
    # Any device with an override, the CPU included; nothing without one.
    assert peak_for_run(None, "fp32", 1e12, env={}) == (1e12, "spec.metrics.peakFlops")
    assert peak_for_run("Some New Accelerator", "bf16", None, env={PEAK_FLOPS_ENV: "3e15"})[0] == 3e15
    assert peak_for_run(None, "fp32", None, env={}) == (None, None)
    assert peak_for_run("NVIDIA GeForce RTX 4090", "bf16", None, env={}) == (None, None)


@pytest.mark.parametrize("value", ["fast", "0", "-1e12", "nan", "inf"])
def test_a_bad_env_peak_is_a_clear_error(value):
    with pytest.raises(ValueError, match=r"\$ROSETTA_PEAK_FLOPS is .*: expected the peak FLOP/s of one device"):
        peak_for_run(None, "fp32", None, env={PEAK_FLOPS_ENV: value})


def test_spec_peak_flops_field():
    from rosetta_contract.documents import parse_document
    from rosetta_contract.strict_model import ConfigError
    from support.training import TINY, deep_update

    assert parse_document(TINY).spec.metrics.peak_flops is None
    spec = parse_document(deep_update(TINY, {"spec": {"metrics": {"peakFlops": 6.5e13}}})).spec
    assert spec.metrics.peak_flops == 65e12
    for bad in (0, -1.0, 1e19):
        with pytest.raises(ConfigError, match="spec.metrics.peakFlops"):
            parse_document(deep_update(TINY, {"spec": {"metrics": {"peakFlops": bad}}}))


def test_mfu():
    assert mfu(494.7e12, peak_flops("NVIDIA H100 80GB HBM3", "bf16")) == pytest.approx(0.5)
    assert mfu(1e12, None) is None
    assert mfu(1e12, 0.0) is None
