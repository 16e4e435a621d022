"""The TranslationTraining document: one YAML for the laptop and the cluster.

TrainerSpec is everything the trainer reads, composed of one model per section, each in a module
named for it: model and tokenizer (model_fields.py), data (data_fields.py), training and
distributed (training_fields.py), checkpoint (checkpoint_fields.py), evaluation, metrics and
tracking (evaluation_fields.py), faultTolerance (fault_tolerance_fields.py); model.source and
data.source (staging_fields.py). What ties the sections together lives here: the task handed down
to them while they validate (tasks.py) and the rules across sections. Import a section's model
from its own module; this one exports only the document's top level (`__all__`).

This module must import without torch: the operator validates specs with it
and generates the CRD schema from it.

Field names are camelCase in YAML (Kubernetes convention) and snake_case in
Python. Every model forbids unknown keys so that a typo is an error, not a
silently ignored setting.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Self

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, model_validator

from rosetta_contract.checkpoint_fields import CheckpointSpec
from rosetta_contract.data_fields import DataSpec
from rosetta_contract.evaluation_fields import EvaluationSpec, MetricsSpec, TrackingSpec
from rosetta_contract.fault_tolerance_fields import FaultToleranceSpec
from rosetta_contract.labels import LabelKey, LabelValue
from rosetta_contract.model_fields import ModelSpec, TokenizerSpec
from rosetta_contract.staging_fields import StagingSpec
from rosetta_contract.strict_model import Model
from rosetta_contract.tasks import Task, task_in_effect
from rosetta_contract.training_fields import DistributedSpec, TrainingSpec

__all__ = ["Metadata", "TrainerSpec", "TrainingDocument"]


class TrainerSpec(Model):
    """Everything the trainer reads. The operator's spec extends this with cluster fields."""

    task: Task = Field(
        "translation",
        description=(
            "translation: source to target language, scored with BLEU/chrF; summarization: document "
            "to summary, scored with ROUGE (the best checkpoint is picked by ROUGE-L)."
        ),
    )
    mode: Literal["train", "evaluate"] = Field(
        "train",
        description=(
            "train: train (or fine-tune) model, then evaluate; evaluate: only evaluate model.name (a hub id or "
            "a local/PVC path) on data.test with evaluation.metrics, no training section needed."
        ),
    )
    model: ModelSpec
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    data: DataSpec
    training: TrainingSpec = Field(
        # Unvalidated defaults, only ever read in evaluate mode (generation and device); train mode requires it.
        default_factory=lambda: TrainingSpec.model_construct(),
        description="How to train; required in mode train, not used in mode evaluate.",
    )
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Weights & Biases and MLflow, optional; rank 0 logs."
    )
    fault_tolerance: FaultToleranceSpec = Field(
        default_factory=FaultToleranceSpec,
        description="Hangs: the collective timeout of every rank, and when and how the operator ends a stalled run.",
    )

    def staging_sources(self) -> list[tuple[str, "StagingSpec"]]:
        """(what, source) for each of model.source and data.source the spec names, model first."""
        return [(what, source) for what, source in (("model", self.model.source), ("data", self.data.source))
                if source is not None]

    @model_validator(mode="wrap")
    @classmethod
    def _hand_down_task(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        task = data.get("task") if isinstance(data, dict) else getattr(data, "task", None)
        # Any value, a list included: current_task() ignores what is not a task, which is reported on spec.task.
        with task_in_effect("translation" if task is None else task):
            return handler(data)

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.mode == "evaluate":
            if self.model.name is None:
                raise ValueError("mode evaluate evaluates a pretrained model: set model.name (hub id or path)")
            if not self.data.test:
                raise ValueError("mode evaluate evaluates the test sets, and data.test is empty")
            if self.evaluation.after_training is not None:
                raise ValueError("mode evaluate has no training to evaluate after: drop evaluation.afterTraining")
        elif "training" not in self.model_fields_set:
            raise ValueError("training: Field required (mode train trains; mode evaluate needs none)")
        if self.model.architecture is not None and self.tokenizer.path is None and self.tokenizer.train is None:
            raise ValueError("a from-scratch model needs tokenizer.path or tokenizer.train")
        if self.model.name is None and self.tokenizer.path is None and not self.data.train:
            raise ValueError("tokenizer.train needs data.train")
        if "training" in self.model_fields_set and self.training.bf16_parameters:
            if self.training.precision != "bf16":
                raise ValueError(f"training.bf16Parameters needs training.precision bf16, not {self.training.precision}")
            if self.distributed.backend != "ddp":
                raise ValueError("training.bf16Parameters is for the ddp backend; DeepSpeed's bf16 mode "
                                 "(precision: bf16) already keeps bf16 weights and fp32 masters")
        buckets = self.training.batch.length_buckets if "training" in self.model_fields_set else None
        if buckets is not None and buckets[-1] < max(self.data.max_source_length, self.data.max_target_length):
            raise ValueError(
                f"training.batch.lengthBuckets ends at {buckets[-1]}, shorter than the longest sentence the data "
                f"keeps (data.maxSourceLength {self.data.max_source_length}, maxTargetLength "
                f"{self.data.max_target_length}): add a bucket of at least "
                f"{max(self.data.max_source_length, self.data.max_target_length)}")
        average, steps, interval = self.checkpoint.average, self.training.max_steps, self.checkpoint.interval
        if average is not None and steps is not None and math.ceil(steps / interval) < average.count:
            # Checkpoints land every `interval` steps and at the last one.
            raise ValueError(
                f"checkpoint.average.{average.selection} is {average.count}, but maxSteps {steps} with "
                f"checkpoint.interval {interval} writes {math.ceil(steps / interval)} checkpoint(s)")
        return self

    def uses_task_prefix(self) -> bool:
        if self.data.task_prefix is not None:
            return self.data.task_prefix
        is_t5 = self.model.architecture == "t5" or (
            self.model.name is not None and "t5" in self.model.name.lower()
        )
        return len(self.data.target_langs or ()) > 1 or is_t5


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: Optional[str] = Field(None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    # As the apiserver admits them: `rosetta validate` and `rosetta run` refuse what `kubectl apply` would.
    labels: Optional[dict[LabelKey, LabelValue]] = None


class TrainingDocument(BaseModel):
    """A whole `kind: TranslationTraining` YAML document."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    # Required, as the apiserver requires them: one file means the same here and on a cluster.
    api_version: Literal["rosetta.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["TranslationTraining"]
    metadata: Metadata
    spec: TrainerSpec


