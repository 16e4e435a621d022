"""Will it fit? Per-GPU and per-node memory of a TranslationTraining under DDP and each ZeRO stage.

`rosetta plan -f FILE` prints one row per setting (DDP, ZeRO-1/2/3, with and without CPU
offload), recommends the cheapest one that fits, and warns when the spec's own setting
does not; `rosetta validate` prints only that warning. The method (docs/deepspeed.md):

* Parameter counts are exact: the model is built on the meta device (no memory, no
  weights) from the from-scratch config, a local config.json, the Hugging Face cache, or
  a built-in table of well-known hub models' published shapes.
* Model states (weights, gradients, optimizer) are bytes per parameter, replicated or
  divided by the world size N. The ZeRO rows reproduce DeepSpeed's own estimators
  (16-bit weights with fp32 master copies); node CPU memory comes straight from them.
* Activations are a documented formula for an encoder-decoder transformer at the
  worst-case micro-batch: every sentence at maxSourceLength / maxTargetLength.

This module imports without torch; torch, transformers and deepspeed are imported only
when a model is actually planned.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rosetta_trainer.flops import Seq2SeqDims

GiB = 2**30
# Kept free on every GPU: CUDA context, NCCL and DeepSpeed communication buckets, allocator
# fragmentation. A setting "fits" when its estimate is at most the rest.
GPU_HEADROOM = 0.10
DEFAULT_GPU_MEMORY = 80 * GiB


class PlanSkipped(Exception):
    """The plan cannot be made (model config unreachable, CPU training, ...); str() says why."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    stage: int  # 0 = DDP
    offload_optimizer: bool = False
    offload_parameters: bool = False

    @property
    def name(self) -> str:
        if self.stage == 0:
            return "DDP"
        offload = [what for what, on in (("optimizer", self.offload_optimizer),
                                          ("parameter", self.offload_parameters)) if on]
        return f"ZeRO-{self.stage}" + (f" + {' + '.join(offload)} offload" if offload else "")


# Cheapest first: each step adds communication (stages) or PCIe traffic and CPU work (offload).
SETTINGS = (
    Setting(0), Setting(1), Setting(2), Setting(3),
    Setting(2, offload_optimizer=True), Setting(3, offload_optimizer=True),
    Setting(3, offload_optimizer=True, offload_parameters=True),
)


def setting_of(distributed) -> Setting:
    """The setting a spec.distributed asks for; a raw deepspeedConfig overrides the fields."""
    if distributed.backend == "ddp":
        return Setting(0)
    zero = (distributed.deepspeed_config or {}).get("zero_optimization") or {}
    stage = int(zero.get("stage", distributed.stage))

    def offloaded(key: str, spec_value: str) -> bool:
        device = (zero.get(key) or {}).get("device", spec_value)
        return device in ("cpu", "nvme")

    return Setting(stage, offloaded("offload_optimizer", distributed.offload.optimizer),
                   offloaded("offload_param", distributed.offload.parameters))


# ------------------------------------------------------------------------------ model

# Published config.json values of well-known hub models, for when the hub cannot be reached:
# (d_model, d_ff, d_kv, num_layers, num_decoder_layers, num_heads, vocab_size, feed_forward_proj,
#  tie_word_embeddings)
_T5 = (32128, "relu", True)
_T5_V11 = (32128, "gated-gelu", False)
_MT5 = (250112, "gated-gelu", False)
BUILTIN_SHAPES: dict[str, tuple] = {
    "t5-small": (512, 2048, 64, 6, 6, 8, *_T5),
    "t5-base": (768, 3072, 64, 12, 12, 12, *_T5),
    "t5-large": (1024, 4096, 64, 24, 24, 16, *_T5),
    "t5-3b": (1024, 16384, 128, 24, 24, 32, *_T5),
    "t5-11b": (1024, 65536, 128, 24, 24, 128, *_T5),
    "google/flan-t5-small": (512, 1024, 64, 8, 8, 6, *_T5_V11),
    "google/flan-t5-base": (768, 2048, 64, 12, 12, 12, *_T5_V11),
    "google/flan-t5-large": (1024, 2816, 64, 24, 24, 16, *_T5_V11),
    "google/flan-t5-xl": (2048, 5120, 64, 24, 24, 32, *_T5_V11),
    "google/flan-t5-xxl": (4096, 10240, 64, 24, 24, 64, *_T5_V11),
    "google/mt5-small": (512, 1024, 64, 8, 8, 6, *_MT5),
    "google/mt5-base": (768, 2048, 64, 12, 12, 12, *_MT5),
    "google/mt5-large": (1024, 2816, 64, 24, 24, 16, *_MT5),
    "google/mt5-xl": (2048, 5120, 64, 24, 24, 32, *_MT5),
    "google/mt5-xxl": (4096, 10240, 64, 24, 24, 64, *_MT5),
}
_SHAPE_FIELDS = ("d_model", "d_ff", "d_kv", "num_layers", "num_decoder_layers", "num_heads", "vocab_size",
                 "feed_forward_proj", "tie_word_embeddings")


