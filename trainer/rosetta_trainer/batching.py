"""Token-budget batches bucketed by length, deterministic per (seed, epoch).

The plan for an epoch is a pure function of the lengths, the seed and the
epoch number, so a resumed run rebuilds the same plan and skips the batches it
has already consumed: that is what makes resume exact.
"""

from __future__ import annotations

import itertools
import signal
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from rosetta_contract.config import TrainerSpec

IGNORE_INDEX = -100  # labels with this value do not contribute to the loss


@dataclass
class EncodedCorpus:
    """Token ids in memory (shards.ShardedCorpus offers the same from memory-mapped files)."""

    sources: list[list[int]]
    targets: list[list[int]]

    def __len__(self) -> int:
        return len(self.sources)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.fromiter(map(len, self.sources), dtype=np.int64, count=len(self)),
                np.fromiter(map(len, self.targets), dtype=np.int64, count=len(self)))


def encode(tokenizer, sources: list[str], targets: list[str], max_source: int, max_target: int) -> EncodedCorpus:
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

    def length(self, n):
        """The padded length of a batch whose longest sentence is `n` (an int or a numpy array)."""
        if self.buckets is not None:
            buckets = np.asarray(self.buckets)
            padded = buckets[np.minimum(np.searchsorted(buckets, n), len(buckets) - 1)]
            padded = np.maximum(padded, n)  # longer than every bucket (the spec forbids it): its own length
            return padded if isinstance(n, np.ndarray) else int(padded)
        m = self.multiple
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
) -> list[list[int]]:
    """All batches of one epoch (every rank's), as lists of example indices.

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
    noise = rng.permutation(n)
    order = _length_order(src_lengths, tgt_lengths, noise)

    if max_tokens is not None:
        # Padding is monotone, so the padded running maximum is the running maximum of the padded lengths.
        starts = _token_batch_starts(shapes.length(src_lengths[order]), shapes.length(tgt_lengths[order]), max_tokens)
    else:
        starts = list(range(0, n, max_sentences))
    # Plain ints: the loader and the tests take lists; slicing one list is cheaper than a list per array.
    flat = order.tolist()
    batches = [flat[a:b] for a, b in zip(starts, starts[1:] + [n])]

    shuffled = [batches[j] for j in rng.permutation(len(batches))]
    usable = len(shuffled) - len(shuffled) % world_size
    return shuffled[:usable]


def _length_order(src: np.ndarray, tgt: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Indices sorted by longer side, then shorter side, then `noise` (a permutation): np.lexsort's
    order, from one stable sort of a small length key over the indices taken in noise order (ties
    keep that order). Lengths up to 255 make the key 16 bits, which numpy sorts by radix: a few
    times faster than the three-key sort at millions of pairs."""
    longer, shorter = np.maximum(src, tgt).astype(np.int64), np.minimum(src, tgt).astype(np.int64)
    span = int(longer.max(initial=0)) + 1
    by_noise = np.empty(len(noise), dtype=np.int64)
    by_noise[noise] = np.arange(len(noise))
    key = (longer * span + shorter)[by_noise]
    if span * span <= 1 << 16:
        key = key.astype(np.uint16)
    return by_noise[np.argsort(key, kind="stable")]


def _token_batch_starts(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[int]:
    """Where each batch starts when examples, in this order, are packed greedily: a batch takes the
    next example while (its sentences + 1) × (longest source + longest target, the new one included)
    stays within max_tokens; its first example always fits.

    The packing is sequential, but each batch is found with a few numpy passes over a window of the
    examples after its start (running maxima, costs, the first one over the budget), not a Python
    step per example: an epoch's plan at tens of millions of pairs takes a second or two, not tens."""
    src, tgt = np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64)
    n, starts, begin, window = len(src), [], 0, 64
    while begin < n:
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


def rank_batches(plan: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
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

    def __call__(self, corpus: EncodedCorpus, indices: list[int]) -> dict[str, torch.Tensor]:
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


def collate(corpus: EncodedCorpus, indices: list[int], pad_id: int, flops=None) -> dict[str, torch.Tensor]:
    """One batch padded to its longest sentences (Collation, with nothing else set)."""
    return Collation(pad_id, flops=flops)(corpus, indices)


def _gather(side, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
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


class BatchLoader(torch.utils.data.Dataset):
    """One item = one collated batch; lets a DataLoader prefetch and pin memory."""

    def __init__(self, corpus: EncodedCorpus, batches: list[list[int]], collation: Collation):
        self.corpus, self.batches, self.collation = corpus, batches, collation

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.collation(self.corpus, self.batches[i])


def iterate(corpus: EncodedCorpus, batches: list[list[int]], collation: Collation, start: int = 0,
            pin_memory: bool = False):
    """Batches from position `start` on, collated (and counted, see collate) in a background worker."""
    remaining = BatchLoader(corpus, batches[start:], collation)
    if not len(remaining):
        return iter(())
    # A DataLoader draws its workers' base seed from the global RNG when it starts an iterator,
    # unless it has its own generator. That draw would shift dropout masks after a resume (the
    # iterator starts at a different point in the RNG stream), breaking exact continuation.
    return iter(torch.utils.data.DataLoader(
        remaining, batch_size=None, shuffle=False, num_workers=1, prefetch_factor=4,
        pin_memory=pin_memory, persistent_workers=False, generator=torch.Generator(),
        worker_init_fn=_ignore_termination,
    ))


def _ignore_termination(worker_id: int) -> None:
    # torchrun stops a worker by signalling its whole process group, the loader process
    # included. The trainer answers SIGTERM by finishing its step and checkpointing, which
    # needs the loader alive; the loader still exits with its parent.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
