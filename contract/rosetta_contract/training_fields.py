"""spec.training and spec.distributed: length, batch, optimizer, schedule, precision and
compilation of the training loop, and how the processes share the work (DDP or DeepSpeed ZeRO).

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Self

from pydantic import Field, model_validator

from rosetta_contract.strict_model import JsonObject, Model


class BatchSpec(Model):
    tokens: Optional[int] = Field(
        None, ge=8, description="Micro-batch size in tokens (source+target, padding included) per process."
    )
    sentences: Optional[int] = Field(None, ge=1, description="Micro-batch size in sentence pairs per process.")
    length_multiple: Optional[int] = Field(
        None, ge=1, le=256,
        description="Each batch's source and target lengths are padded up to a multiple of this: fewer distinct "
                    "shapes for a compiled step and sizes the matrix units like; 1 pads to the batch's longest "
                    "sentence only. Default: 8 with training.compile reduce-overhead or max-autotune (CUDA graphs), else 1.")
    length_buckets: Optional[list[Annotated[int, Field(ge=1)]]] = Field(
        None, min_length=1, max_length=64,
        description="Pad each batch's lengths up to the next of these lengths instead (ascending; the last at "
                    "least data.maxSourceLength and maxTargetLength): a fixed, small set of shapes.")
    static_rows: Optional[bool] = Field(
        None,
        description="With tokens: pad a batch's rows (with fully ignored pairs) to as many as its padded lengths "
                    "fit in the budget, so that its shape depends on its lengths alone, as CUDA graphs need. "
                    "Default: on with training.compile reduce-overhead or max-autotune.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.tokens is None) == (self.sentences is None):
            raise ValueError("set exactly one of 'tokens' or 'sentences'")
        buckets = self.length_buckets
        if buckets is not None and any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise ValueError(f"lengthBuckets must be strictly ascending, got {buckets}")
        return self


AdamBeta = Annotated[float, Field(ge=0, lt=1)]


class TrainingSpec(Model):
    max_steps: Optional[int] = Field(None, ge=1, description="Optimizer steps to train.")
    epochs: Optional[float] = Field(None, gt=0, description="Passes over the training data.")
    batch: BatchSpec = Field(default_factory=lambda: BatchSpec(tokens=4096))
    learning_rate: float = Field(5e-4, gt=0, le=10)
    schedule: Literal["noam", "linear", "cosine", "constant"] = "noam"
    warmup_steps: int = Field(1000, ge=0)
    precision: Literal["bf16", "fp16", "fp32"] = "fp32"
    gradient_accumulation: int = Field(1, ge=1)
    clip_grad_norm: Optional[float] = Field(1.0, gt=0, description="Max gradient norm; null disables clipping.")
    weight_decay: float = Field(0.0, ge=0)
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    adam_betas: tuple[AdamBeta, AdamBeta] = Field(
        (0.9, 0.98), description="Adam's (beta1, beta2), each in [0, 1) as torch.optim requires.")
    adam_eps: float = Field(1e-9, gt=0)
    seed: int = Field(1, description="Seeds Python, NumPy (modulo 2^32) and torch.")
    log_interval: int = Field(10, ge=1, description="Steps between lines in metrics.jsonl.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compile: Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "none",
        description=(
            "torch.compile the training step (forward, loss and backward) in this mode: default, "
            "reduce-overhead (CUDA graphs: the step is replayed, not launched op by op), max-autotune (searches "
            "kernel configurations, CUDA graphs too), max-autotune-no-cudagraphs; none runs eagerly. Under "
            "DeepSpeed the engine compiles the model's forward."),
    )
    activation_checkpointing: bool = Field(
        False,
        description=(
            "Keep only each layer's input during forward and recompute the rest in backward: less "
            "activation memory (see rosetta plan) for about a third more compute. DDP and DeepSpeed alike."
        ),
    )
    bf16_parameters: bool = Field(
        False,
        description=(
            "With precision bf16 and the ddp backend: keep the model's trainable parameters in bf16, so that "
            "autocast does not cast every weight at every step, and let the optimizer update fp32 master "
            "copies (as DeepSpeed's bf16 mode does). Checkpoints hold the fp32 masters."),
    )
    nan_policy: Literal["skip", "stop"] = Field(
        "stop",
        description=(
            "A non-finite loss or gradient norm: skip that optimizer step (recorded in the metrics) "
            "or stop the run with an error. Either way no checkpoint with non-finite weights is written."
        ),
    )

    @model_validator(mode="after")
    def _length(self) -> Self:
        if self.max_steps is None and self.epochs is None:
            raise ValueError("set 'maxSteps' or 'epochs'")
        return self


class OffloadSpec(Model):
    optimizer: Literal["none", "cpu"] = Field(
        "none", description="ZeRO-Offload: optimizer state and step on the CPU (DeepSpeedCPUAdam)."
    )
    parameters: Literal["none", "cpu"] = Field(
        "none", description="ZeRO-Infinity: parameters on the CPU between uses; needs zeroStage 3."
    )


class DistributedSpec(Model):
    """How the processes share the work: plain data parallel (DDP) or DeepSpeed ZeRO."""

    backend: Literal["ddp", "deepspeed"] = Field(
        "ddp", description="ddp: torch DistributedDataParallel; deepspeed: a DeepSpeed engine with ZeRO."
    )
    zero_stage: Optional[Literal[1, 2, 3]] = Field(
        None,
        description="deepspeed: 1 shards optimizer state, 2 also gradients, 3 also parameters (default 2).",
    )
    offload: OffloadSpec = Field(default_factory=OffloadSpec)
    deepspeed_config: Optional[JsonObject] = Field(
        None,
        description=(
            "deepspeed: raw DeepSpeed config merged over the one generated from this spec "
            "(e.g. zero_optimization.overlap_comm); the merged config is saved with the run."
        ),
    )

    @model_validator(mode="after")
    def _deepspeed_only(self) -> Self:
        if self.backend == "ddp":
            used = [name for name, value in (
                ("zeroStage", self.zero_stage), ("deepspeedConfig", self.deepspeed_config),
                ("offload.optimizer", self.offload.optimizer != "none" or None),
                ("offload.parameters", self.offload.parameters != "none" or None),
            ) if value is not None]
            if used:
                raise ValueError(f"{', '.join(used)} need backend: deepspeed")
        elif self.offload.parameters == "cpu" and self.stage < 3:
            raise ValueError(f"offload.parameters: cpu needs zeroStage 3 (got {self.stage})")
        return self

    @property
    def stage(self) -> int:
        """The ZeRO stage in effect (0 for DDP)."""
        if self.backend == "ddp":
            return 0
        return 2 if self.zero_stage is None else self.zero_stage
