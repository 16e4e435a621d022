"""spec.checkpoint: how often checkpoints are written and how many kept, their S3 mirror, and the
checkpoints averaged after the last step.

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

from typing import Optional, Self

from pydantic import Field, field_validator, model_validator

from rosetta_contract.locations import bucket_problem, http_url, secret_name
from rosetta_contract.strict_model import NAME_MAX, PATH_MAX, Model


class S3MirrorSpec(Model):
    """Where complete checkpoints are mirrored. Credentials never appear here: the standard AWS
    chain (IRSA, instance profile, env) or the Secret named by credentialsSecret provides them."""

    uri: str = Field(..., max_length=PATH_MAX, description="s3://bucket/prefix that receives a copy of every complete checkpoint.")
    endpoint_url: Optional[str] = Field(
        None, max_length=PATH_MAX, description="S3-compatible endpoint (MinIO, Ceph, GCS interop), e.g. http://minio:9000."
    )
    region: Optional[str] = Field(None, max_length=NAME_MAX, description="Bucket region; default from the AWS environment.")
    keep: Optional[int] = Field(
        None, ge=1, description="Complete checkpoints kept in S3 (plus the best); default checkpoint.keep."
    )
    credentials_secret: Optional[str] = Field(
        None, max_length=253,
        description=(
            "Kubernetes Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally "
            "AWS_SESSION_TOKEN, passed to the pods as env; without it the standard AWS chain is used."
        ),
    )

    @field_validator("uri")
    @classmethod
    def _s3_uri(cls, value: str) -> str:
        if not value.startswith("s3://"):
            raise ValueError(f"'{value}' must start with s3:// (s3://bucket/prefix)")
        problem = bucket_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    _endpoint = field_validator("endpoint_url")(classmethod(lambda cls, value: http_url(value)))
    _secret = field_validator("credentials_secret")(classmethod(lambda cls, value: secret_name(value)))

    @property
    def bucket(self) -> str:
        return self.uri[len("s3://"):].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """Key prefix without slashes at either end ('' for the bucket's root)."""
        parts = self.uri[len("s3://"):].split("/", 1)
        return parts[1].strip("/") if len(parts) > 1 else ""


class AverageSpec(Model):
    """Which checkpoints `checkpoint.average` averages: exactly one of last or best."""

    last: Optional[int] = Field(None, ge=2, le=1000, description="The N newest complete checkpoints.")
    best: Optional[int] = Field(
        None, ge=2, le=1000,
        description="The N complete checkpoints with the best validation score (BLEU; summarization: ROUGE-L).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.last is None) == (self.best is None):
            raise ValueError("set exactly one of 'last' or 'best'")
        return self

    @property
    def selection(self) -> str:
        return "last" if self.last is not None else "best"

    @property
    def count(self) -> int:
        if self.last is not None:
            return self.last
        assert self.best is not None  # the model's validator requires last or best
        return self.best


class CheckpointSpec(Model):
    dir: Optional[str] = Field(
        None, max_length=PATH_MAX, description="Checkpoint directory; default <output>/checkpoints. Relative paths are under the output dir. "
                                        "On a cluster an absolute one must be under <checkpoints mountPath>/<metadata.name>/ "
                                        "(the training's own directory) or on an emptyDir."
    )
    interval: int = Field(1000, ge=1, description="Steps between checkpoints.")
    keep: int = Field(3, ge=1, description="How many of the latest checkpoints to keep.")
    keep_best: bool = Field(
        True, description="Also keep the best checkpoint by validation BLEU (summarization: ROUGE-L)."
    )
    s3: Optional[S3MirrorSpec] = Field(
        None, description="Also mirror every complete checkpoint to S3, and resume from there on an empty node."
    )
    average: Optional[AverageSpec] = Field(
        None,
        description=(
            "After the last step, average the weights of the last (or best) N checkpoints into "
            "<checkpoint dir>/averaged and evaluate it like the final model (recorded in summary.json)."
        ),
    )

    @field_validator("dir")
    @classmethod
    def _dir_stays_put(cls, value: Optional[str]) -> Optional[str]:
        # The newest checkpoint under the directory is resumed from and the older ones pruned: a
        # '..' would reach (resume from, then delete) another training's checkpoints.
        if value is not None and ".." in value.split("/"):
            raise ValueError(f"'{value}' has a '..' component; a relative path stays under the training's output, "
                             "an absolute one names the directory itself")
        return value

    @model_validator(mode="after")
    def _average_needs_kept_checkpoints(self) -> Self:
        if self.average is not None and self.average.count > self.keep:
            raise ValueError(
                f"average.{self.average.selection} is {self.average.count} but keep is {self.keep}: only the "
                f"newest keep checkpoints (and the best one) stay on disk; set keep to at least {self.average.count}")
        return self
