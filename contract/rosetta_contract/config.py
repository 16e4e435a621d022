"""The TranslationTraining document: one YAML for the laptop and the cluster.

This module must import without torch: the operator validates specs with it
and generates the CRD schema from it.

Field names are camelCase in YAML (Kubernetes convention) and snake_case in
Python. Every model forbids unknown keys so that a typo is an error, not a
silently ignored setting.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rosetta_contract.labels import LabelKey, LabelValue
from rosetta_contract.quantities import Quantity
from rosetta_contract.strict_model import NAME_MAX, PATH_MAX, JsonObject, Model, clip

Task = Literal["translation", "summarization"]
DEFAULT_METRICS = {"translation": ["bleu", "chrf", "gender"], "summarization": ["rouge1", "rouge2", "rougeL"]}

# spec.task changes what a valid `data` and `evaluation` section is, but pydantic validates
# nested models before their parent. TrainerSpec hands its task down through this variable
# while it validates, so those rules can live in DataSpec and EvaluationSpec and their errors
# keep their field paths (spec.data..., spec.evaluation.metrics). Outside a TrainerSpec the
# task is translation.
_TASK: ContextVar[str] = ContextVar("rosetta_task", default="translation")


def _current_task() -> str | None:
    """The task of the spec being validated; None when spec.task itself is invalid (that error
    is reported on its own, so task-dependent rules stay quiet rather than guess)."""
    task = _TASK.get()
    return task if isinstance(task, str) and task in DEFAULT_METRICS else None


# ------------------------------------------------------------------------- staging

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A hub repository: `org/name` or `name` (letters, digits, '.', '_', '-'), datasets under `datasets/`,
# an optional `@revision` (branch, tag or commit).
_HF_REPO = re.compile(r"^(datasets/)?([A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}(@[A-Za-z0-9._/-]{1,200})?$")


def _bucket_problem(value: str) -> Optional[str]:
    bucket = value[len("s3://"):].split("/", 1)[0]
    if not bucket:
        return f"'{clip(value, 80)}' names no bucket (s3://bucket/prefix)"
    if not _S3_BUCKET.match(bucket) or ".." in bucket:
        return (f"bucket '{clip(bucket, 80)}' is not a valid S3 bucket name "
                "(3-63 characters: a-z, 0-9, '.', '-', starting and ending with a letter or digit)")
    return None


# Query parameters that carry a credential (?token=..., ?password=..., ?X-Amz-Signature=...).
_SECRET_QUERY = re.compile(r"(?i)(^|[-_.])(token|password|passwd|secret|api[-_.]?key|apikey|signature|sig|"
                           r"access[-_.]?key|credentials?)$")


def _no_credentials(value: Optional[str], secret: str) -> Optional[str]:
    """Refuse a URL that carries a credential: it would be copied in clear into the ConfigMap, the
    applied-spec annotation, every checkpoint's training.yaml and the tracking run's config.
    The message never repeats the URL (it holds the credential)."""
    if value is None:
        return value
    try:
        parts = urllib.parse.urlsplit(value)
        names = [name for name, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    except ValueError:
        return value  # not a URL at all: the field's own check says so
    if "@" in parts.netloc:
        raise ValueError(f"the URL has a user name or password before '@' (not repeated here); remove them and "
                         f"give the credential through {secret}, from a Secret")
    if any(_SECRET_QUERY.search(name) for name in names):
        raise ValueError(f"the URL's query carries a credential (not repeated here); remove it and give the "
                         f"credential through {secret}, from a Secret")
    return value


def _http_url(value: Optional[str], secret: str = "credentialsSecret") -> Optional[str]:
    _no_credentials(value, secret)
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"'{value}' must be an http:// or https:// URL")
    return value


def _secret_name(value: Optional[str]) -> Optional[str]:
    if value is not None and not _SECRET_NAME.match(value):
        raise ValueError(f"'{value}' is not a valid Secret name (lowercase a-z, 0-9, '-' and '.')")
    return value


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
            problem = _bucket_problem(value)
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

    _endpoint = field_validator("endpoint_url")(classmethod(lambda cls, value: _http_url(value)))
    _secret = field_validator("credentials_secret")(classmethod(lambda cls, value: _secret_name(value)))

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


# --------------------------------------------------------------------------- model


class ModelSpec(Model):
    """Either pretrained weights (`name`) or a from-scratch `architecture`."""

    name: Optional[str] = Field(
        None, min_length=1, max_length=PATH_MAX, description="Hugging Face model id or local directory with pretrained weights."
    )
    architecture: Optional[Literal["t5", "transformer"]] = Field(
        None, description="Train from scratch: t5 (T5Config) or transformer (Marian/BART-style)."
    )
    size: Literal["tiny", "small", "base", "big"] = Field(
        "base", description="Preset for from-scratch models; the fields below override it."
    )
    d_model: Optional[int] = Field(None, ge=8, description="Hidden size.")
    encoder_layers: Optional[int] = Field(None, ge=1)
    decoder_layers: Optional[int] = Field(None, ge=1)
    heads: Optional[int] = Field(None, ge=1, description="Attention heads.")
    ffn_dim: Optional[int] = Field(None, ge=8, description="Feed-forward inner size.")
    dropout: Optional[float] = Field(None, ge=0.0, lt=1.0)
    max_positions: Optional[int] = Field(None, ge=8, description="Longest sequence (transformer).")
    attention: Literal["sdpa", "eager"] = Field(
        "sdpa", description="Attention kernel passed to transformers (attn_implementation)."
    )
    source: Optional[StagingSpec] = Field(
        None, description="Copy the pretrained model into model.name (an absolute directory on a shared volume) "
                          "before training, from S3 or the hub; the pods then load it with the hub offline.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.name is None) == (self.architecture is None):
            raise ValueError("set exactly one of 'name' (pretrained) or 'architecture' (from scratch)")
        if self.source is not None:
            if self.name is None or not self.name.startswith("/"):
                raise ValueError("source copies the model into name, which must then be an absolute directory "
                                 "(e.g. /models/flan-t5-xl), not a hub id")
            if self.source.dataset:
                raise ValueError(f"source '{self.source.uri}' is a dataset repository; a model is hf://org/name")
            if self.source.path is not None and self.source.path.rstrip("/") != self.name.rstrip("/"):
                raise ValueError("source.path must be name (the model is loaded from there); leave it out")
            self.source.path = self.name
        if self.d_model and self.heads and self.d_model % self.heads:
            raise ValueError(f"dModel ({self.d_model}) must be divisible by heads ({self.heads})")
        return self


# ----------------------------------------------------------------------- tokenizer


class TokenizerTraining(Model):
    type: Literal["bpe", "unigram"] = "unigram"
    vocab_size: int = Field(8000, ge=64, le=1_000_000)
    min_frequency: int = Field(2, ge=1)
    # A fixed-size sample by default, as sentencepiece's input_sentence_size: held in memory while
    # the tokenizer trains, so a first start's memory stays flat however large the corpus. Unset
    # and null differ on purpose (null overrides the default, as clipGradNorm's does): null and 0
    # both train on every sentence.
    max_sentences: Optional[int] = Field(
        1_000_000, ge=0,
        description="Train on a seeded sample of at most this many sentences per side (pairs); null or 0 means all.",
    )


class TokenizerSpec(Model):
    path: Optional[str] = Field(
        None, max_length=PATH_MAX, description="Tokenizer directory or hub id; defaults to the model's own when pretrained."
    )
    train: Optional[TokenizerTraining] = Field(
        None, description="Train a new tokenizer on the training data with `tokenizers`."
    )

    @model_validator(mode="after")
    def _not_both(self) -> Self:
        if self.path is not None and self.train is not None:
            raise ValueError("set either 'path' or 'train', not both")
        return self


# ---------------------------------------------------------------------------- data

DataFormat = Literal["pairs", "tsv", "csv", "jsonl", "parquet", "arrow", "mtgeneval", "generated"]

REQUIRED_BY_FORMAT = {
    "pairs": ("source", "target"),
    "tsv": ("path",),
    "csv": ("path",),
    "jsonl": ("path",),
    "parquet": ("path",),
    "arrow": ("path",),
    "mtgeneval": ("path",),
    "generated": (),
}


# BCP 47-like: a 2-3 letter language, then subtags (script, region, variant) of 1-8 letters or
# digits, separated by '-' (or '_', as many corpora write pt_BR). 35 characters hold any real tag
# and keep a megabyte of text out of every pod's config.
LANGUAGE_CODE = r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8})*$"


def _language_code(value: str) -> str:
    if not re.match(LANGUAGE_CODE, value):
        raise ValueError(f"'{clip(value, 40)}' is not a language code (BCP 47 style: en, de, pt-BR, zh-Hans)")
    return value


LanguageCode = Annotated[str, Field(min_length=2, max_length=35, json_schema_extra={"pattern": LANGUAGE_CODE}),
                         AfterValidator(_language_code)]


class DataSource(Model):
    """One corpus. Flat on purpose: one schema for every format keeps the CRD structural."""

    format: DataFormat = Field(
        ...,
        description=(
            "pairs: line-aligned source/target files (optionally .gz); tsv/csv: one file with named "
            "columns; jsonl: one object per line; parquet: a Parquet file or a directory of them (the "
            "hub's dataset format); arrow: a directory that Hugging Face datasets' save_to_disk wrote; "
            "mtgeneval: an MT-GenEval directory of "
            "masculine/feminine counterfactual pairs; generated: the built-in demo corpus."
        ),
    )
    source: Optional[str] = Field(None, max_length=PATH_MAX, description="pairs: source-language file.")
    target: Optional[str] = Field(None, max_length=PATH_MAX, description="pairs: target-language file.")
    path: Optional[str] = Field(
        None, max_length=PATH_MAX,
        description="tsv/csv/jsonl/parquet file, the parquet or arrow directory, or the mtgeneval directory.")
    source_column: str = Field(
        "source", max_length=NAME_MAX,
        description="tsv/csv column or jsonl field of the source text; parquet/arrow: a column, or a "
                    "struct's field as translation.en.")
    target_column: str = Field(
        "target", max_length=NAME_MAX, description="As sourceColumn, for the target text (e.g. translation.de).")
    lang_column: Optional[str] = Field(
        None, max_length=NAME_MAX, description="tsv/csv column or jsonl field naming each row's target language."
    )
    target_lang: Optional[LanguageCode] = Field(
        None, description="Target language of this source; required when spec.data has several."
    )
    split: str = Field("dev", max_length=NAME_MAX,
                       description="mtgeneval: which split's files to read; arrow: which split of a DatasetDict.")
    size: int = Field(20000, ge=1, description="generated: number of sentence pairs.")
    seed: int = Field(0, description="generated: corpus seed (different seeds, disjoint splits).")
    limit: Optional[int] = Field(None, ge=1, description="Read at most this many pairs.")

    @model_validator(mode="after")
    def _fields_for_format(self) -> Self:
        missing = [f for f in REQUIRED_BY_FORMAT[self.format] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"format '{self.format}' needs {', '.join(repr(to_camel(m)) for m in missing)}")
        return self


class DataChecks(Model):
    """Filters on the training pairs before tokenization; each drop is counted in summary.json."""

    max_length_ratio: Optional[float] = Field(
        9.0, gt=1,
        description=(
            "Drop training pairs whose longer side has more than this many times the characters of "
            "the shorter (translation only); null keeps them."
        ),
    )
    drop_duplicates: bool = Field(
        True, description="Drop training pairs identical to an earlier one (source, target, language)."
    )
    drop_test_overlap: bool = Field(
        True, description="Drop training pairs whose source is a validation or test source (same target language)."
    )


class DataSpec(Model):
    source_lang: LanguageCode = Field(..., description="ISO code of the source language.")
    target_langs: Optional[list[LanguageCode]] = Field(
        None,
        min_length=1,
        description=(
            "One or more targets; several make one multilingual model. Required for translation; "
            "for summarization the default is the source language (same-language summaries)."
        ),
    )
    train: list[DataSource] = Field(default_factory=list)
    validation: list[DataSource] = Field(default_factory=list)
    test: list[DataSource] = Field(default_factory=list)
    task_prefix: Optional[bool] = Field(
        None,
        description=(
            "Prepend 'translate English to German: ' style prefixes (summarization: T5's "
            "'summarize: '). Default: on for several targets or T5 models."
        ),
    )
    max_source_length: int = Field(256, ge=4, description="Longer sources are truncated (tokens).")
    max_target_length: int = Field(256, ge=4, description="Longer targets are truncated (tokens).")
    checks: DataChecks = Field(
        default_factory=DataChecks,
        description="Filters on the training pairs (empty pairs are always dropped); see docs/training.md.",
    )
    source: Optional[StagingSpec] = Field(
        None, description="Copy corpora into source.path (on a shared volume) before training, from S3 or a hub "
                          "dataset repository; train/validation/test then name files below it.")
    prepare: Literal["InTraining", "BeforeTraining"] = Field(
        "InTraining",
        description="When the training data is tokenized into <output>/prepared/ (once; restarts map it). "
                    "InTraining: by the training's first process, while the other ranks wait. BeforeTraining: "
                    "on a cluster (and in `rosetta run`), by the stage job before the gang starts, so no GPU "
                    "idles while a large corpus is tokenized (it also trains the tokenizer, when tokenizer.train "
                    "is set); needs the checkpoints on a persistentVolumeClaim. `rosetta prepare` does the same "
                    "by hand.")
    # spec.task, copied in while the spec validates: readers tag their examples with it.
    _task: str = PrivateAttr("translation")

    @property
    def task(self) -> str:
        return self._task

    @model_validator(mode="after")
    def _languages(self) -> Self:
        if self.source is not None and self.source.path is None:
            raise ValueError("source.path is required: the absolute directory the corpora are copied into")
        task = _current_task()
        self._task = task or "translation"
        if self.target_langs is None:
            if task == "translation":
                raise ValueError("targetLangs is required for task: translation (the languages to translate into)")
            if task is None:
                return self  # spec.task is invalid and reported on its own
            self.target_langs = [self.source_lang]
        # Language tags are case-insensitive (BCP 47): EN and en are one language.
        folded = [lang.casefold() for lang in self.target_langs]
        if task == "translation" and self.source_lang.casefold() in folded:
            raise ValueError(f"targetLangs must not contain the source language '{self.source_lang}' "
                             "(language codes are compared without case)")
        if len(set(folded)) != len(folded):
            raise ValueError("targetLangs has duplicates (language codes are compared without case)")
        if len(self.target_langs) > 1:
            for split in ("train", "validation", "test"):
                for i, src in enumerate(getattr(self, split)):
                    if src.format in ("pairs",) and src.target_lang is None:
                        raise ValueError(
                            f"{split}[{i}].targetLang is required when targetLangs has several languages"
                        )
        for split in ("train", "validation", "test"):
            for i, src in enumerate(getattr(self, split)):
                if src.target_lang is not None and src.target_lang not in self.target_langs:
                    raise ValueError(
                        f"{split}[{i}].targetLang '{src.target_lang}' is not in targetLangs {self.target_langs}"
                    )
        return self


# ------------------------------------------------------------------------ training


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
        problem = _bucket_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    _endpoint = field_validator("endpoint_url")(classmethod(lambda cls, value: _http_url(value)))
    _secret = field_validator("credentials_secret")(classmethod(lambda cls, value: _secret_name(value)))

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
        task = _current_task()
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
        if not _SECRET_NAME.match(value):
            raise ValueError(f"'{value}' is not a valid Secret name (lowercase a-z, 0-9, '-' and '.')")
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

    _base_url = field_validator("base_url")(classmethod(lambda cls, value: _http_url(value, "apiKeySecret")))


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
        _no_credentials(value, "tokenSecret")
        if value is not None and not value.startswith(("http://", "https://", "file:", "databricks")):
            raise ValueError(f"'{value}' must be an http(s):// URL, a file: URI or databricks")
        return value


class TrackingSpec(Model):
    """Experiment trackers that receive what metrics.jsonl and eval.jsonl get (rank 0 only)."""

    wandb: Optional[WandbSpec] = Field(None, description="Log to Weights & Biases (the [tracking] extra).")
    mlflow: Optional[MlflowSpec] = Field(None, description="Log to MLflow (the [tracking] extra).")


# Seconds, as Kubernetes spells durations in its own APIs (terminationGracePeriodSeconds).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800
# Twice the collective timeout: a hung all-reduce ends with the trainer's own CollectiveTimeout exit
# before the operator calls the training stalled, so the more precise diagnosis wins.
DEFAULT_STALL_TIMEOUT_SECONDS = 2 * DEFAULT_COLLECTIVE_TIMEOUT_SECONDS


class PreflightSpec(Model):
    """A check of each pod's node before it trains (docs/operator.md, Bad nodes)."""

    enabled: bool = Field(
        False,
        description="Before training, every rank checks that its GPU is visible and computes correctly, and the "
                    "gang runs one all-reduce; a rank that fails exits with NodeUnhealthy (81), and on a cluster the "
                    "operator keeps the next attempts off that node.",
    )
    min_bus_bandwidth_gbps: Optional[float] = Field(
        None, gt=0, le=10_000,
        description="With GPUs, the all-reduce's bus bandwidth (GB/s, as nccl-tests reports it) below which the "
                    "node whose rank is slowest is unhealthy. None: no floor, the collective only has to finish.",
    )
    collective_mib: int = Field(
        256, ge=1, le=8192, description="Size of the pre-flight all-reduce per rank, in MiB (the bandwidth needs "
                                        "a message large enough to measure the links, not the latency).",
    )
    max_excluded_nodes: int = Field(
        4, ge=0, le=256,
        description="On a cluster, at most this many nodes are kept out of the training's next attempts; past it "
                    "the attempt restarts anywhere (a fleet-wide fault is no single node's).",
    )


