"""Train a subword tokenizer on the training data, or load an existing one.

A trained tokenizer follows T5's conventions, which the from-scratch model configs rely on
(models.PAD_ID/EOS_ID/UNK_ID): ids 0, 1, 2 are "<pad>", "</s>", "<unk>", and every encoded
sequence ends in "</s>". NFKC normalisation and the Metaspace ("▁") pre-tokenizer and decoder
make `decode(encode(text))` give back the (NFKC-normalised) text with its spaces.

It is saved with `save_pretrained`, so `load_tokenizer(out_dir)`, plain
`AutoTokenizer.from_pretrained(out_dir)` and the exported model directory all see the same
tokenizer.
"""

from __future__ import annotations

import itertools
import json
import random
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rosetta_contract.model_fields import TokenizerTraining

T = TypeVar("T")

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# The order is the ids: the trainers give special tokens the first ids, in this order.
SPECIAL_TOKENS = (PAD, EOS, UNK)
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# Fixed, not the training's seed: the tokenizer `rosetta prepare` trained is reused by a training
# with the same tokenizer settings (tokenizer_reuse.py), whatever its seed.
SAMPLE_SEED = 0


def _reservoir(items: Iterable[T], k: int, seed: int,
               keep: Callable[[T], Any] | None = None) -> tuple[list[Any], array[int]]:
    """A uniform sample of at most k items, the same for the same seed and items, and where each
    stood in the stream; in no order. One pass (reservoir sampling, Vitter's algorithm R): k
    items are held, never the whole corpus. `keep` makes what is held of an item the sample
    takes (by default the item itself)."""
    rng = random.Random(seed)
    # The positions sit apart from the items, in one flat array: a (position, item) tuple per
    # slot would add some 90 bytes to each of the k pairs held.
    held: list[Any] = []
    positions = array("q")
    for i, item in enumerate(items):
        if i < k:
            held.append(keep(item) if keep else item)
            positions.append(i)
        else:
            j = rng.randrange(i + 1)
            if j < k:
                held[j] = keep(item) if keep else item
                positions[j] = i
    return held, positions


def _in_order(positions: array[int]) -> np.ndarray:
    # numpy's sort of 8-byte positions, not sorted(range(k), key=...): 1M Python ints twice over.
    return np.argsort(np.frombuffer(positions, dtype=np.int64))


def _subsample(items: Iterable[T], k: int | None, seed: int = SAMPLE_SEED) -> list[T]:
    """At most k items (all of them when k is None or 0), a seeded uniform sample kept in the
    stream's order."""
    if not k:
        return list(items)
    held, positions = _reservoir(items, k, seed)
    return [held[slot] for slot in _in_order(positions)]


_WHOLE = 0xFFFFFFFF  # the split of an item that is one sentence


def _encoded(item: str | tuple[str, str]) -> bytes:
    """An item as one bytes object: the source's length in 4 bytes (or _WHOLE), then the UTF-8
    text. A pair held as a tuple of two str takes some 150 bytes more."""
    if isinstance(item, str):
        return _WHOLE.to_bytes(4, "little") + item.encode("utf-8", "surrogatepass")
    source, target = (side.encode("utf-8", "surrogatepass") for side in item)
    return len(source).to_bytes(4, "little") + source + target


def _packed(held: list[bytes], order: np.ndarray) -> tuple[bytearray, array[int]]:
    """The sentences of the `_encoded` items in `held`, taken in `order`, in one buffer, and where
    each ends; `held` is emptied as it goes. One block, given back whole once the trainer has read
    it: the reservoir's churn leaves its items scattered over the heap, and the words the trainer
    keeps, allocated among them, would pin those pages to the end of the process (a 1M-pair sample
    of 2M pairs held as str pairs peaked at twice the memory: docs/benchmarks.md)."""
    text, ends = bytearray(), array("q")
    for slot in order:
        item, held[slot] = held[slot], b""
        split = int.from_bytes(item[:4], "little")
        if split != _WHOLE:
            ends.append(len(text) + split)
        text += memoryview(item)[4:]
        ends.append(len(text))
    return text, ends


def _sentences(texts: Iterable[str | tuple[str, str]], max_sentences: int | None) -> Iterator[str]:
    """The sentences to train on, as a stream: without a limit the text is never held whole."""
    if not max_sentences:
        for item in texts:
            if isinstance(item, str):
                yield item
            else:
                yield from item
        return
    held, positions = _reservoir(texts, max_sentences, SAMPLE_SEED, keep=_encoded)
    text, ends = _packed(held, _in_order(positions))
    del held, positions
    view, start = memoryview(text), 0
    for end in ends:
        yield str(view[start:end], "utf-8", "surrogatepass")
        start = end


def _words_to_double(counts: Counter[str], limit: int) -> list[str]:
    """The words that may each become a piece of their own: the `limit` most frequent (ties by
    first occurrence, so the same data gives the same words), in a fixed order."""
    return sorted(word for word, _ in counts.most_common(limit))


