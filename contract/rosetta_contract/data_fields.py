"""spec.data: the languages, the corpora of each split and their formats, the filters on the
training pairs, where the corpora are staged from and when they are tokenized.

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Self

from pydantic import AfterValidator, Field, PrivateAttr, model_validator
from pydantic.alias_generators import to_camel

from rosetta_contract.staging_fields import StagingSpec
from rosetta_contract.strict_model import NAME_MAX, PATH_MAX, Model, clip
from rosetta_contract.tasks import current_task

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
        task = current_task()
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