def builtin_config(name: str):
    """A T5Config for a well-known hub name ("google-t5/t5-small" is "t5-small"), or None."""
    key = name.removeprefix("google-t5/")
    if key not in BUILTIN_SHAPES:
        return None
    from transformers import T5Config

    return T5Config(**dict(zip(_SHAPE_FIELDS, BUILTIN_SHAPES[key])), dropout_rate=0.1,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need: exact parameter counts and the dimensions of the layers."""

    params: int  # Ψ, shared tensors counted once
    trainable: int  # those with gradients and optimizer state
    largest_layer: int  # the biggest single module's own parameters (ZeRO-3 gathers one at a time)
    d_model: int
    attention_dim: int  # heads × head dim: T5's d_kv × num_heads may differ from d_model
    ffn_dim: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    vocab_size: int
    gated_ffn: bool  # T5 v1.1 / mT5: two input projections
    relative_bias: bool  # T5: the additive position bias keeps one heads×S×S tensor per attention
    dropout: float
    attention_dropout: float
    source: str  # where the shape came from, for the output
    pretrained: bool = True  # from_pretrained weights: partitioned as they load under ZeRO-3


def model_config(spec) -> tuple[Any, str]:
    """(transformers config, where it came from) for spec.model; PlanSkipped when unreachable."""
    m = spec.model
    if m.architecture is not None:
        from rosetta_trainer.models import scratch_config

        vocab, where = _scratch_vocab(spec)
        d = spec.data
        return (scratch_config(m, vocab, max(d.max_source_length, d.max_target_length)),
                f"from-scratch {m.architecture} ({m.size}), vocabulary {vocab} ({where})")
    from transformers import AutoConfig

    if Path(m.name).is_dir():
        try:
            return AutoConfig.from_pretrained(m.name), f"{m.name}/config.json"
        except (OSError, ValueError) as exc:
            raise PlanSkipped(f"spec.model.name: cannot read the config in {m.name}: {exc}") from None
    try:
        return AutoConfig.from_pretrained(m.name, local_files_only=True), f"{m.name} (Hugging Face cache)"
    except (OSError, ValueError):
        pass
    config = builtin_config(m.name)
    if config is not None:
        return config, f"{m.name} (shape from the built-in table of published configs)"
    if m.source is not None:
        # Staged into model.name on the cluster: the source names the model (hf://google/flan-t5-xl,
        # s3://bucket/models/t5-large), and its last part is what the table knows it by.
        for guess in (m.source.uri.split("://", 1)[1].split("@")[0], m.source.uri.rstrip("/").rsplit("/", 1)[-1]):
            config = builtin_config(guess)
            if config is not None:
                return config, f"{m.source.uri} (shape from the built-in table of published configs)"
    raise PlanSkipped(
        f"spec.model.name: '{m.name}' is not a local directory here, not in the Hugging Face cache and not "
        f"in the built-in table ({', '.join(sorted(BUILTIN_SHAPES))}); plan on a machine that has its config")


def _scratch_vocab(spec) -> tuple[int, str]:
    tok = spec.tokenizer
    if tok.train is not None:
        # An upper bound: a Unigram vocabulary can come out smaller on a small corpus.
        return tok.train.vocab_size, "tokenizer.train.vocabSize"
    if tok.path and Path(tok.path).is_dir():
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(tok.path)), tok.path
    raise PlanSkipped(f"spec.tokenizer.path: '{tok.path}' is not a directory here, so the vocabulary size "
                      "(and the embedding size) is unknown")


def shape_of_config(config, source: str = "config") -> ModelShape:
    """Build the model on the meta device (no memory is allocated) and read off the counts."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from rosetta_trainer.models import separate_output_in_config, untie_output

    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(config)
        if separate_output_in_config(config):  # flan-T5, mT5: transformers 5 builds them tied
            untie_output(model)
    params = list(model.parameters())  # a tied tensor appears once
    largest = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in model.modules())
    c = config
    try:
        dims = Seq2SeqDims.from_hf_config(c)  # the same reading of the config as the FLOP counter
    except ValueError:
        raise PlanSkipped(f"{type(c).__name__}: the activation formula knows T5- and BART/Marian-style "
                          "configs only") from None
    t5 = hasattr(c, "d_kv")
    shape = dict(attention_dim=dims.inner_dim, ffn_dim=max(dims.ffn_dim, dims.decoder_ffn_dim or 0),
                 heads=dims.heads, encoder_layers=dims.encoder_layers, decoder_layers=dims.decoder_layers,
                 gated_ffn=dims.gated_ffn, relative_bias=t5,
                 dropout=c.dropout_rate if t5 else c.dropout,
                 attention_dropout=c.dropout_rate if t5 else c.attention_dropout)
    return ModelShape(params=sum(p.numel() for p in params),
                      trainable=sum(p.numel() for p in params if p.requires_grad),
                      largest_layer=largest, d_model=dims.d_model,
                      vocab_size=model.get_output_embeddings().weight.shape[0], source=source, **shape)


