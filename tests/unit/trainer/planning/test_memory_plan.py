"""`rosetta plan`: the memory figures against hand calculations, the recommendation, the CLI.

The hand calculations use the standard formulas (ZeRO paper: 2Ψ weights + 2Ψ gradients +
KΨ/N optimizer state with K = 12 for mixed-precision AdamW), written out here rather than
imported, so that a change to memory_plan.py's formulas has to agree with them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoModelForSeq2SeqLM, T5Config

from rosetta_cli.main import main
from rosetta_trainer.planning import memory_plan as mp
from rosetta_trainer.planning import plan_inputs as pi
from rosetta_trainer.planning.memory_plan import Batch, Setting
from rosetta_trainer.planning.plan_inputs import Cluster, GiB

# A tiny T5 whose parameter count is derived by hand below.
V, H, KV, HEADS, FF, LAYERS, BUCKETS = 1000, 64, 16, 4, 256, 2, 32


def tiny_t5(**overrides) -> T5Config:
    kwargs = dict(vocab_size=V, d_model=H, d_kv=KV, num_heads=HEADS, d_ff=FF, num_layers=LAYERS,
                  num_decoder_layers=LAYERS, relative_attention_num_buckets=BUCKETS, feed_forward_proj="relu",
                  dropout_rate=0.1, decoder_start_token_id=0)
    return T5Config(**{**kwargs, **overrides})


def hand_parameter_count() -> int:
    inner = HEADS * KV
    attention = 4 * H * inner  # q, k, v, o; T5 has no biases
    ffn = 2 * H * FF  # wi, wo
    norm = H  # RMS norm: a scale only
    encoder_layer = attention + norm + ffn + norm
    decoder_layer = attention + norm + attention + norm + ffn + norm
    relative_bias = BUCKETS * HEADS  # first layer of each stack only
    embedding = V * H  # shared by encoder, decoder and the (tied) LM head
    return (embedding + LAYERS * encoder_layer + relative_bias + norm
            + LAYERS * decoder_layer + relative_bias + norm)


PSI = hand_parameter_count()  # 294,400
LARGEST = V * H  # the shared embedding


@pytest.fixture(scope="module")
def shape() -> pi.ModelShape:
    return pi.shape_of_config(tiny_t5())


def test_parameter_counts_are_exact(shape):
    assert PSI == 294_400
    assert (shape.params, shape.trainable, shape.largest_layer) == (PSI, PSI, LARGEST)
    assert (shape.d_model, shape.attention_dim, shape.ffn_dim, shape.heads) == (H, HEADS * KV, FF, HEADS)
    assert not shape.gated_ffn and shape.relative_bias


def test_builtin_table_gives_the_published_t5_small():
    # 60,506,624 is t5-small's published size (embedding tied to the LM head).
    shape = pi.shape_of_config(pi.builtin_config("google-t5/t5-small"))
    assert shape.params == 60_506_624
    assert shape.largest_layer == 32128 * 512
    assert pi.builtin_config("t5-xxl-does-not-exist") is None


def test_flan_t5_counts_its_separate_lm_head():
    # flan-t5-small's published size: 76,961,152, of which 32128 × 512 is its own LM head
    # (transformers 5 builds the config tied; the planner unties it as loading the weights does).
    shape = pi.shape_of_config(pi.builtin_config("google/flan-t5-small"))
    assert shape.params == 76_961_152


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_model_states_match_the_hand_formulas(shape, precision):
    n = 4
    hand = {  # (weights, gradients, optimizer) per GPU
        # fp32 weights + their 16-bit autocast copies, fp32 grads + DDP's bucket copy, AdamW m and v
        Setting(0): (4 * PSI + 2 * PSI, 4 * PSI + 4 * PSI, 8 * PSI),
        # ZeRO paper stage 1: 2Ψ + 2Ψ + 12Ψ/N, plus DeepSpeed's fp32 gradient partition 4Ψ/N
        Setting(1): (2 * PSI, 2 * PSI + 4 * PSI / n, 12 * PSI / n),
        # stage 2: 2Ψ + (2 + 4 + 12)Ψ/N, which is DeepSpeed's 2Ψ + 18Ψ/N
        Setting(2): (2 * PSI, 6 * PSI / n, 12 * PSI / n),
        # stage 3: 18Ψ/N + the gathered largest layer's 16-bit weights and gradients (4L)
        Setting(3): (2 * PSI / n + 2 * LARGEST, 4 * PSI / n + 2 * LARGEST, 12 * PSI / n),
        Setting(2, True): (2 * PSI, 0, 0),
        Setting(3, True): (2 * PSI / n + 2 * LARGEST, 2 * LARGEST, 0),
        Setting(3, True, True): (2 * LARGEST, 2 * LARGEST, 0),
    }
    for setting, expected in hand.items():
        assert mp.model_state_bytes(setting, shape, n, precision) == pytest.approx(expected), setting.name
    # One GPU: no DDP buckets.
    assert mp.model_state_bytes(Setting(0), shape, 1, precision)[1] == 4 * PSI


def test_fp32_counts_four_byte_weights_and_gradients(shape):
    n = 2
    assert mp.model_state_bytes(Setting(0), shape, n, "fp32") == (4 * PSI, 8 * PSI, 8 * PSI)
    assert mp.model_state_bytes(Setting(2), shape, n, "fp32") == pytest.approx((4 * PSI, 4 * PSI / n, 12 * PSI / n))
    assert mp.model_state_bytes(Setting(3), shape, n, "fp32") == pytest.approx(
        (4 * PSI / n + 4 * LARGEST, 4 * PSI / n + 4 * LARGEST, 12 * PSI / n))


@pytest.mark.parametrize("nodes,gpus", [(1, 8), (2, 4), (4, 8)])
def test_zero_rows_reproduce_deepspeeds_own_estimators(shape, nodes, gpus):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as zero3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as zero2

    cases = {
        Setting(2): zero2(PSI, gpus, nodes, cpu_offload=False),
        Setting(2, True): zero2(PSI, gpus, nodes, cpu_offload=True),
        Setting(3): zero3(PSI, LARGEST, gpus, nodes, cpu_offload=False, cpu_offload_params=False)[:2],
        Setting(3, True): zero3(PSI, LARGEST, gpus, nodes, cpu_offload=True, cpu_offload_params=False)[:2],
        Setting(3, True, True): zero3(PSI, LARGEST, gpus, nodes, cpu_offload=True, cpu_offload_params=True)[:2],
    }
    for setting, (cpu, gpu) in cases.items():
        assert sum(mp.model_state_bytes(setting, shape, nodes * gpus, "bf16")) == pytest.approx(gpu, abs=1)
        assert mp.node_cpu_bytes(setting, shape, nodes, gpus) == cpu


def test_activations_match_the_hand_formula(shape):
    b, s, t = 2, 10, 6
    p = 2  # bf16
    i, m = HEADS * KV, 1  # dropout on: one mask byte per element
    self_attn = p * (2 * H + 4 * i) + m * H
    cross = p * (2 * H + 2 * i) + m * H
    ffn = p * (2 * H + 2 * FF) + m * (FF + H)
    bias = p * b * HEADS  # sdpa with T5's relative bias: one heads × q × k mask per attention
    encoder = LAYERS * (b * s * (self_attn + ffn) + bias * s * s)
    decoder = LAYERS * (b * t * (self_attn + cross + ffn) + b * s * 2 * p * i + bias * t * t + bias * t * s)
    stacks = b * (s + t) * (2 * p * H + m * H)
    logits = b * t * V * (p + 12)
    assert mp.activation_bytes(shape, Batch(b, s, t, "bf16", "sdpa")) == encoder + decoder + stacks + logits


def test_activation_checkpointing_keeps_layer_inputs_and_one_layer(shape):
    b, s, t, p = 2, 10, 6, 2
    i, m = HEADS * KV, 1
    self_attn = p * (2 * H + 4 * i) + m * H
    cross = p * (2 * H + 2 * i) + m * H
    ffn = p * (2 * H + 2 * FF) + m * (FF + H)
    bias = p * b * HEADS
    encoder_layer = b * s * (self_attn + ffn) + bias * s * s
    decoder_layer = b * t * (self_attn + cross + ffn) + b * s * 2 * p * i + bias * t * t + bias * t * s
    inputs = p * H * LAYERS * b * (s + t)  # what each checkpointed layer keeps: its input
    biases = bias * (s * s + t * t + t * s)  # T5's position biases, once per stack
    outside = b * (s + t) * (2 * p * H + m * H) + b * t * V * (p + 12)
    on = mp.activation_bytes(shape, Batch(b, s, t, "bf16", "sdpa", checkpointing=True))
    assert on == inputs + biases + max(encoder_layer, decoder_layer) + outside
    assert on < mp.activation_bytes(shape, Batch(b, s, t, "bf16", "sdpa"))


def test_the_plan_reads_activation_checkpointing_from_the_spec():
    on, off = mp_spec(), mp_spec()
    on.training.activation_checkpointing = True
    assert Batch.of(on).checkpointing and not Batch.of(off).checkpointing
    plan_on, plan_off = mp.plan_spec(on), mp.plan_spec(off)
    assert plan_on.estimates[0].activations < plan_off.estimates[0].activations
    assert any("activation checkpointing (each layer" in n for n in plan_on.notes)


def test_activation_estimate_is_near_what_a_real_forward_saves():
    # Measured: the bytes autograd saves for backward in a real fp32 forward + loss on the CPU
    # (eager attention: the CPU's sdpa falls back to the math path, which stores the scores).
    # The CPU keeps dropout masks as fp32 where CUDA keeps bytes, so the estimate is lower.
    config, b, s, t = tiny_t5(vocab_size=2000, d_model=128, d_kv=32), 4, 48, 32
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids, labels = torch.randint(3, 2000, (b, s)), torch.randint(3, 2000, (b, t))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logits = model(input_ids=ids, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels)).logits
        F.cross_entropy(logits.float().view(-1, 2000), labels.view(-1), label_smoothing=0.1)
    estimate = mp.activation_bytes(pi.shape_of_config(config), Batch(b, s, t, "fp32", "eager"))
    logits_gradient = 4 * b * t * 2000  # counted by the estimate, allocated only by the backward
    assert 0.6 <= (estimate - logits_gradient) / sum(saved.values()) <= 1.3


def test_token_budget_plans_for_full_length_pairs():
    spec = mp_spec(batch={"tokens": 4096}, data={"maxSourceLength": 200, "maxTargetLength": 56})
    assert Batch.of(spec) == Batch(16, 200, 56, "bf16", "sdpa")


# ---------------------------------------------------------------------- recommendation


DDP = Setting(0)


def plan_with(shape, gpu_gib: float, requested: Setting = DDP, node_gib: float | None = None) -> mp.Plan:
    cluster = Cluster(1, 8, int(gpu_gib * GiB), "test", int(node_gib * GiB) if node_gib else None)
    return mp.make_plan(shape, Batch(1, 8, 8, "bf16", "sdpa"), cluster, requested)


def scaled(shape, factor: int) -> pi.ModelShape:
    """The tiny model's architecture with factor× the parameters: figures in GiB, not KiB."""
    from dataclasses import replace

    return replace(shape, params=shape.params * factor, trainable=shape.trainable * factor,
                   largest_layer=shape.largest_layer * factor)


