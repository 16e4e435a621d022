"""Token ids of many texts at once, without what a training corpus does not need.

`tokenizer(texts, truncation=True, max_length=n)["input_ids"]` asks the Rust tokenizer for full
encodings (character offsets, attention masks, type ids, special-token masks) and converts every
one into Python lists, then keeps only the ids. For a training corpus that is most of the work:
the tokenizers library's `encode_batch_fast` skips the offsets, and taking `.ids` alone skips the
rest, which measured about a third less CPU per pair (docs/benchmarks.md, training data at scale).

This calls a fast tokenizer's backend the way its own `__call__` does (the same truncation, the
same special tokens, the same input/target mode), which reaches into methods transformers does
not document. So `Encoder` checks itself against the public call on a sample of the corpus before
it is trusted, and falls back to the public call (with a log line) if the two ever disagree.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Pairs compared with the public call before the fast path is trusted.
CHECK_SAMPLE = 256

IdsFn = Callable[[Sequence[str]], list[list[int]]]


def public_ids(tokenizer: PreTrainedTokenizerBase, max_length: int, *, target: bool) -> IdsFn:
    """The documented call: what `batching.encode` and a Seq2SeqTrainer user's `map` run."""
    def ids(texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        if target:
            ids_: list[list[int]] = tokenizer(text_target=texts, truncation=True, max_length=max_length)["input_ids"]
            return ids_
        ids_ = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return ids_
    return ids


def _backend_ids(tokenizer: PreTrainedTokenizerBase, max_length: int, *, target: bool) -> IdsFn | None:
    # The `tokenizers` Tokenizer behind a fast tokenizer: a private attribute, so untyped.
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    if not getattr(tokenizer, "is_fast", False) or not hasattr(backend, "encode_batch_fast") \
            or not hasattr(tokenizer, "set_truncation_and_padding"):
        return None
    from transformers.tokenization_utils_base import PaddingStrategy, TruncationStrategy

    def ids(texts: Sequence[str]) -> list[list[int]]:
        tokenizer.set_truncation_and_padding(
            padding_strategy=PaddingStrategy.DO_NOT_PAD, truncation_strategy=TruncationStrategy.LONGEST_FIRST,
            max_length=max_length, stride=0, pad_to_multiple_of=None, padding_side=None)
        split = bool(getattr(tokenizer, "split_special_tokens", False))
        if backend.encode_special_tokens != split:
            backend.encode_special_tokens = split
        # Tokenizers such as mBART's and NLLB's swap their language tokens for targets.
        switch = target and hasattr(tokenizer, "_switch_to_target_mode")
        if switch:
            tokenizer._switch_to_target_mode()
        try:
            return [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=True)]
        finally:
            if switch and hasattr(tokenizer, "_switch_to_input_mode"):
                tokenizer._switch_to_input_mode()
    return ids


class Encoder:
    """Source and target ids for a corpus: `encoder.sources(texts)`, `encoder.targets(texts)`.

    Built once per corpus with a sample of its pairs; uses the backend's fast path when it gives
    exactly the public call's ids on that sample (and on a long text, so truncation is compared)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_source: int, max_target: int,
                 sample: tuple[Sequence[str], Sequence[str]]) -> None:
        self.fast = False
        self.sources = public_ids(tokenizer, max_source, target=False)
        self.targets = public_ids(tokenizer, max_target, target=True)
        fast_sources = _backend_ids(tokenizer, max_source, target=False)
        fast_targets = _backend_ids(tokenizer, max_target, target=True)
        if fast_sources is None or fast_targets is None:
            return
        src, tgt = (list(texts[:CHECK_SAMPLE]) for texts in sample)
        longest = " ".join(src + tgt)[:20 * (max_source + max_target)]
        src, tgt = src + [longest], tgt + [longest]
        try:
            agree = fast_sources(src) == self.sources(src) and fast_targets(tgt) == self.targets(tgt)
        except Exception as exc:  # an unexpected backend: the public call still works
            log.info("token ids: the fast path failed on a sample (%s: %s); using the tokenizer's call",
                     type(exc).__name__, exc)
            return
        if not agree:
            log.warning("token ids: the backend's fast path disagrees with %s's call on a sample; "
                        "using the call (slower)", type(tokenizer).__name__)
            return
        self.fast = True
        self.sources, self.targets = fast_sources, fast_targets
