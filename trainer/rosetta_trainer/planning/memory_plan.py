"""Will it fit? Per-GPU and per-node memory of a TranslationTraining under DDP and each ZeRO stage.

`rosetta plan -f FILE` prints one row per setting (DDP, ZeRO-1/2/3, with and without CPU
offload), recommends the cheapest one that fits, and warns when the spec's own setting
does not; `rosetta validate` prints only that warning. The method (docs/deepspeed.md):

* Parameter counts are exact and the GPUs' memory is read from the node selectors
  (plan_inputs.py).
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
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator, cast

from rosetta_contract.config import TrainerSpec
from rosetta_contract.training_fields import DistributedSpec
from rosetta_trainer.planning.plan_inputs import (
    Cluster,
    GiB,
    ModelShape,
    PlanSkipped,
    cluster_of,
    model_config,
    shape_of_config,
)
from rosetta_trainer.runtime.deepspeed_import import import_deepspeed

# Kept free on every GPU: CUDA context, NCCL and DeepSpeed communication buckets, allocator
# fragmentation. A setting "fits" when its estimate is at most the rest.
GPU_HEADROOM = 0.10


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


def setting_of(distributed: DistributedSpec) -> Setting:
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
    def of(cls, spec: TrainerSpec) -> "Batch":
        d, t = spec.data, spec.training
        s, tl = d.max_source_length, d.max_target_length
        # A token budget holds sentences × (longest source + longest target) (batching.plan_epoch);
        # the most activation memory is the batch of full-length pairs.
        n = t.batch.sentences or max(1, cast(int, t.batch.tokens) // (s + tl))  # BatchSpec sets one of the two
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
    weights: float
    grads: float
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
    try:
        with _quiet_accelerator_detection():
            import_deepspeed()
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError:
        raise PlanSkipped("DeepSpeed is not installed, and its estimators give the node memory: "
                          "pip install 'rosetta-mt[deepspeed]'") from None

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
def _quiet_accelerator_detection() -> Iterator[None]:
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
                       f"is {format_gib(cast(int, self.cluster.node_memory))}")
        best = self.recommended
        if best is not None:
            advice = f"{best.setting.name} would fit ({format_gib(best.gpu_total)} per GPU)"
        else:
            advice = ("no setting fits: lower spec.training.batch (the activations scale with it), "
                      + ("" if self.batch.checkpointing else "turn on spec.training.activationCheckpointing, ")
                      + "add GPUs, or use GPUs with more memory")
        return [f"WARNING: {self.requested.name} (spec.distributed) {problem}; {advice}"]

    def to_json(self) -> dict[str, Any]:
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


def plan_spec(spec: TrainerSpec, gpu_memory: str | None = None) -> Plan:
    """The plan for a TrainerSpec or an operator TranslationTrainingSpec; PlanSkipped when impossible."""
    cluster = cluster_of(spec, gpu_memory)
    config, source = model_config(spec)
    shape = replace(shape_of_config(config, source), pretrained=spec.model.name is not None)
    return make_plan(shape, Batch.of(spec), cluster, setting_of(spec.distributed))


# ----------------------------------------------------------------------- for rosetta validate


def format_gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def fit_warnings(spec: TrainerSpec) -> list[str]:
    """What `rosetta validate` adds: the warning lines, or one line saying why there is no plan."""
    if getattr(spec, "gpus_per_node", 1) == 0:
        return []  # CPU training: nothing to check, and no reason to import torch
    try:
        return plan_spec(spec).warnings()
    except PlanSkipped as exc:
        return [f"note: memory plan skipped: {exc}"]