def test_a_model_that_fits_ddp_gets_ddp(shape):
    big = scaled(shape, 1000)  # Ψ = 294.4M: DDP needs 22Ψ = 6.0 GiB + activations
    plan = plan_with(big, 80)
    assert plan.recommended.setting == Setting(0)
    assert plan.warnings() == []


def test_a_model_that_only_fits_zero3_gets_zero3(shape):
    big = scaled(shape, 10_000)  # Ψ = 2.944e9, L = 6.4e8
    psi, largest = 2.944e9, 6.4e8
    zero2 = 2 * psi + 18 * psi / 8  # 11.65 GiB
    zero3 = 4 * largest + 18 * psi / 8  # 8.55 GiB
    capacity = 11.0  # GiB: 9.9 usable
    assert zero3 < capacity * 0.9 * GiB < zero2
    plan = plan_with(big, capacity, requested=Setting(2))
    assert plan.recommended.setting == Setting(3)
    (warning,) = plan.warnings()
    assert warning.startswith("WARNING: ZeRO-2 (spec.distributed) needs about 11.")
    assert "11.0 GiB (9.9 GiB usable" in warning and "ZeRO-3 would fit" in warning


def test_a_model_that_fits_nothing_warns(shape):
    plan = plan_with(scaled(shape, 100_000), 16, requested=Setting(3, True, True))
    assert plan.recommended is None
    (warning,) = plan.warnings()
    assert "ZeRO-3 + optimizer + parameter offload" in warning and "no setting fits" in warning