# -------------------------------------------------------------------------- formulas


@dataclass(frozen=True)
class Batch:
    sentences: int  # per GPU and micro-batch
    source_len: int
    target_len: int
    precision: str
    attention: str  # sdpa | eager
    checkpointing: bool = False  # spec.training.activationCheckpointing

    @classmethod
    def of(cls, spec) -> "Batch":
        d, t = spec.data, spec.training
        s, tl = d.max_source_length, d.max_target_length
        # A token budget holds sentences × (longest source + longest target) (batching.plan_epoch);
        # the most activation memory is the batch of full-length pairs.
        n = t.batch.sentences or max(1, t.batch.tokens // (s + tl))
        return cls(n, s, tl, t.precision, spec.model.attention, t.activation_checkpointing)

    @property
    def width(self) -> int:
        """Bytes of one stored activation."""
        return 4 if self.precision == "fp32" else 2


def activation_bytes(shape: ModelShape, batch: Batch) -> int:
    """Memory that forward keeps for backward for one micro-batch.

    Per token and layer, with p = activation width, h = d_model, i = attention dim, f = FFN
    dim, and m = 1 byte per element of a dropout mask when dropout is on (Korthikanti et al.
    2022, "Reducing Activation Recomputation", generalised to cross-attention and T5):
      self-attention   p(2h + 4i) + m·h      norm input, Q/K/V input, Q, K, V, context; output mask
      cross-attention  p(2h + 2i) + m·h      per target token, plus p·2i per source token (K, V)
      feed-forward     p(2h + 2f) + m(f + h) (gated: p(2h + 4f) + m(f + h))
    Per attention and layer, heads × query length × key length elements of
      eager:  p + m(1 + p)   softmax output, dropout mask and output
      sdpa:   p with T5's relative position bias (the additive mask it builds per layer), else 0
    Per stack, embeddings and final norm: 2p·h + m·h per token. Logits: (p + 12)·V per target
    token: the 16-bit logits, the loss's fp32 copy and log-softmax, and the fp32 gradient (12·V in fp32).

    With activation checkpointing every layer keeps only its input (p·h per token; T5's position
    bias once per stack, computed by its first layer and passed on), and backward recomputes one
    layer at a time: the largest layer's activations are added once. Embeddings, final norms and
    logits are outside the checkpointed layers and count as before.
    """
    s, p = shape, batch.width
    h, i, f, a = s.d_model, s.attention_dim, s.ffn_dim, s.heads
    m = 1 if s.dropout > 0 else 0
    ma = 1 if s.attention_dropout > 0 else 0
    src = batch.sentences * batch.source_len
    tgt = batch.sentences * batch.target_len

    self_attn = p * (2 * h + 4 * i) + m * h
    cross_attn = p * (2 * h + 2 * i) + m * h
    ffn = p * (2 * h + (4 if s.gated_ffn else 2) * f) + m * (f + h)
    if batch.attention == "eager":
        per_score = p + ma * (1 + p)
    else:
        per_score = p if s.relative_bias else 0

    def scores(q_len: int, k_len: int) -> int:
        return batch.sentences * a * q_len * k_len * per_score

    stack = 2 * p * h + m * h
    encoder = src * (self_attn + ffn) + scores(batch.source_len, batch.source_len)
    decoder = (tgt * (self_attn + cross_attn + ffn) + src * 2 * p * i
               + scores(batch.target_len, batch.target_len) + scores(batch.target_len, batch.source_len))
    logits = tgt * s.vocab_size * (12 if p == 4 else p + 12)
    outside_layers = (src + tgt) * stack + logits
    if not batch.checkpointing:
        return s.encoder_layers * encoder + s.decoder_layers * decoder + outside_layers
    bias = 0
    if s.relative_bias:  # the encoder's self-attention bias, the decoder's self- and cross-attention ones
        bias = batch.sentences * a * p * (batch.source_len ** 2 + batch.target_len ** 2
                                          + batch.target_len * batch.source_len)
    inputs = p * h * (s.encoder_layers * src + s.decoder_layers * tgt)
    return inputs + bias + max(encoder, decoder) + outside_layers


def model_state_bytes(setting: Setting, shape: ModelShape, world: int, precision: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per GPU.

    DDP (this trainer): fp32 weights under autocast, whose 16-bit weight copies stay alive for
    the backward (the "16-bit weights + fp32 master" of mixed precision: 6Ψ), fp32 gradients,
    and as much again for DDP's gradient buckets when N > 1, AdamW's two fp32 moments.
    ZeRO (DeepSpeed casts the model to w = 2 bytes, or keeps 4 in fp32): per trainable
    parameter, fp32 master + 2 moments K = 12 bytes, w-byte gradients, and in mixed precision
    DeepSpeed's fp32 gradient partition (4 bytes; its estimator's "18" = 2 + 4 + 12 for stage
    2). Stage 1 divides the optimizer state by N, stage 2 also the gradients, stage 3 also
    the weights and then gathers one layer at a time (w·L weights + w·L gradients).
    Offloaded optimizer state and its gradient partitions live in CPU memory.
    """
    psi, t, big, n = shape.params, shape.trainable, shape.largest_layer, world
    mixed = precision != "fp32"
    w = 2 if mixed else 4
    if setting.stage == 0:
        weights = 4 * psi + (2 * psi if mixed else 0)
        grads = 4 * t * (2 if n > 1 else 1)
        return weights, grads, 8 * t
    fp32_grads = 4 if mixed else 0
    if setting.stage == 3:
        # DeepSpeed's ZeRO-3 estimator books 18 bytes/param of shards in mixed precision: 2 weights
        # + 2 gradients + 12 optimizer + 2 for the fp32 gradient of the sub-group being stepped.
        fp32_grads = 2 if mixed else 0
        weights = w * big + (0 if setting.offload_parameters else w * psi / n)
        grads = w * big + (0 if setting.offload_optimizer else (w + fp32_grads) * t / n)
    else:
        weights = w * psi
        if setting.offload_optimizer:
            grads = 0.0
        elif setting.stage == 1:
            grads = w * t + fp32_grads * t / n
        else:
            grads = (w + fp32_grads) * t / n
    optimizer = 0.0 if setting.offload_optimizer else 12 * t / n
    return weights, grads, optimizer


def node_cpu_bytes(setting: Setting, shape: ModelShape, nodes: int, gpus_per_node: int) -> int:
    """CPU memory per node, from DeepSpeed's own estimators (their 1.5 buffer factor included).

    Every process first loads the model in fp32 (4Ψ each), except pretrained weights under
    ZeRO-3, which the trainer loads inside deepspeed.zero.Init (zero_init): each rank only ever
    holds its partition. From-scratch models are built whole on every rank, as under DDP.
    """
    with _quiet_accelerator_detection():
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if setting.stage == 0:  # the same load as DeepSpeed's stage 1/2 without offload
        setting = Setting(2)
    if setting.stage == 3:
        cpu, _, _ = estimate_zero3_model_states_mem_needs(
            shape.params, shape.largest_layer, num_gpus_per_node=gpus_per_node, num_nodes=nodes,
            cpu_offload=setting.offload_optimizer, cpu_offload_params=setting.offload_parameters,
            zero_init=shape.pretrained)
    else:
        cpu, _ = estimate_zero2_model_states_mem_needs(
            shape.params, num_gpus_per_node=gpus_per_node, num_nodes=nodes,
            cpu_offload=setting.offload_optimizer)
    return int(cpu)


@contextlib.contextmanager
def _quiet_accelerator_detection():
    # Importing DeepSpeed on a machine without a GPU logs "Setting accelerator to CPU" to
    # stdout, which would corrupt `rosetta plan --json`; planning is not running on one.
    def drop(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")

    logger = logging.getLogger("DeepSpeed")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


# --------------------------------------------------------------------------- cluster

# GPU memory (nominal GiB) by node label value. Patterns match the whole value.
_INSTANCE_GPUS = (
    (r"p5\.48xlarge", 80, "H100"), (r"p5en?\.48xlarge", 141, "H200"),
    (r"p4d\.24xlarge", 40, "A100 40GB"), (r"p4de\.24xlarge", 80, "A100 80GB"),
    (r"p3dn\.24xlarge", 32, "V100 32GB"), (r"p3\..*", 16, "V100"),
    (r"g6e\..*", 48, "L40S"), (r"g6\..*|gr6\..*", 24, "L4"), (r"g5\..*", 24, "A10G"), (r"g4dn\..*", 16, "T4"),
    (r"a3-(high|mega|edge)gpu-.*", 80, "H100"), (r"a3-ultragpu-.*", 141, "H200"),
    (r"a2-ultragpu-.*", 80, "A100 80GB"), (r"a2-(high|mega)gpu-.*", 40, "A100 40GB"), (r"g2-standard-.*", 24, "L4"),
    (r"Standard_ND96isr_H100_v5", 80, "H100"), (r"Standard_ND96amsr_A100_v4", 80, "A100 80GB"),
    (r"Standard_ND96asr_v4", 40, "A100 40GB"),
)
_GKE_ACCELERATORS = {
    "nvidia-h200-141gb": 141, "nvidia-h100-80gb": 80, "nvidia-h100-mega-80gb": 80, "nvidia-a100-80gb": 80,
    "nvidia-tesla-a100": 40, "nvidia-l4": 24, "nvidia-tesla-t4": 16, "nvidia-tesla-v100": 16,
    "nvidia-tesla-p100": 16,
}
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory: int  # bytes per GPU
    gpu_memory_source: str
    node_memory: int | None = None  # bytes per pod (spec.resources.memory), None when not set

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def parse_bytes(text: str, what: str) -> int:
    """'80GiB', '80Gi', '64G', '1800Gi', '512Mi' or a number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{what}: '{text}' is not a size like 80GiB, 64Gi or 40GB")
    number, prefix, binary = float(m[1]), m[2].upper(), m[3]
    base = 1024 if binary or not prefix else 1000
    return int(number * base ** "_KMGTP".index(prefix or "_"))


def gpu_memory_from_labels(labels: dict[str, str]) -> tuple[int, str] | None:
    """(bytes, which label said so) from the node labels a pod selects, or None."""
    if "nvidia.com/gpu.memory" in labels:  # GPU feature discovery: MiB
        return int(labels["nvidia.com/gpu.memory"]) * 2**20, "nodeSelector nvidia.com/gpu.memory"
    product = labels.get("nvidia.com/gpu.product", "")
    if m := re.search(r"(\d+)GB", product):
        return int(m[1]) * GiB, f"nodeSelector nvidia.com/gpu.product={product}"
    if (acc := labels.get("cloud.google.com/gke-accelerator")) in _GKE_ACCELERATORS:
        return _GKE_ACCELERATORS[acc] * GiB, f"cloud.google.com/gke-accelerator={acc}"
    for key in INSTANCE_TYPE_LABELS:
        value = labels.get(key)
        for pattern, gib, gpu in _INSTANCE_GPUS if value else ():
            if re.fullmatch(pattern, value):
                return gib * GiB, f"instance type {value} ({gpu})"
    return None


def cluster_of(spec, gpu_memory: str | None = None) -> Cluster:
    """The cluster an operator spec asks for; a trainer-only spec is one process on one GPU."""
    nodes = getattr(spec, "nodes", 1)
    gpus = getattr(spec, "gpus_per_node", None)
    if gpus is None:  # a trainer-only document: what `rosetta train` would use
        gpus = 0 if spec.training.device == "cpu" else 1
    if gpus == 0:
        raise PlanSkipped("gpusPerNode is 0 (CPU training): there is no GPU memory to plan")
    labels: dict[str, str] = {}
    if hasattr(spec, "network"):
        from rosetta_contract.profiles import PROFILES

        labels.update(PROFILES[spec.network.profile].node_selector)
        labels.update(spec.scheduling.node_selector)
    if gpu_memory is not None:
        capacity, source = parse_bytes(gpu_memory, "--gpu-memory"), "--gpu-memory"
    elif found := gpu_memory_from_labels(labels):
        capacity, source = found
    else:
        capacity, source = DEFAULT_GPU_MEMORY, "assumed: no --gpu-memory and no known GPU in the node selectors"
    memory = getattr(getattr(spec, "resources", None), "memory", None)
    node_memory = parse_bytes(memory, "spec.resources.memory") if memory else None
    return Cluster(nodes, gpus, capacity, source, node_memory)


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Estimate:
    setting: Setting
    weights: float
    gradients: float
    optimizer: float
    activations: float
    node_cpu: int

    @property
    def gpu_total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations


@dataclass
class Plan:
    shape: ModelShape
    batch: Batch
    cluster: Cluster
    requested: Setting
    estimates: list[Estimate]
    notes: list[str] = field(default_factory=list)

    @property
    def usable_gpu_memory(self) -> float:
        return self.cluster.gpu_memory * (1 - GPU_HEADROOM)

    def fits_gpu(self, e: Estimate) -> bool:
        return e.gpu_total <= self.usable_gpu_memory

    def fits_cpu(self, e: Estimate) -> bool:
        return self.cluster.node_memory is None or e.node_cpu <= self.cluster.node_memory

    def fits(self, e: Estimate) -> bool:
        return self.fits_gpu(e) and self.fits_cpu(e)

    def estimate(self, setting: Setting) -> Estimate:
        return next(e for e in self.estimates if e.setting == setting)

    @property
    def recommended(self) -> Estimate | None:
        """The first (cheapest) setting of SETTINGS that fits."""
        return next((e for e in self.estimates if e.setting in SETTINGS and self.fits(e)), None)

    def warnings(self) -> list[str]:
        mine = self.estimate(self.requested)
        if self.fits(mine):
            return []
        usable = self.usable_gpu_memory
        if not self.fits_gpu(mine):
            problem = (f"needs about {format_gib(mine.gpu_total)} per GPU (activations {format_gib(mine.activations)}) but "
                       f"the GPUs have {format_gib(self.cluster.gpu_memory)} ({format_gib(usable)} usable after "
                       f"{GPU_HEADROOM:.0%} headroom)")
        else:
            problem = (f"needs about {format_gib(mine.node_cpu)} of CPU memory per node but spec.resources.memory "
                       f"is {format_gib(self.cluster.node_memory)}")
        best = self.recommended
        if best is not None:
            advice = f"{best.setting.name} would fit ({format_gib(best.gpu_total)} per GPU)"
        else:
            advice = ("no setting fits: lower spec.training.batch (the activations scale with it), "
                      + ("" if self.batch.checkpointing else "turn on spec.training.activationCheckpointing, ")
                      + "add GPUs, or use GPUs with more memory")
        return [f"WARNING: {self.requested.name} (spec.distributed) {problem}; {advice}"]

    def to_json(self) -> dict:
        best = self.recommended
        return {
            "model": asdict(self.shape), "batch": asdict(self.batch),
            "cluster": {**asdict(self.cluster), "world": self.cluster.world,
                        "usableGpuMemory": int(self.usable_gpu_memory)},
            "settings": [{
                "name": e.setting.name, "zeroStage": e.setting.stage,
                "offloadOptimizer": e.setting.offload_optimizer, "offloadParameters": e.setting.offload_parameters,
                "gpu": {"weights": int(e.weights), "gradients": int(e.gradients), "optimizer": int(e.optimizer),
                        "activations": int(e.activations), "total": int(e.gpu_total)},
                "nodeCpu": e.node_cpu, "fits": self.fits(e), "requested": e.setting == self.requested,
            } for e in self.estimates],
            "requested": self.requested.name, "recommended": best.setting.name if best else None,
            "warnings": self.warnings(), "notes": self.notes,
        }


def make_plan(shape: ModelShape, batch: Batch, cluster: Cluster, requested: Setting = Setting(0)) -> Plan:
    settings = list(SETTINGS) + ([requested] if requested not in SETTINGS else [])
    activations = activation_bytes(shape, batch)
    estimates = [Estimate(s, *model_state_bytes(s, shape, cluster.world, batch.precision), activations,
                          node_cpu_bytes(s, shape, cluster.nodes, cluster.gpus_per_node)) for s in settings]
    plan = Plan(shape, batch, cluster, requested, estimates)
    plan.notes = _notes(plan)
    return plan


def _notes(plan: Plan) -> list[str]:
    b, c = plan.batch, plan.cluster
    if b.precision == "fp32":
        precision = ("precision fp32: DeepSpeed's estimators assume 16-bit weights with fp32 master copies; here "
                     "ZeRO weights and gradients are counted at 4 bytes and its master copy stays, so the ZeRO "
                     "rows are above DeepSpeed's own figures")
    else:
        precision = (f"precision {b.precision}: ZeRO rows follow DeepSpeed's estimators (16-bit weights and gradients, "
                     "fp32 master weights and AdamW moments); DDP keeps fp32 weights under autocast")
    return [
        f"model: {plan.shape.source}",
        precision,
        f"activations: {b.sentences} sentence(s) per GPU at {b.source_len}+{b.target_len} tokens, "
        f"attention {b.attention}, " + ("activation checkpointing (each layer's input kept, one layer "
                                         "recomputed at a time)" if b.checkpointing else "no activation checkpointing"),
        f"GPU memory: {format_gib(c.gpu_memory)} ({c.gpu_memory_source})",
        "node CPU: " + (f"spec.resources.memory {format_gib(c.node_memory)}" if c.node_memory else
                        "spec.resources.memory is not set, not checked"),
    ]


def plan_spec(spec, gpu_memory: str | None = None) -> Plan:
    """The plan for a TrainerSpec or an operator TranslationTrainingSpec; PlanSkipped when impossible."""
    cluster = cluster_of(spec, gpu_memory)
    config, source = model_config(spec)
    shape = replace(shape_of_config(config, source), pretrained=spec.model.name is not None)
    return make_plan(shape, Batch.of(spec), cluster, setting_of(spec.distributed))


# ----------------------------------------------------------------------- for rosetta validate


def format_gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def fit_warnings(spec) -> list[str]:
    """What `rosetta validate` adds: the warning lines, or one line saying why there is no plan."""
    if getattr(spec, "gpus_per_node", 1) == 0:
        return []  # CPU training: nothing to check, and no reason to import torch
    try:
        return plan_spec(spec).warnings()
    except PlanSkipped as exc:
        return [f"note: memory plan skipped: {exc}"]
