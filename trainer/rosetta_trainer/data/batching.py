"""Token-budget batches bucketed by length, deterministic per (seed, epoch).

The plan for an epoch is a pure function of the lengths, the seed and the
epoch number, so a resumed run rebuilds the same plan and skips the batches it
has already consumed: that is what makes resume exact.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast, overload

import numpy as np
import torch

from rosetta_contract.config import TrainerSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100  # labels with this value do not contribute to the loss
_SLICE = 1 << 16  # pairs per slice where a plan builds its temporaries (half a MiB of words)


class Corpus(Protocol):
    """What batches are made from: an EncodedCorpus, or a shards.ShardedCorpus (memory-mapped)."""

    @property
    def sources(self) -> Any: ...
    @property
    def targets(self) -> Any: ...
    def __len__(self) -> int: ...
    def lengths(self) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class EncodedCorpus:
    """Token ids in memory (shards.ShardedCorpus offers the same from memory-mapped files)."""

    sources: list[list[int]]
    targets: list[list[int]]

    def __len__(self) -> int:
        return len(self.sources)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.fromiter(map(len, self.sources), dtype=np.int32, count=len(self)),
                np.fromiter(map(len, self.targets), dtype=np.int32, count=len(self)))


def encode(tokenizer: PreTrainedTokenizerBase, sources: list[str], targets: list[str], max_source: int, max_target: int) -> EncodedCorpus:
    src = tokenizer(sources, truncation=True, max_length=max_source)["input_ids"]
    tgt = tokenizer(text_target=targets, truncation=True, max_length=max_target)["input_ids"]
    return EncodedCorpus(list(src), list(tgt))


@dataclass(frozen=True)
class BatchShapes:
    """How far a batch is padded: its lengths to a multiple or a bucket, and maybe its rows.

    A compiled step specialises on its inputs' shapes and CUDA graphs replay one recorded shape,
    so the shapes an epoch shows must be few. Lengths padded to a multiple of 8 (or to a fixed set of
    buckets) bound them along the sequence; with `static_rows` a token batch is also padded, with
    fully ignored rows, to as many rows as its padded lengths fit in the budget, so that its shape
    is a function of its lengths alone. The padded positions are masked and ignored by the loss;
    they cost compute, which bench/padding.py measures.
    """

    multiple: int = 1
    buckets: tuple[int, ...] | None = None
    static_rows: bool = False

    @overload
    def length(self, n: int) -> int: ...
    @overload
    def length(self, n: np.ndarray) -> np.ndarray: ...
    def length(self, n: int | np.ndarray) -> int | np.ndarray:
        """The padded length of a batch whose longest sentence is `n` (an int or a numpy array)."""
        if self.buckets is not None:
            buckets = np.asarray(self.buckets)
            padded = buckets[np.minimum(np.searchsorted(buckets, n), len(buckets) - 1)]
            padded = np.maximum(padded, n)  # longer than every bucket (the spec forbids it): its own length
            return padded if isinstance(n, np.ndarray) else int(padded)
        m = self.multiple
        if m == 1:
            return n  # no copy of millions of lengths to pad nothing
        return -(-n // m) * m

    def rows(self, count: int, src_len: int, tgt_len: int, max_tokens: int | None,
             max_sentences: int | None) -> int:
        """Rows of a batch of `count` pairs whose padded lengths are src_len and tgt_len."""
        if not self.static_rows:
            return count
        fit = max_sentences if max_sentences is not None else (max_tokens or 0) // (src_len + tgt_len)
        return max(count, fit)


EXACT = BatchShapes()


def batch_shapes(spec: TrainerSpec) -> BatchShapes:
    """spec.training.batch's padding, its defaults filled in for the run's device and compile mode."""
    t = spec.training
    b = t.batch
    # The modes that capture CUDA graphs replay one graph per shape: keep the shapes few. Otherwise
    # padding is computed for nothing (a compiled step takes every shape with one dynamic graph, and
    # the matrix products' large dimension is rows × length either way): bench/padding.py measures
    # 1.10 positions per real token on Multi30k at the longest sentence, 1.32 at multiples of 8.
    graphs = t.compile in ("reduce-overhead", "max-autotune")
    multiple = b.length_multiple if b.length_multiple is not None else 8 if graphs else 1
    static = b.static_rows if b.static_rows is not None else graphs
    return BatchShapes(multiple, tuple(b.length_buckets) if b.length_buckets else None, static)


class EpochPlan(Sequence[list[int]]):
    """One epoch's batches as three arrays: the examples in length order, where each batch starts in
    it, and the batches' shuffled order. A batch becomes a list of example indices only when it is
    read, so planning millions of pairs builds no list per batch, and a rank's share
    (`plan[rank::world_size]`) is a view of the same arrays."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray, shuffled: np.ndarray):
        self.order, self.bounds, self.shuffled = order, bounds, shuffled

    def __len__(self) -> int:
        return len(self.shuffled)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...
    @overload
    def __getitem__(self, i: slice) -> EpochPlan: ...
    def __getitem__(self, i: int | slice) -> list[int] | EpochPlan:
        if isinstance(i, slice):
            return EpochPlan(self.order, self.bounds, self.shuffled[i])
        batch = int(self.shuffled[i])
        indices: list[int] = self.order[self.bounds[batch]:self.bounds[batch + 1]].tolist()
        return indices

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        # As lists of batches compare: the tests hold plans to lists.
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == list(b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EpochPlan({len(self)} batches of {len(self.order)} examples)"


def plan_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    seed: int,
    epoch: int,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    world_size: int = 1,
    shapes: BatchShapes = EXACT,
) -> EpochPlan:
    """All batches of one epoch (every rank's), each a list of example indices.

    Examples are sorted by length with random tie-breaking, packed greedily so
    that a batch's padded size (sentences × (longest source + longest target),
    each length padded as `shapes` says) stays within `max_tokens`, and the
    batches are shuffled. The count is cut to a multiple of `world_size` so that
    every rank takes the same number of steps.
    """
    if (max_tokens is None) == (max_sentences is None):
        raise ValueError("give exactly one of max_tokens or max_sentences")
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    n = len(src_lengths)
    rng = np.random.default_rng([seed, epoch])
    order, src_sorted, tgt_sorted = _length_sorted(src_lengths, tgt_lengths, rng)

    if max_tokens is not None:
        # Padding is monotone, so the padded running maximum is the running maximum of the padded lengths.
        starts = _token_batch_starts(shapes.length(src_sorted), shapes.length(tgt_sorted), max_tokens)
    else:
        starts = list(range(0, n, cast(int, max_sentences)))  # the check above: max_tokens is None
    bounds = np.asarray(starts + [n], dtype=np.int64)
    shuffled = rng.permutation(len(starts))
    return EpochPlan(order, bounds, shuffled[:len(shuffled) - len(shuffled) % world_size])


