"""model.source and data.source: where a pretrained model or the corpora are copied from (S3 or the
Hugging Face hub) before training, on a cluster that cannot reach them from every pod.

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Self

from pydantic import Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rosetta_contract.locations import bucket_problem, http_url, secret_name
from rosetta_contract.strict_model import NAME_MAX, PATH_MAX, Model, clip

# A hub repository: `org/name` or `name` (letters, digits, '.', '_', '-'), datasets under `datasets/`,
# an optional `@revision` (branch, tag or commit).
_HF_REPO = re.compile(r"^(datasets/)?([A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}(@[A-Za-z0-9._/-]{1,200})?$")


class StagingSpec(Model):
    """Where a model or corpus comes from on a cluster that cannot reach it from every pod: copied once
    into `path` on a shared volume by the JobSet's stage job before the gang starts (`rosetta run`:
    before training), then read from there with the hub offline."""

    uri: str = Field(
        ..., max_length=PATH_MAX,
        description="s3://bucket/prefix (every object under it), hf://org/model[@revision] or "
                    "hf://datasets/org/name[@revision] (a Hugging Face hub repository).")
    path: Optional[str] = Field(
        None, max_length=PATH_MAX,
        description="Absolute directory it is copied into, on a volume the pods share. model.source: "
                    "model.name (leave it out); data.source: required.")
    endpoint_url: Optional[str] = Field(
        None, max_length=PATH_MAX, description="s3: an S3-compatible endpoint (MinIO, Ceph), e.g. http://minio:9000.")
    region: Optional[str] = Field(None, max_length=NAME_MAX, description="s3: the bucket's region.")
    credentials_secret: Optional[str] = Field(
        None, max_length=253,
        description="s3: Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally AWS_SESSION_TOKEN) "
                    "for the stage job; without it the standard AWS chain. hf: set HF_TOKEN in spec.env for "
                    "gated models.")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value.startswith("s3://"):
            problem = bucket_problem(value)
            if problem:
                raise ValueError(problem)
            return value
        if value.startswith("hf://"):
            if not _HF_REPO.match(value[len("hf://"):]) or ".." in value:
                raise ValueError(f"'{clip(value, 80)}' is not a hub repository (hf://org/name[@revision] or "
                                 "hf://datasets/org/name[@revision])")
            return value
        raise ValueError(f"'{clip(value, 80)}' must start with s3:// or hf://")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and (not value.startswith("/") or ".." in Path(value).parts or value.rstrip("/") == ""):
            raise ValueError(f"'{clip(value, 80)}' must be an absolute directory below / (no '..')")
        return value

    _endpoint = field_validator("endpoint_url")(classmethod(lambda cls, value: http_url(value)))
    _secret = field_validator("credentials_secret")(classmethod(lambda cls, value: secret_name(value)))

    @model_validator(mode="after")
    def _s3_options_for_s3(self) -> Self:
        if not self.uri.startswith("s3://"):
            given = [to_camel(f) for f in ("endpoint_url", "region", "credentials_secret") if getattr(self, f)]
            if given:
                raise ValueError(f"{', '.join(given)} apply to s3:// sources only")
        return self

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def dataset(self) -> bool:
        return self.uri.startswith("hf://datasets/")