def _train_unigram(spec: TokenizerTraining, sentences: Iterable[str], normalizer: normalizers.Normalizer,
                   pre_tokenizer: pre_tokenizers.PreTokenizer) -> models.Unigram:
    # The tokenizers Unigram trainer takes its seed pieces from a suffix array over the
    # *distinct* words, so a frequent word that is not part of any other word ("▁gibt") is
    # never a candidate and ends up spelt letter by letter. Feeding a word once more, doubled
    # ("▁gibt▁gibt"), makes it a candidate. Pieces born across that seam contain an inner "▁",
    # can never match a pre-tokenized word, and are dropped afterwards. Only the vocab_size most
    # frequent words are doubled (no more words can have a piece of their own): doubling every
    # distinct word filled the seeds with rare words and seam pieces, and cost about 3x the
    # memory and twice the time for more tokens per sentence (docs/benchmarks.md).
    counts: Counter[str] = Counter()

    def words() -> Iterator[str]:
        # A stream: a list of every word would hold some 13 strings per sentence.
        for sentence in sentences:
            pieces = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))]
            counts.update(pieces)
            yield from pieces
        yield from (w + w for w in _words_to_double(counts, spec.vocab_size))

    # No normalizer or pre-tokenizer here: each fed string is exactly one word.
    scratch = Tokenizer(models.Unigram())
    trainer = trainers.UnigramTrainer(
        vocab_size=spec.vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token=UNK, show_progress=False,
    )
    scratch.train_from_iterator(words(), trainer=trainer)
    vocab = json.loads(scratch.to_str())["model"]["vocab"]
    kept = [(piece, score) for piece, score in vocab if "▁" not in piece[1:]]
    # The trainer's parallel reductions leave the scores wobbling in the last bits from run to
    # run, which reorders tied pieces and so changes token ids. Rounded scores with the piece as
    # tie-breaker give every rank and every restart the same ids for the same data.
    specials = [(piece, score) for piece, score in kept if piece in SPECIAL_TOKENS]
    body = [(piece, score) for piece, score in kept if piece not in SPECIAL_TOKENS]
    # The characters the trainer must keep but never scored get made-up scores (the lowest
    # score, then 0.0001 more for each next one) in hash-set order, which changes from run to
    # run: hand that block's scores out in character order instead.
    low = min((score for _, score in body), default=0.0)
    steps: dict[int, list[int]] = {}
    for i, (piece, score) in enumerate(body):
        k = round((score - low) / 1e-4)
        if len(piece) == 1 and abs(score - low - k * 1e-4) < 1e-6:
            steps.setdefault(k, []).append(i)
    block: list[int] = []
    k = 0
    while k in steps:
        block += steps[k]
        k += 1
    chars = sorted(body[i][0] for i in block)
    scores = sorted((body[i][1] for i in block), reverse=True)
    for i, piece, score in zip(block, chars, scores):
        body[i] = (piece, score)
    pieces = sorted(((piece, round(score, 9)) for piece, score in body), key=lambda item: (-item[1], item[0]))
    specials.sort(key=lambda item: SPECIAL_TOKENS.index(item[0]))
    return models.Unigram(specials + pieces, unk_id=UNK_ID, byte_fallback=False)


def train_tokenizer(
    spec: TokenizerTraining, texts: Iterable[str | tuple[str, str]], out_dir: str | Path
) -> PreTrainedTokenizerFast:
    """Train a BPE or Unigram tokenizer on `texts` and save it to `out_dir`.

    `texts` holds strings, or (source, target) pairs for a tokenizer shared by both languages,
    and is read once, as a stream. `spec.max_sentences` (by default 300,000) caps the items
    used: with pairs that is "at most N sentences per side", as the spec field says. The sample
    is seeded (SAMPLE_SEED), so every rank and every restart trains the same tokenizer from the
    same data, and it is all that is held: memory is flat in the corpus size. With
    `max_sentences` null or 0 every sentence streams through the trainer, which holds only the
    distinct words and their counts.

    `min_frequency` applies to BPE merges; the Unigram trainer (as in sentencepiece) has no
    such threshold and prunes rare pieces by likelihood instead. A Unigram vocabulary can come
    out smaller than `vocab_size` on a small corpus.
    """
    sentences = _sentences(texts, spec.max_sentences)
    first = next(sentences, None)
    if first is None:
        raise ValueError("cannot train a tokenizer on no text")
    sentences = itertools.chain([first], sentences)
    normalizer = normalizers.NFKC()
    pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    if spec.type == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size, min_frequency=spec.min_frequency,
            special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        )
        tokenizer.train_from_iterator(sentences, trainer=trainer)
    else:
        tokenizer = Tokenizer(_train_unigram(spec, sentences, normalizer, pre_tokenizer))
        tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != [PAD_ID, EOS_ID, UNK_ID]:
        raise RuntimeError(f"special tokens {SPECIAL_TOKENS} got ids {ids}, expected 0, 1, 2")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, EOS_ID)]
    )
    # clean_up_tokenization_spaces would turn "a ." into "a." on decode: decode must be exact.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerBase:
    """A tokenizer saved by `train_tokenizer`, or any pretrained one (directory or hub id)."""
    try:
        return AutoTokenizer.from_pretrained(str(path_or_name))
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot load a tokenizer from {str(path_or_name)!r}: {exc}") from exc