def test_node_memory_counts_too(shape):
    big = scaled(shape, 1000)  # optimizer offload wants max(4·8, 16)·Ψ·1.5 = 13.2 GiB of CPU
    plan = plan_with(big, 80, requested=Setting(2, True), node_gib=8)
    assert not plan.fits(plan.estimate(Setting(2, True)))
    assert "of CPU memory per node but spec.resources.memory is 8.0 GiB" in plan.warnings()[0]


def test_spec_setting_follows_the_raw_deepspeed_config():
    spec = mp_spec(distributed={"backend": "deepspeed", "zeroStage": 2,
                                "deepspeedConfig": {"zero_optimization": {"stage": 3}}})
    assert mp.setting_of(spec.distributed) == Setting(3)
    spec = mp_spec(distributed={"backend": "deepspeed", "zeroStage": 3, "offload": {"optimizer": "cpu"}})
    assert mp.setting_of(spec.distributed) == Setting(3, True)


# ------------------------------------------------------------------------------ cluster


@pytest.mark.parametrize("cluster_fields,expected_gib,source", [
    ({"network": {"profile": "eks-p5"}}, 80, "p5.48xlarge"),
    ({"network": {"profile": "eks-p4d"}}, 40, "p4d.24xlarge"),
    ({"network": {"profile": "gke-a3"}}, 80, "nvidia-h100-80gb"),
    ({"scheduling": {"nodeSelector": {"node.kubernetes.io/instance-type": "g5.12xlarge"}}}, 24, "A10G"),
    ({"scheduling": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4de.24xlarge"}}}, 80, "p4de"),
    ({"scheduling": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}}, 40, "gpu.product"),
    ({}, 80, "assumed"),
])
def test_gpu_memory_from_the_cluster_fields(cluster_fields, expected_gib, source):
    cluster = pi.cluster_of(mp_spec(**cluster_fields))
    assert cluster.gpu_memory == expected_gib * GiB and source in cluster.gpu_memory_source
    assert pi.cluster_of(mp_spec(**cluster_fields), "24GiB").gpu_memory == 24 * GiB


def test_sizes_parse_and_bad_ones_say_what_is_expected():
    assert pi.parse_bytes("80GiB", "x") == 80 * GiB
    assert pi.parse_bytes("1800Gi", "x") == 1800 * GiB
    assert pi.parse_bytes("40GB", "x") == 40 * 10**9
    with pytest.raises(ValueError, match="--gpu-memory: 'lots' is not a size like 80GiB"):
        pi.parse_bytes("lots", "--gpu-memory")


# ---------------------------------------------------------------------------------- CLI


def document(model: dict | None = None, batch: dict | None = None, data: dict | None = None,
             distributed: dict | None = None, **cluster) -> dict:
    spec = {
        "nodes": 1, "gpusPerNode": 8,
        "model": model or {"architecture": "t5", "size": "small"},
        "tokenizer": {"train": {"vocabSize": 8000}},
        "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated"}], **(data or {})},
        "training": {"maxSteps": 10, "precision": "bf16", "device": "cuda", "batch": batch or {"sentences": 8}},
        **cluster,
    }
    if distributed:
        spec["distributed"] = distributed
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": "plan-test"}, "spec": spec}


