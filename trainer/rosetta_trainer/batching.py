"""Token-budget batches bucketed by length, deterministic per (seed, epoch).

The plan for an epoch is a pure function of the lengths, the seed and the
epoch number, so a resumed run rebuilds the same plan and skips the batches it
has already consumed: that is what makes resume exact.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

import numpy as np
import torch

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


def plan_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    seed: int,
    epoch: int,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    world_size: int = 1,
) -> list[list[int]]:
    """All batches of one epoch (every rank's), as lists of example indices.

    Examples are sorted by length with random tie-breaking, packed greedily so
    that a batch's padded size (sentences × (longest source + longest target))
    stays within `max_tokens`, and the batches are shuffled. The count is cut to
    a multiple of `world_size` so that every rank takes the same number of steps.
    """
    if (max_tokens is None) == (max_sentences is None):
        raise ValueError("give exactly one of max_tokens or max_sentences")
    n = len(src_lengths)
    rng = np.random.default_rng([seed, epoch])
    noise = rng.permutation(n)
    order = np.lexsort((noise, np.minimum(src_lengths, tgt_lengths), np.maximum(src_lengths, tgt_lengths)))

    batches: list[list[int]] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    # Plain ints in sorted order: indexing numpy arrays one element at a time costs several times
    # more, which at tens of millions of pairs is seconds of every epoch's start.
    sorted_src = np.asarray(src_lengths)[order].tolist()
    sorted_tgt = np.asarray(tgt_lengths)[order].tolist()
    for i, s, t in zip(order.tolist(), sorted_src, sorted_tgt):
        if max_tokens is not None:
            cost = (len(current) + 1) * (max(longest_src, s) + max(longest_tgt, t))
            full = bool(current) and cost > max_tokens
        else:
            full = len(current) >= max_sentences
        if full:
            batches.append(current)
            current, longest_src, longest_tgt = [], 0, 0
        current.append(i)
        longest_src, longest_tgt = max(longest_src, s), max(longest_tgt, t)
    if current:
        batches.append(current)

    shuffled = [batches[j] for j in rng.permutation(len(batches))]
    usable = len(shuffled) - len(shuffled) % world_size
    return shuffled[:usable]


def rank_batches(plan: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    return plan[rank::world_size]


def collate(corpus: EncodedCorpus, indices: list[int], pad_id: int, flops=None) -> dict[str, torch.Tensor]:
    """Pad one batch. Returns model inputs plus its counts (not model inputs): `counts` is
    (source + target tokens, target tokens, sentences, training FLOPs), where `flops` is
    `(source lengths, target lengths) -> FLOPs` or None for 0. Counting here, in the loader
    process, keeps the per-step Python out of the training process."""
    srcs = [corpus.sources[i] for i in indices]
    tgts = [corpus.targets[i] for i in indices]
    b, ls, lt = len(indices), max(map(len, srcs)), max(map(len, tgts))
    input_ids = torch.full((b, ls), pad_id, dtype=torch.long)
    attention = torch.zeros((b, ls), dtype=torch.long)
    labels = torch.full((b, lt), IGNORE_INDEX, dtype=torch.long)
    for row, (s, t) in enumerate(zip(srcs, tgts)):
        input_ids[row, : len(s)] = _ids(s)
        attention[row, : len(s)] = 1
        labels[row, : len(t)] = _ids(t)
    src_lengths, tgt_lengths = [len(s) for s in srcs], [len(t) for t in tgts]
    counts = [sum(src_lengths) + sum(tgt_lengths), sum(tgt_lengths), b,
              flops(src_lengths, tgt_lengths) if flops is not None else 0.0]
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": labels,
        "counts": torch.tensor(counts, dtype=torch.float64),
    }


def _ids(seq) -> torch.Tensor:
    # A prepared corpus (shards.py) gives uint16/uint32 views of a memory map; torch has no
    # general uint16 arithmetic, so widen them here.
    if isinstance(seq, np.ndarray):
        return torch.from_numpy(seq.astype(np.int64))
    return torch.tensor(seq)


class BatchLoader(torch.utils.data.Dataset):
    """One item = one collated batch; lets a DataLoader prefetch and pin memory."""

    def __init__(self, corpus: EncodedCorpus, batches: list[list[int]], pad_id: int, flops=None):
        self.corpus, self.batches, self.pad_id, self.flops = corpus, batches, pad_id, flops

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return collate(self.corpus, self.batches[i], self.pad_id, self.flops)


def iterate(corpus: EncodedCorpus, batches: list[list[int]], pad_id: int, start: int = 0, pin_memory: bool = False,
            flops=None):
    """Batches from position `start` on, collated (and counted, see collate) in a background worker."""
    remaining = BatchLoader(corpus, batches[start:], pad_id, flops)
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
