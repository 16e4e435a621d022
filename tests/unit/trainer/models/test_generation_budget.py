"""Evaluation's generation budget: a model that has not learnt to stop is cut at
maxLengthRatio x source + maxLengthOffset tokens (default 2 x source + 10), never past maxNewTokens."""

import pytest
import torch

from rosetta_contract.model_fields import ModelSpec, TokenizerTraining
from rosetta_trainer.data import corpus
from rosetta_trainer.evaluation.evaluate import Generation, translate
from rosetta_trainer.models.models import build_model
from rosetta_trainer.models.tokenization import train_tokenizer


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    pairs = corpus.generate_pairs("de", 300, seed=1)
    tokenizer = train_tokenizer(TokenizerTraining.model_validate({"type": "bpe", "vocabSize": 300}), pairs,
                                tmp_path_factory.mktemp("tokenizer"))
    torch.manual_seed(0)
    model = build_model(ModelSpec.model_validate({"architecture": "transformer", "size": "tiny", "dModel": 32,
                                                  "encoderLayers": 1, "decoderLayers": 1, "heads": 2,
                                                  "ffnDim": 64}),
                        vocab_size=len(tokenizer), max_length=256)
    return model, tokenizer


def generated_lengths(model, tokenizer, sources, generation) -> list[int]:
    """New tokens per generate() call (the output starts with the decoder start token)."""
    lengths = []
    real_generate = model.generate

    def recording_generate(**kwargs):
        ids = real_generate(**kwargs)
        lengths.append(ids.shape[1] - 1)
        return ids

    model.generate = recording_generate
    try:
        translate(model, tokenizer, sources, generation=generation, batch_sentences=8, device=torch.device("cpu"))
    finally:
        del model.generate
    return lengths


SOURCES = ["five cars", "We need nine thousand and forty blue birds."]


def test_untrained_model_output_is_capped_by_source_length(untrained):
    model, tokenizer = untrained
    generated = generated_lengths(model, tokenizer, SOURCES, Generation(beams=1, max_new_tokens=200))
    # one batch, padded to the longer source
    cap = 2 * max(len(tokenizer(s).input_ids) for s in SOURCES) + 10
    assert generated and generated[0] <= cap < 200, (generated, cap)
    # the untrained model would have gone on: the cap, not an end-of-sentence token, stopped it
    assert generated[0] == cap


@pytest.mark.parametrize("ratio, offset, max_new, expected", [
    (1.0, 3, 200, lambda n: n + 3),
    (0.5, 0, 200, lambda n: n // 2),
    (3.0, 10, 20, lambda n: 20),       # maxNewTokens still caps
    (None, 10, 37, lambda n: 37),      # no ratio: only maxNewTokens
])
def test_max_length_ratio_and_offset_set_the_cap(untrained, ratio, offset, max_new, expected):
    model, tokenizer = untrained
    n = max(len(tokenizer(s).input_ids) for s in SOURCES)
    generation = Generation(beams=1, max_new_tokens=max_new, max_length_ratio=ratio, max_length_offset=offset)
    assert generation.budget(n) == expected(n)
    assert generated_lengths(model, tokenizer, SOURCES, generation) == [expected(n)]


def test_budget_is_at_least_one_token():
    assert Generation(max_length_ratio=0.01, max_length_offset=0).budget(3) == 1
