"""spec.evaluation, spec.metrics and spec.tracking: how a run is scored (validation during training,
the test sets at its end, an evaluation pod after it) and where it reports (Prometheus, TensorBoard,
Weights & Biases, MLflow).

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, StringConstraints, field_validator

from rosetta_contract.locations import http_url, no_credentials, secret_name
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import NAME_MAX, PATH_MAX, Model
from rosetta_contract.tasks import DEFAULT_METRICS, current_task


class AfterTrainingSpec(Model):
    """Once the training succeeded, one more pod evaluates a checkpoint on the test sets, on CPU."""

    checkpoint: Literal["final", "best", "averaged"] = Field(
        "final",
        description="Which checkpoint: the newest, the best by validation score, or the averaged model "
                    "(needs checkpoint.average).",
    )
    cpu: Quantity = Field("4", description="CPU request and limit of the evaluation pod, e.g. 8 or 3500m.")
    memory: Quantity = Field("16Gi", description="Memory request and limit of the evaluation pod, e.g. 32Gi.")


class EvaluationSpec(Model):
    interval: Optional[int] = Field(
        None, ge=1, description="Steps between validation runs; default: at each checkpoint."
    )
    beams: int = Field(4, ge=1, le=64, description="1 = greedy.")
    max_samples: Optional[int] = Field(500, ge=1, description="Validation pairs per run (all test pairs).")
    batch_sentences: int = Field(64, ge=1)
    max_new_tokens: int = Field(128, ge=1, description="Longest generated output (tokens), whatever the source.")
    max_length_ratio: Optional[float] = Field(
        2.0, gt=0, le=1000,
        description=(
            "Generation also stops at maxLengthRatio x the source length + maxLengthOffset tokens (fairseq's "
            "max-len-a/b; the source length is the batch's longest); null: only maxNewTokens."
        ),
    )
    max_length_offset: int = Field(10, ge=0, le=100_000, description="Tokens added to the maxLengthRatio limit.")
    length_penalty: float = Field(
        1.0, ge=-10, le=10,
        description=(
            "Beam search ranks hypotheses by log-probability / length^lengthPenalty: above 1 favours longer "
            "outputs, below 1 shorter ones (no effect on greedy decoding)."
        ),
    )
    no_repeat_ngram_size: int = Field(
        0, ge=0, le=100, description="Never generate an n-gram of this size twice in one output; 0 disables."
    )
    metrics: Optional[list[Literal["bleu", "chrf", "gender", "rouge1", "rouge2", "rougeL", "rougeLsum"]]] = Field(
        None,
        validate_default=True,
        description=(
            "Scores to compute. Default: bleu, chrf, gender for translation; rouge1, rouge2, rougeL "
            "for summarization. gender (MT-GenEval) is for translation only."
        ),
    )
    at_end: bool = Field(True, description="Evaluate validation and test sets when training ends.")
    after_training: Optional[AfterTrainingSpec] = Field(
        None,
        description="Evaluate one checkpoint on the test sets in a separate CPU pod after the training "
                    "succeeded (status.evaluation); needs the checkpoints on a persistentVolumeClaim.",
    )

    @field_validator("metrics")
    @classmethod
    def _metrics_for_task(cls, value: Any) -> Any:
        task = current_task()
        if value is None:
            return list(DEFAULT_METRICS[task or "translation"])
        if task == "summarization" and "gender" in value:
            raise ValueError(
                "'gender' scores translations against MT-GenEval's gendered references and needs "
                "task: translation; for summarization use rouge1, rouge2, rougeL, rougeLsum (or bleu, chrf)"
            )
        return value


class MetricsSpec(Model):
    port: int = Field(9400, ge=0, le=65535, description="Prometheus port on rank 0; 0 disables the endpoint.")
    tensorboard: bool = True
    peak_flops: Optional[float] = Field(
        None, gt=0, le=1e18,
        description=(
            "Dense peak FLOP/s of one accelerator at the run's precision, for MFU on any device (e.g. 6.5e+13 "
            "for a T4 in fp16); default $ROSETTA_PEAK_FLOPS, else the built-in table of GPUs."
        ),
    )


class SecretKeySelector(Model):
    """One key of a Kubernetes Secret; the operator passes it to the pods as an env var (valueFrom)."""

    name: str = Field(..., min_length=1, max_length=253, description="Name of the Secret, in the training's namespace.")
    key: str = Field(..., min_length=1, max_length=253, description="Key inside the Secret.")

    @field_validator("name")
    @classmethod
    def _secret_name(cls, value: str) -> str:
        secret_name(value)
        return value


class WandbSpec(Model):
    """Weights & Biases. The API key comes from a Secret (WANDB_API_KEY), never from the spec."""

    project: str = Field(..., min_length=1, max_length=128, description="W&B project the run is logged to.")
    entity: Optional[str] = Field(None, max_length=128, description="W&B team or user; default the API key's own.")
    mode: Literal["auto", "online", "offline"] = Field(
        "auto",
        description=(
            "online: send as the run goes; offline: write the run under <output>/wandb for `wandb sync`; "
            "auto: online when an API key is set and the W&B host answers, else offline."
        ),
    )
    base_url: Optional[str] = Field(
        None, max_length=PATH_MAX, description="Self-hosted W&B server (WANDB_BASE_URL); default https://api.wandb.ai."
    )
    tags: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=list, max_length=32, description="Tags on the W&B run."
    )
    api_key_secret: Optional[SecretKeySelector] = Field(
        None, description="Secret key holding the W&B API key, set as WANDB_API_KEY on the pods."
    )

    _base_url = field_validator("base_url")(classmethod(lambda cls, value: http_url(value, "apiKeySecret")))


class MlflowSpec(Model):
    """MLflow. A token for the tracking server comes from a Secret (MLFLOW_TRACKING_TOKEN)."""

    tracking_uri: Optional[str] = Field(
        None, max_length=PATH_MAX,
        description=(
            "MLflow tracking server (http(s)://...) or local store (file:/path); default "
            "file:<output>/mlruns, which needs no network."
        ),
    )
    experiment: Optional[str] = Field(
        None, max_length=NAME_MAX, description="MLflow experiment; default the training's name."
    )
    token_secret: Optional[SecretKeySelector] = Field(
        None, description="Secret key holding a bearer token for the tracking server, set as MLFLOW_TRACKING_TOKEN."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: Optional[str]) -> Optional[str]:
        no_credentials(value, "tokenSecret")
        if value is not None and not value.startswith(("http://", "https://", "file:", "databricks")):
            raise ValueError(f"'{value}' must be an http(s):// URL, a file: URI or databricks")
        return value


class TrackingSpec(Model):
    """Experiment trackers that receive what metrics.jsonl and eval.jsonl get (rank 0 only)."""

    wandb: Optional[WandbSpec] = Field(None, description="Log to Weights & Biases (the [tracking] extra).")
    mlflow: Optional[MlflowSpec] = Field(None, description="Log to MLflow (the [tracking] extra).")
