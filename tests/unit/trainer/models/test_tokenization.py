"""rosetta_trainer.models.tokenization: trained tokenizers follow T5's conventions and round-trip text."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter

import pytest
from transformers import AutoTokenizer

from rosetta_contract.model_fields import TokenizerTraining
from rosetta_trainer.data import corpus
from rosetta_trainer.models.tokenization import (
    EOS_ID,
    PAD_ID,
    UNK_ID,
    _sentences,
    _subsample,
    _words_to_double,
    load_tokenizer,
    train_tokenizer,
)

PAIRS = corpus.generate_pairs("de", 600, 0) + corpus.generate_pairs("fr", 600, 0)
TEXTS = [
    "Ich habe dreihunderteinundzwanzig grüne Äpfel gekauft.",
    "Mein Großvater ist neunundachtzig Jahre alt.",
    "Die Prüfung ist am Donnerstag, dem einundzwanzigsten März.",
    "Ma sœur a quatre-vingt-dix-sept ans.",
    "J'ai acheté soixante et onze petites chaises.",
    "Le vélo coûte mille deux cents euros.",
    "My brother is twenty-one years old.",
]


def training(type: str, vocab_size: int = 400, **extra) -> TokenizerTraining:
    return TokenizerTraining.model_validate({"type": type, "vocabSize": vocab_size, **extra})


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def trained(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    return request.param, out, train_tokenizer(training(request.param), PAIRS, out)


def test_special_token_ids(trained):
    _, _, tok = trained
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)


def test_encode_appends_eos(trained):
    _, _, tok = trained
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
        assert UNK_ID not in ids and PAD_ID not in ids


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trip(trained, text):
    _, _, tok = trained
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_round_trip_keeps_spaces_and_punctuation(trained):
    _, _, tok = trained
    text = "Hier gibt es zwei Äpfel , blaue . Vögel"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_unknown_character_is_unk(trained):
    _, _, tok = trained
    ids = tok("Ich sehe 猫.")["input_ids"]
    assert UNK_ID in ids


def test_nfkc_normalisation(trained):
    _, _, tok = trained
    decomposed = unicodedata.normalize("NFD", "Äpfel")
    assert decomposed != "Äpfel"
    assert tok(decomposed)["input_ids"] == tok("Äpfel")["input_ids"]


def test_vocab_size_respected(trained):
    _, _, tok = trained
    assert 100 < len(tok) <= 400


def test_save_load_round_trip(trained):
    _, out, tok = trained
    assert (out / "tokenizer.json").is_file()
    loaded = load_tokenizer(out)
    auto = AutoTokenizer.from_pretrained(str(out))
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids
        assert auto(text)["input_ids"] == ids
    assert auto.decode(auto(TEXTS[0])["input_ids"], skip_special_tokens=True) == TEXTS[0]
    assert (auto.pad_token_id, auto.eos_token_id, auto.unk_token_id) == (0, 1, 2)


def test_batch_padding_uses_pad_id(trained):
    _, _, tok = trained
    batch = tok(["kurz", TEXTS[0]], padding=True)
    short = batch["input_ids"][0]
    assert short[-1] == PAD_ID and batch["attention_mask"][0][-1] == 0


def test_bpe_is_deterministic(tmp_path):
    a = train_tokenizer(training("bpe", 300), PAIRS, tmp_path / "a")
    b = train_tokenizer(training("bpe", 300), PAIRS, tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert a(TEXTS[0])["input_ids"] == b(TEXTS[0])["input_ids"]


def _vocab(path) -> list[str]:
    vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    if isinstance(vocab, dict):  # BPE: {piece: id}
        return sorted(vocab, key=vocab.__getitem__)
    return [piece for piece, _ in vocab]  # Unigram: [[piece, score], ...] in id order


def test_unigram_is_deterministic(tmp_path):
    # The trainer gives the characters it must keep made-up scores in hash-set order (which
    # differs between runs): the same data must still give the same pieces in the same order.
    for name in "abc":
        train_tokenizer(training("unigram", 300), PAIRS, tmp_path / name)
    vocabs = [_vocab(tmp_path / name) for name in "abc"]
    assert vocabs[0] == vocabs[1] == vocabs[2]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "c" / "tokenizer.json").read_bytes()
    # Single characters are in the vocabulary, so no letter of the corpus is unknown.
    assert {"ß", "ä", "é", "œ"} <= set(vocabs[0])


def test_pieces_have_no_inner_metaspace(trained):
    # Unigram is fed doubled words ("▁gibt▁gibt"); pieces across that seam must be dropped.
    _, out, _ = trained
    assert not [piece for piece in _vocab(out) if "▁" in piece[1:]]


def test_frequent_words_that_are_part_of_no_other_become_pieces(tmp_path):
    # The Unigram trainer's suffix array sees a word that occurs in no other word once, and never
    # makes it a candidate: without the doubling these would be spelt in pieces (checked).
    frequent = ["Hier gibt es Wasser", "Das ist sehr gut", "Es gibt sehr viel"] * 40
    others = [f"Wort{a}{b}{c}" for a in "qxzjvk" for b in "qxzjvk" for c in "qxzjvk"]
    train_tokenizer(training("unigram", 200), frequent + others, tmp_path)
    assert {"▁gibt", "▁sehr", "▁Wasser"} <= set(_vocab(tmp_path))


def test_only_the_most_frequent_words_are_doubled():
    counts = Counter({"▁b": 5, "▁a": 5, "▁rare": 1, "▁c": 3, "▁once": 1})
    assert _words_to_double(counts, 3) == ["▁a", "▁b", "▁c"]
    assert _words_to_double(counts, 100) == sorted(counts)
    # A tie at the limit goes to the word seen first, whatever the hash order.
    assert _words_to_double(Counter(["▁y", "▁x"]), 1) == ["▁y"]


def test_min_frequency_limits_bpe(tmp_path):
    small = train_tokenizer(training("bpe", 5000, minFrequency=50), PAIRS, tmp_path / "a")
    big = train_tokenizer(training("bpe", 5000, minFrequency=1), PAIRS, tmp_path / "b")
    assert len(small) < len(big) <= 5000


def test_max_sentences_subsample_is_deterministic():
    items = [(f"s{i}", f"t{i}") for i in range(100)]
    a = list(_sentences(items, 10))
    assert a == list(_sentences(items, 10))
    assert len(a) == 20  # ten pairs, both sides
    assert a[0::2] == [s for s, _ in _subsample(items, 10)]
    indices = [int(s[1:]) for s in a[0::2]]
    assert indices == sorted(indices) and len(set(indices)) == 10  # original order, no repeats
    everything = [x for pair in items for x in pair]
    assert list(_sentences(items, None)) == list(_sentences(items, 0)) == everything
    assert list(_sentences(items, 1000)) == everything
    assert list(_sentences(["a", "b"], 1)) in (["a"], ["b"])


def test_max_sentences_changes_training_data(tmp_path):
    a = train_tokenizer(training("bpe", 300, maxSentences=50), PAIRS, tmp_path / "a")
    b = train_tokenizer(training("bpe", 300, maxSentences=50), PAIRS, tmp_path / "b")
    full = train_tokenizer(training("bpe", 300), PAIRS, tmp_path / "c")
    assert a.get_vocab() == b.get_vocab()
    assert a.get_vocab() != full.get_vocab()


def test_plain_strings_are_accepted(tmp_path):
    tok = train_tokenizer(training("unigram", 200), [s for pair in PAIRS for s in pair], tmp_path)
    assert tok.decode(tok(TEXTS[1])["input_ids"], skip_special_tokens=True) == TEXTS[1]


def test_empty_text_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer(training("bpe"), [], tmp_path)
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer(training("unigram"), iter(()), tmp_path)


def test_load_tokenizer_bad_path(tmp_path):
    bad = tmp_path / "no-such-tokenizer"
    with pytest.raises(OSError) as err:
        load_tokenizer(bad)
    assert str(bad) in str(err.value)


def test_max_sentences_holds_a_sample_not_the_corpus():
    alive, most = 0, 0

    class Item:
        def __init__(self, i):
            nonlocal alive, most
            self.i = i
            alive += 1
            most = max(most, alive)

        def __del__(self):
            nonlocal alive
            alive -= 1

    sample = _subsample((Item(i) for i in range(5_000)), 10)
    assert len(sample) == 10 and most <= 12  # the reservoir, the item in hand and the one it replaces
    indices = [item.i for item in sample]
    assert indices == sorted(indices) and max(indices) >= 10  # drawn from the whole stream, not its head
