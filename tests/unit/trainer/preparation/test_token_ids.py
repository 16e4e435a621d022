"""The corpus encoder's fast path gives exactly the tokenizer's own ids, or is not used."""

import logging

import pytest
from transformers import NllbTokenizer

from rosetta_contract.model_fields import TokenizerTraining
from rosetta_trainer.data.corpus import generate_pairs
from rosetta_trainer.models.tokenization import load_tokenizer, train_tokenizer
from rosetta_trainer.preparation import token_ids
from rosetta_trainer.preparation.token_ids import Encoder, public_ids


@pytest.fixture(scope="module")
def pairs():
    pairs = generate_pairs("de", 300, seed=2)
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.fixture(scope="module")
def trained(pairs, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    train_tokenizer(TokenizerTraining(type="unigram", vocab_size=200), [*pairs[0], *pairs[1]], directory)
    return load_tokenizer(directory)


def _nllb():
    """A fast tokenizer that swaps its language token between sources and targets."""
    pieces = ["<s>", "<pad>", "</s>", "<unk>", *"▁abcdefghijklmnopqrstuvwxyz", "▁the", "▁cat"]
    return NllbTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[],
                         src_lang="eng_Latn", tgt_lang="deu_Latn")


@pytest.mark.parametrize("max_length", [6, 128])  # 6 truncates most pairs
def test_fast_ids_are_the_tokenizers_ids(trained, pairs, max_length):
    sources, targets = pairs
    encoder = Encoder(trained, max_length, max_length, pairs)

    assert encoder.fast
    assert encoder.sources(sources) == public_ids(trained, max_length, target=False)(sources)
    assert encoder.targets(targets) == public_ids(trained, max_length, target=True)(targets)
    assert max(map(len, encoder.sources(sources))) <= max_length


def test_fast_ids_follow_the_target_mode_of_the_tokenizer():
    tokenizer = _nllb()
    texts = ["the cat", "a cat sat there", "the"]
    encoder = Encoder(tokenizer, 16, 16, (texts, texts))

    assert encoder.fast
    sources, targets = encoder.sources(texts), encoder.targets(texts)
    eng, deu = tokenizer.convert_tokens_to_ids(["eng_Latn", "deu_Latn"])
    assert {ids[0] for ids in sources} == {eng} and {ids[0] for ids in targets} == {deu}
    assert sources == tokenizer(texts, truncation=True, max_length=16)["input_ids"]
    assert targets == tokenizer(text_target=texts, truncation=True, max_length=16)["input_ids"]
    # The tokenizer is left in input mode, as its own call leaves it.
    assert tokenizer(texts[:1])["input_ids"][0][0] == eng


def test_a_fast_path_that_disagrees_is_not_used(trained, pairs, monkeypatch, caplog):
    def off_by_one(tokenizer, max_length, *, target):
        return lambda texts: [[i + 1 for i in ids] for ids in public_ids(tokenizer, max_length, target=target)(texts)]

    monkeypatch.setattr(token_ids, "_backend_ids", off_by_one)
    with caplog.at_level(logging.WARNING, logger="rosetta_trainer.preparation.token_ids"):
        encoder = Encoder(trained, 32, 32, pairs)

    assert not encoder.fast
    assert "disagrees" in caplog.text
    assert encoder.sources(pairs[0][:5]) == public_ids(trained, 32, target=False)(pairs[0][:5])


def test_a_tokenizer_without_a_rust_backend_uses_its_own_call():
    class Slow:
        is_fast = False

        def __call__(self, texts=None, *, text_target=None, truncation, max_length):
            texts = texts if text_target is None else text_target
            return {"input_ids": [[len(t) % 7, 1 if text_target is None else 2][:max_length] for t in texts]}

    encoder = Encoder(Slow(), 8, 8, (["ab"], ["cde"]))

    assert not encoder.fast
    assert encoder.sources(["ab"]) == [[2, 1]] and encoder.targets(["cde"]) == [[3, 2]]
