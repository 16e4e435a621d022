"""spec.model and spec.tokenizer: pretrained weights or a from-scratch architecture, and the
tokenizer to load or train.

The CRD schema is generated from these models (crd.py): descriptions here are what `kubectl explain`
shows.
"""

from __future__ import annotations

from typing import Literal, Optional, Self

from pydantic import Field, model_validator

from rosetta_contract.staging_fields import StagingSpec
from rosetta_contract.strict_model import PATH_MAX, Model


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
        300_000, ge=0,
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
