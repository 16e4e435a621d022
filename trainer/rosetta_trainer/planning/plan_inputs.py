"""What a memory plan is computed from (memory_plan.py): the model's shape and the cluster's GPUs.

The shape is exact: the model is built on the meta device (no memory, no weights) from the
from-scratch config, a local config.json, the Hugging Face cache, or a built-in table of
well-known hub models' published shapes. The GPUs' memory comes from `--gpu-memory`, else from
the node labels the pods select (GPU feature discovery, GKE accelerators, cloud instance types),
else an assumed 80 GiB.

Imports without torch; torch and transformers are imported only when a model is shaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rosetta_contract.config import TrainerSpec
from rosetta_trainer.planning.flops import Seq2SeqDims

if TYPE_CHECKING:
    from transformers import PretrainedConfig, T5Config

    from rosetta_contract.spec import TranslationTrainingSpec

GiB = 2**30
DEFAULT_GPU_MEMORY = 80 * GiB


class PlanSkipped(Exception):
    """The plan cannot be made (model config unreachable, CPU training, ...); str() says why."""


# ------------------------------------------------------------------------------ model

# Published config.json values of well-known hub models, for when the hub cannot be reached:
# (d_model, d_ff, d_kv, num_layers, num_decoder_layers, num_heads, vocab_size, feed_forward_proj,
#  tie_word_embeddings)
_T5 = (32128, "relu", True)
_T5_V11 = (32128, "gated-gelu", False)
_MT5 = (250112, "gated-gelu", False)
BUILTIN_SHAPES: dict[str, tuple[int | str | bool, ...]] = {
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


def builtin_config(name: str) -> T5Config | None:
    """A T5Config for a well-known hub name ("google-t5/t5-small" is "t5-small"), or None."""
    key = name.removeprefix("google-t5/")
    if key not in BUILTIN_SHAPES:
        return None
    from transformers import T5Config

    # The table's rows mix the fields' types, and T5Config's annotations leave out
    # decoder_start_token_id (a PretrainedConfig field it passes on).
    fields: dict[str, Any] = dict(zip(_SHAPE_FIELDS, BUILTIN_SHAPES[key]))
    extra: dict[str, Any] = {"decoder_start_token_id": 0}
    return T5Config(**fields, dropout_rate=0.1, pad_token_id=0, eos_token_id=1, **extra)


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


def model_config(spec: TrainerSpec) -> tuple[Any, str]:
    """(transformers config, where it came from) for spec.model; PlanSkipped when unreachable."""
    m = spec.model
    if m.architecture is not None:
        # models.models loads torch and transformers, which `rosetta plan` and `rosetta validate` skip.
        from rosetta_trainer.models.models import scratch_config

        vocab, where = _scratch_vocab(spec)
        d = spec.data
        return (scratch_config(m, vocab, max(d.max_source_length, d.max_target_length)),
                f"from-scratch {m.architecture} ({m.size}), vocabulary {vocab} ({where})")
    from transformers import AutoConfig

    name = cast(str, m.name)  # ModelSpec's validator requires a name where there is no architecture
    if Path(name).is_dir():
        try:
            return AutoConfig.from_pretrained(name), f"{name}/config.json"
        except (OSError, ValueError) as exc:
            raise PlanSkipped(f"spec.model.name: cannot read the config in {name}: {exc}") from None
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True), f"{name} (Hugging Face cache)"
    except (OSError, ValueError):
        pass
    config = builtin_config(name)
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


def _scratch_vocab(spec: TrainerSpec) -> tuple[int, str]:
    tok = spec.tokenizer
    if tok.train is not None:
        # An upper bound: a Unigram vocabulary can come out smaller on a small corpus.
        return tok.train.vocab_size, "tokenizer.train.vocabSize"
    if tok.path and Path(tok.path).is_dir():
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(tok.path)), tok.path
    raise PlanSkipped(f"spec.tokenizer.path: '{tok.path}' is not a directory here, so the vocabulary size "
                      "(and the embedding size) is unknown")


def shape_of_config(config: PretrainedConfig, source: str = "config") -> ModelShape:
    """Build the model on the meta device (no memory is allocated) and read off the counts."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from rosetta_trainer.models.models import separate_output_in_config, untie_output

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
            if re.fullmatch(pattern, cast(str, value)):  # no patterns where value is empty
                return gib * GiB, f"instance type {value} ({gpu})"
    return None


def cluster_of(spec: TrainerSpec, gpu_memory: str | None = None) -> Cluster:
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

        operator_spec = cast("TranslationTrainingSpec", spec)
        labels.update(PROFILES[operator_spec.network.profile].node_selector)
        labels.update(operator_spec.scheduling.node_selector)
    if gpu_memory is not None:
        capacity, source = parse_bytes(gpu_memory, "--gpu-memory"), "--gpu-memory"
    elif found := gpu_memory_from_labels(labels):
        capacity, source = found
    else:
        capacity, source = DEFAULT_GPU_MEMORY, "assumed: no --gpu-memory and no known GPU in the node selectors"
    memory = getattr(getattr(spec, "resources", None), "memory", None)
    node_memory = parse_bytes(memory, "spec.resources.memory") if memory else None
    return Cluster(nodes, gpus, capacity, source, node_memory)