class FaultToleranceSpec(Model):
    """What counts as a hang, and what happens then (docs/operator.md, Hangs)."""

    stall_timeout_seconds: int = Field(
        DEFAULT_STALL_TIMEOUT_SECONDS, ge=10, le=7 * 24 * 3600,
        description="On a cluster, the training is Stalled when rank 0's heartbeat has not moved for this long. "
                    "The trainer beats after every optimizer step, evaluation batch and checkpoint save, so a "
                    "long evaluation or save is no stall; only one batch or one save longer than this is.",
    )
    stall_action: Literal["restart", "fail", "report"] = Field(
        "restart",
        description="What the operator does with a Stalled training besides the condition and a Warning event: "
                    "restart ends the attempt's Job so that the JobSet restarts the gang from the last checkpoint "
                    "(counted towards failurePolicy.maxRestarts); fail stops the gang and fails the training; "
                    "report does nothing more.",
    )
    collective_timeout_seconds: int = Field(
        DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, ge=10, le=24 * 3600,
        description="How long one collective (all-reduce, barrier, broadcast) may wait for the other ranks "
                    "before the trainer exits with CollectiveTimeout (75); also NCCL's heartbeat timeout. "
                    "It must cover the longest time one rank works alone while the others wait, e.g. rank 0 "
                    "training the tokenizer.",
    )
    preflight: PreflightSpec = Field(default_factory=PreflightSpec,
                                     description="Check each node before training (off unless enabled).")


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
        # Any value, a list included: _current_task() ignores what is not a task, which is reported on spec.task.
        token = _TASK.set("translation" if task is None else task)
        try:
            return handler(data)
        finally:
            _TASK.reset(token)

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


