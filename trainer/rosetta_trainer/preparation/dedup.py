"""The duplicate filter's memory of the training pairs it has seen: 8 bytes per distinct pair.

Each pair is known by the same 8-byte blake2b digest of (target language, source, target) as
before, so the filter keeps and drops exactly the pairs it did. What changed is where the digests
live: a Python set of bytes objects costs about 85 bytes per distinct pair (the object, its
hash-table slot and the table's spare room), 1.3 GiB at 16M pairs; here they are uint64 values in
a few sorted numpy arrays, looked up and added a batch at a time.

The arrays are runs of sorted digests whose sizes fall geometrically, as in a log-structured
merge tree: a batch's new digests become a run, and a run is merged into the one before it while
it is at least half its size. That keeps about log2(pairs / batch) runs, each batch's lookup is a
binary search in each, and every digest is merged about log2 times in all. Merging two sorted
runs is a concatenation and a stable sort (timsort, which finds the two runs and merges them in
one linear pass). At its peak, while the largest runs merge, the filter holds 16 bytes per
distinct pair.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np

T = TypeVar("T")

BATCH = 8192


def pair_digest(language: str, source: str, target: str) -> bytes:
    # blake2b rather than hash() so that every rank (own hash seed) keeps the same pairs.
    return hashlib.blake2b(f"{language}\0{source}\0{target}".encode(), digest_size=8).digest()


class SeenDigests:
    """A set of uint64 digests, added to and asked a batch at a time."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []  # sorted, unique, sizes falling

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    @property
    def nbytes(self) -> int:
        return sum(run.nbytes for run in self.runs)

    def first_seen(self, digests: np.ndarray) -> np.ndarray:
        """Which of `digests` (uint64, in the pairs' order) were seen neither before this call nor
        earlier in it: the first occurrence of each new digest. They are remembered."""
        unique, first = np.unique(digests, return_index=True)  # `first`: each value's first position
        new = np.ones(len(unique), dtype=bool)
        for run in self.runs:
            at = np.searchsorted(run, unique)
            at[at == len(run)] = 0
            new &= run[at] != unique
        keep = np.zeros(len(digests), dtype=bool)
        keep[first[new]] = True
        self._add(unique[new])
        return keep

    def _add(self, fresh: np.ndarray) -> None:
        if not len(fresh):
            return
        self.runs.append(fresh)
        while len(self.runs) > 1 and 2 * len(self.runs[-1]) >= len(self.runs[-2]):
            newer = self.runs.pop()
            older = self.runs.pop()
            merged = np.concatenate((older, newer))
            del older, newer  # freed before the sort's buffer is taken
            merged.sort(kind="stable")
            self.runs.append(merged)


def first_occurrences(items: Iterable[T], key: Callable[[T], bytes], seen: SeenDigests,
                      batch: int = BATCH) -> Iterator[tuple[T, bool]]:
    """(item, whether its key's digest is new) for each item, in order: kept at the first
    occurrence, across calls sharing `seen`. Items are held `batch` at a time, so they come out
    in bursts."""
    held: list[T] = []
    digests: list[bytes] = []
    for item in items:
        held.append(item)
        digests.append(key(item))
        if len(held) >= batch:
            yield from zip(held, seen.first_seen(np.frombuffer(b"".join(digests), dtype="<u8")).tolist())
            held, digests = [], []
    if held:
        yield from zip(held, seen.first_seen(np.frombuffer(b"".join(digests), dtype="<u8")).tolist())
