"""The tokenizer's training sample: a seeded reservoir over the whole stream, on by default.

`tokenizer.train.maxSentences` defaults to 300,000 pairs (sentencepiece's input_sentence_size);
null or 0 trains on everything. The sample is drawn in one pass and holds at most that many
items, so a first start's memory does not grow with the corpus.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rosetta_contract.model_fields import TokenizerTraining
from rosetta_trainer.data import corpus
from rosetta_trainer.models.tokenization import (
    SAMPLE_SEED,
    _encoded,
    _reservoir,
    _sentences,
    _subsample,
    train_tokenizer,
)

PAIRS = corpus.generate_pairs("de", 400, 0)


def training(**fields) -> TokenizerTraining:
    return TokenizerTraining.model_validate({"type": "bpe", "vocabSize": 300, **fields})


def test_a_sample_by_default_and_null_or_zero_for_everything():
    assert TokenizerTraining().max_sentences == 300_000
    assert TokenizerTraining.model_validate({}).max_sentences == 300_000
    assert TokenizerTraining.model_validate({"maxSentences": None}).max_sentences is None
    assert TokenizerTraining.model_validate({"maxSentences": 0}).max_sentences == 0
    with pytest.raises(ValidationError, match="maxSentences"):
        TokenizerTraining.model_validate({"maxSentences": -1})


def test_an_explicit_null_survives_the_round_trip():
    # The operator writes the resolved spec for the pods: a null dropped there would come back
    # as the default sample.
    spec = TokenizerTraining.model_validate({"maxSentences": None})
    dumped = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    assert dumped == {"maxSentences": None}
    assert TokenizerTraining.model_validate(dumped).max_sentences is None


@pytest.mark.parametrize("n, k", [(10_000, 100), (100, 100), (50, 100), (1, 1)])
def test_the_sample_has_the_configured_size(n, k):
    sample = _subsample(range(n), k)
    assert len(sample) == min(n, k)
    assert sample == sorted(set(sample))  # distinct, in the stream's order


def test_the_sample_is_fixed_by_its_seed():
    assert _subsample(range(10_000), 50) == _subsample(iter(range(10_000)), 50) == _subsample(range(10_000), 50, SAMPLE_SEED)
    assert _subsample(range(10_000), 50, seed=1) == _subsample(range(10_000), 50, seed=1)
    assert _subsample(range(10_000), 50, seed=1) != _subsample(range(10_000), 50, seed=2)


def test_the_sample_covers_the_whole_stream():
    n, k = 1_000, 10
    drawn = [i for seed in range(300) for i in _subsample(range(n), k, seed=seed)]
    assert n - 1 in drawn  # the very last line can be chosen
    assert sum(i >= n - 100 for i in drawn) > 0.05 * len(drawn)  # the last tenth about as often as any tenth
    assert abs(sum(drawn) / len(drawn) - (n - 1) / 2) < 0.05 * n  # no lean to the head or the tail


class Counted:
    """Counts its live instances: what the sampler holds, whatever its data structure."""

    alive = most = 0

    def __init__(self):
        Counted.alive += 1
        Counted.most = max(Counted.most, Counted.alive)

    def __del__(self):
        Counted.alive -= 1


def test_the_sampler_holds_k_items_never_the_corpus():
    Counted.alive = Counted.most = 0
    sample = _subsample((Counted() for _ in range(20_000)), 25)
    assert len(sample) == 25
    # The reservoir, the item being made and the one before it, which the loop still names.
    assert Counted.most <= 25 + 2


class CountedText(str):
    alive = most = 0

    def __new__(cls, value):
        CountedText.alive += 1
        CountedText.most = max(CountedText.most, CountedText.alive)
        return super().__new__(cls, value)

    def __del__(self):
        CountedText.alive -= 1


@pytest.mark.parametrize("type", ["bpe", "unigram"])
@pytest.mark.parametrize("limit", [None, 0, 50])
def test_training_never_holds_the_corpus(tmp_path, type, limit):
    CountedText.alive = CountedText.most = 0
    stream = ((CountedText(s), CountedText(t)) for s, t in PAIRS * 10)
    train_tokenizer(training(type=type, maxSentences=limit), stream, tmp_path)
    # 4,000 pairs: the sample is held as bytes, and everything streams; at most what tokenizers
    # buffers between Python and Rust is alive at once, never the 8,000 sentences.
    assert CountedText.most <= 300


def test_the_sample_keeps_its_text_exactly():
    items = [("Grüße, 東京", "x"), "one sentence", ("", "empty source"), ("lone \ud800 surrogate", "")]
    assert list(_sentences(items, 10)) == ["Grüße, 東京", "x", "one sentence", "", "empty source",
                                           "lone \ud800 surrogate", ""]
    held, positions = _reservoir(items, 10, SAMPLE_SEED, keep=_encoded)
    assert all(type(item) is bytes for item in held) and sorted(positions) == [0, 1, 2, 3]


def test_null_and_zero_train_on_everything(tmp_path):
    full = training(maxSentences=None)
    vocab = train_tokenizer(full, PAIRS, tmp_path / "null").get_vocab()
    assert train_tokenizer(training(maxSentences=0), PAIRS, tmp_path / "zero").get_vocab() == vocab
    # A sample at least as large as the corpus is the corpus.
    assert train_tokenizer(training(), PAIRS, tmp_path / "default").get_vocab() == vocab
    assert train_tokenizer(training(maxSentences=len(PAIRS)), PAIRS, tmp_path / "all").get_vocab() == vocab
    assert train_tokenizer(training(maxSentences=40), PAIRS, tmp_path / "some").get_vocab() != vocab