def mp_spec(**kwargs):
    from rosetta_contract.spec import parse_training

    return parse_training(document(**kwargs)).spec


def write(tmp_path, **kwargs) -> str:
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(document(**kwargs)))
    return str(path)


def test_plan_prints_a_row_per_setting_and_a_recommendation(tmp_path, capsys):
    assert main(["plan", "-f", write(tmp_path), "--gpu-memory", "24GiB"]) == 0
    out = capsys.readouterr().out
    for setting in mp.SETTINGS:
        assert setting.name in out
    assert "DDP ← spec" in out
    assert "recommended: DDP" in out and "WARNING" not in out
    assert "from-scratch t5 (small), vocabulary 8000 (tokenizer.train.vocabSize)" in out
    assert "GPU memory: 24.0 GiB (--gpu-memory)" in out


def test_plan_json_parses_and_agrees_with_the_table(tmp_path, capsys):
    assert main(["plan", "-f", write(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in plan["settings"]] == [s.name for s in mp.SETTINGS]
    assert plan["requested"] == "DDP" and plan["recommended"] == "DDP"
    ddp = plan["settings"][0]["gpu"]
    assert ddp["total"] == pytest.approx(sum(v for k, v in ddp.items() if k != "total"), abs=4)
    assert plan["model"]["params"] == pi.shape_of_config(
        pi.model_config(mp_spec())[0]).params


def test_plan_says_why_it_cannot_plan(tmp_path, capsys):
    path = write(tmp_path, model={"name": "/nowhere/my-model"})
    assert main(["plan", "-f", path]) == 2
    assert "spec.model.name: '/nowhere/my-model' is not a local directory here" in capsys.readouterr().err
    assert main(["plan", "-f", write(tmp_path), "--gpu-memory", "huge"]) == 2
    assert "--gpu-memory: 'huge' is not a size" in capsys.readouterr().err


T5_11B_ON_A10G = dict(model={"name": "t5-11b"}, nodes=1, gpusPerNode=4,
                      scheduling={"nodeSelector": {"node.kubernetes.io/instance-type": "g5.12xlarge"}})


def test_validate_warns_when_the_spec_setting_does_not_fit(tmp_path, capsys):
    assert main(["validate", "-f", write(tmp_path, **T5_11B_ON_A10G)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("ok: plan-test")
    (warning,) = captured.err.strip().splitlines()
    assert warning.startswith("WARNING: DDP (spec.distributed) needs about ")
    assert "the GPUs have 24.0 GiB" in warning and "no setting fits" in warning
    assert "┃" not in captured.out + captured.err  # the warning only, not the table


def test_validate_is_quiet_when_it_fits_and_notes_a_skipped_plan(tmp_path, capsys):
    assert main(["validate", "-f", write(tmp_path, model={"name": "t5-small"})]) == 0
    assert capsys.readouterr().err == ""
    assert main(["validate", "-f", write(tmp_path, model={"name": "/models/mine"})]) == 0
    assert "note: memory plan skipped: spec.model.name: '/models/mine'" in capsys.readouterr().err


def test_validate_of_cpu_training_does_not_import_torch(tmp_path):
    path = tmp_path / "cpu.yaml"
    doc = document(nodes=2, gpusPerNode=0, volumes=[{"name": "runs", "mountPath": "/runs", "purpose": "checkpoints",
                                                     "persistentVolumeClaim": {"claimName": "runs"}}])
    doc["spec"]["training"]["device"] = "cpu"
    path.write_text(yaml.safe_dump(doc))
    code = ("import sys; from rosetta_cli.main import main; rc = main(['validate', '-f', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: plan-test") and result.stderr == ""


def test_without_deepspeed_the_plan_says_what_to_install(shape, monkeypatch):
    """`pip install 'rosetta-mt[trainer]'` has no DeepSpeed, whose estimators give the node memory."""
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.stage3", None)
    with pytest.raises(pi.PlanSkipped, match=r"pip install 'rosetta-mt\[deepspeed\]'"):
        mp.node_cpu_bytes(Setting(3), shape, nodes=2, gpus_per_node=8)