def _length_sorted(src: np.ndarray, tgt: np.ndarray, rng: np.random.Generator,
                   carry_index: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices sorted by longer side, then shorter side, then a random permutation drawn from
    `rng` (`rng.permutation(n)`, np.lexsort's order over the three); and both sides' lengths in that
    order.

    At millions of pairs random access is what costs, so each pair is packed into one 64-bit word,
    (longer, shorter) key above its noise above a flag for which side is longer, and the words are
    sorted by numpy's vectorised sort: no argsort, and the sorted lengths come out of the words with
    no gather. Where the bits allow (at 16M pairs, sentences up to 180 tokens), the index rides in
    the word too, between noise and flag; otherwise it is found from the noise through the inverse
    permutation (one scatter and one gather). The words are built and read in slices. The
    permutation is numpy's own 64-bit one (numpy shuffles 64-bit items faster than 32-bit ones) and
    is freed once it is in the words, so the peak is the words and the three results: 20 bytes a
    pair, 24 where the index comes from the inverse."""
    n = len(src)
    noise = rng.permutation(n)
    lowest, span = (min(int(src.min()), int(tgt.min())), max(int(src.max()), int(tgt.max())) + 1) if n else (0, 0)
    if not n or n >= 2**31 or lowest < 0 or span > 1 << 16:
        by_length = np.lexsort((noise, np.minimum(src, tgt), np.maximum(src, tgt)))
        return by_length, src[by_length], tgt[by_length]
    bits = max(1, (n - 1).bit_length())
    if carry_index is None:
        carry_index = (span * span - 1).bit_length() + 2 * bits + 1 <= 64
    carry = bits if carry_index else 0  # key ≤ 32 bits, noise ≤ 31, flag 1: the word holds them
    words = np.empty(n, dtype=np.uint64)
    for lo in range(0, n, _SLICE):
        s, t = src[lo:lo + _SLICE], tgt[lo:lo + _SLICE]
        word = np.maximum(s, t).astype(np.uint64)
        word *= np.uint64(span)
        word += np.minimum(s, t).astype(np.uint64)
        word <<= np.uint64(bits)
        word |= noise[lo:lo + _SLICE].astype(np.uint64)
        if carry:
            word <<= np.uint64(carry)
            word |= np.arange(lo, lo + len(word), dtype=np.uint64)
        word <<= np.uint64(1)
        word |= s < t
        words[lo:lo + _SLICE] = word
    by_noise = None
    if not carry:
        # The words will hold each place's noise: the example with that noise is the inverse's.
        by_noise = np.empty(n, dtype=np.int32)
        by_noise[noise] = np.arange(n, dtype=np.int32)
    del noise
    words.sort()
    order = np.empty(n, dtype=np.int32)
    src_sorted, tgt_sorted = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)
    mask, shift = np.uint64((1 << bits) - 1), np.uint64(bits + carry + 1)
    for lo in range(0, n, _SLICE):
        word = words[lo:lo + _SLICE]
        order[lo:lo + _SLICE] = (word >> np.uint64(1)) & mask
        longer, shorter = np.divmod((word >> shift).astype(np.uint32), np.uint32(span))
        tgt_longer = (word & np.uint64(1)).astype(bool)
        src_sorted[lo:lo + _SLICE] = np.where(tgt_longer, shorter, longer)
        tgt_sorted[lo:lo + _SLICE] = np.where(tgt_longer, longer, shorter)
    del words
    return (order if by_noise is None else by_noise[order]), src_sorted, tgt_sorted


def _token_batch_starts(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[int]:
    """Where each batch starts when examples, in this order, are packed greedily: a batch takes the
    next example while (its sentences + 1) × (longest source + longest target, the new one included)
    stays within max_tokens; its first example always fits.

    The packing is sequential, but no step is taken per example. A batch's cost only grows as it
    takes examples, so a batch from `begin` has size g exactly when g examples fit and g + 1 do not.
    Sorted by length, consecutive batches mostly have the size of the one before: many of them are
    checked at once (one reshape and two maxima over g-wide rows), and the run of those that have it
    is taken whole. Where the size changes, one batch is found by a search over a window after its
    start (running maxima, costs, the first one over the budget). An epoch's plan at tens of
    millions of pairs takes well under a second here."""
    # 32- and 64-bit lengths are used as they are (no copy of millions); narrower or unsigned ones
    # could overflow a sum. Sizes are int64, so every cost is computed in int64.
    src, tgt = (a if a.dtype in (np.int32, np.int64) else a.astype(np.int64) for a in (np.asarray(src), np.asarray(tgt)))
    n, starts, begin, window, size, run = len(src), [], 0, 64, 0, 64
    while begin < n:
        if size > 1:
            # How many of the next batches (at most `run`) are `size` long, checked together. The
            # example after each must exist, so the last batch or two are left to the search.
            count = min(run, (n - begin - 1) // size)
            if count:
                rows = begin + np.arange(count + 1) * size
                width = (src[begin:rows[-1]].reshape(count, size).max(axis=1),
                         tgt[begin:rows[-1]].reshape(count, size).max(axis=1))
                fits = np.int64(size) * (width[0] + width[1]) <= max_tokens
                nxt = rows[1:]
                one_more = (np.int64(size) + 1) * (np.maximum(width[0], src[nxt]) + np.maximum(width[1], tgt[nxt])) \
                    > max_tokens
                good = fits & one_more
                taken = count if good.all() else int(np.argmin(good))
                starts.extend(rows[:taken].tolist())
                begin += taken * size
                run = min(run * 2, 8192) if taken == count else 64
                if taken == count:
                    continue
        # The search: the batch from `begin`, whatever its size.
        while True:
            end = min(n, begin + window)
            cost = np.arange(1, end - begin + 1) * (np.maximum.accumulate(src[begin:end])
                                                   + np.maximum.accumulate(tgt[begin:end]))
            over = np.flatnonzero(cost[1:] > max_tokens)
            if over.size or end == n:
                break
            window *= 2  # the batch is longer than the window: look further
        size = int(over[0]) + 1 if over.size else end - begin
        starts.append(begin)
        begin += size
        window = max(64, 2 * size)  # sorted by length, the next batch is about as long
    return starts


def rank_batches(plan: EpochPlan, rank: int, world_size: int) -> EpochPlan:
    return plan[rank::world_size]


@dataclass(frozen=True)
class Collation:
    """How batches are padded, and what is counted while each is made (in the loader process)."""

    pad_id: int
    shapes: BatchShapes = EXACT
    max_tokens: int | None = None
    max_sentences: int | None = None
    # (source lengths, target lengths) -> training FLOPs of the pairs, or None for 0.
    flops: Callable[[np.ndarray, np.ndarray], float] | None = None

    def __call__(self, corpus: Corpus, indices: list[int]) -> dict[str, torch.Tensor]:
        """Pad one batch. Returns model inputs plus its counts (not model inputs): `counts` is
        (source + target tokens, target tokens, sentences, training FLOPs) of the real pairs.
        Counting here, in the loader process, keeps the per-step Python out of the training process.

        Each side is gathered in a few numpy operations, not row by row: the host's part of a batch
        must stay far below a fast step's time."""
        src, src_lengths = _gather(corpus.sources, indices)
        tgt, tgt_lengths = _gather(corpus.targets, indices)
        ls, lt = self.shapes.length(int(src_lengths.max())), self.shapes.length(int(tgt_lengths.max()))
        rows = self.shapes.rows(len(indices), ls, lt, self.max_tokens, self.max_sentences)
        input_ids, attention = _pad(src, src_lengths, rows, ls, self.pad_id)
        labels, _ = _pad(tgt, tgt_lengths, rows, lt, IGNORE_INDEX)
        counts = [float(src_lengths.sum() + tgt_lengths.sum()), float(tgt_lengths.sum()), float(len(indices)),
                  self.flops(src_lengths, tgt_lengths) if self.flops is not None else 0.0]
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
            "counts": torch.tensor(counts, dtype=torch.float64),
        }


def collate(corpus: Corpus, indices: list[int], pad_id: int,
            flops: Callable[[np.ndarray, np.ndarray], float] | None = None) -> dict[str, torch.Tensor]:
    """One batch padded to its longest sentences (Collation, with nothing else set)."""
    return Collation(pad_id, flops=flops)(corpus, indices)


# `side`: a list of id lists, or a shards.Ragged (which data/ may not import).
def _gather(side: Any, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(the sequences `indices` of one side end to end as int64, their lengths)."""
    if hasattr(side, "offsets"):  # shards.Ragged: ids end to end in a memory map, read with one gather
        picked = np.asarray(indices, dtype=np.int64)
        starts = np.asarray(side.offsets[picked], dtype=np.int64)
        lengths = np.asarray(side.offsets[picked + 1], dtype=np.int64) - starts
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return np.asarray(side.ids[np.repeat(starts, lengths) + within], dtype=np.int64), lengths
    seqs = [side[i] for i in indices]
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum())), lengths


def _pad(flat: np.ndarray, lengths: np.ndarray, rows: int, width: int, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows × width array of the sequences, left-aligned, `fill` after them; its 0/1 mask)."""
    mask = np.zeros((rows, width), dtype=np.int64)
    mask[: len(lengths)] = np.arange(width) < lengths[:, None]
    out = np.full((rows, width), fill, dtype=np.int64)
    out[mask.astype(bool)] = flat  # row-major order is the order the sequences were laid end to end
    return out, mask


class BatchLoader(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """One item = one collated batch; lets a DataLoader prefetch and pin memory."""

    def __init__(self, corpus: Corpus, batches: Sequence[list[int]], collation: Collation) -> None:
        self.corpus, self.batches, self.collation = corpus, batches, collation

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.collation(self.corpus, self.batches[i])


def iterate(corpus: Corpus, batches: Sequence[list[int]], collation: Collation, start: int = 0,
            pin_memory: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """Batches from position `start` on, collated (and counted, see collate) in a background worker."""
    remaining = BatchLoader(corpus, batches[start:], collation)
    if not len(remaining):
        return iter(())
    # A DataLoader draws its workers' base seed from the global RNG when it starts an iterator,
    # unless it has its own generator. That draw would shift dropout masks after a resume (the
    # iterator starts at a different point in the RNG stream), breaking exact continuation.
    loader = iter(torch.utils.data.DataLoader(
        remaining, batch_size=None, shuffle=False, num_workers=1, prefetch_factor=4,
        pin_memory=pin_memory, persistent_workers=False, generator=torch.Generator(),
        worker_init_fn=_ignore_termination,
    ))
    return _settled(loader)


def _settled(loader: Iterator[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches; once it ends, its queues' feeder threads have ended too.

    A finished DataLoader closes its index queue, whose feeder thread then exits on its own, a few
    milliseconds later. The next epoch's loader forks its worker at once: a fork while another thread
    is ending can leave the child waiting forever on the lock of CPython's thread list
    (python/cpython#112275, fixed in later releases; Debian 12's 3.11.2 has it), and the whole gang
    then waits on that rank. Joining the feeder first leaves no thread mid-exit at the next fork."""
    try:
        yield from loader
    finally:
        shutdown = getattr(loader, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # idempotent: ends the worker and closes the queues, if the epoch did not
        for queue in getattr(loader, "_index_queues", ()):
            feeder = getattr(queue, "_thread", None)
            if feeder is not None:
                feeder.join(timeout=10)


def _ignore_termination(worker_id: int) -> None:
    # torchrun stops a worker by signalling its whole process group, the loader process
    # included. The trainer answers SIGTERM by finishing its step and checkpointing, which
    # needs the loader alive; the loader still exits with its parent.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
