"""Writing a prepared directory (shards.py says what it holds and who maps it): the pairs'
text streamed through tokenizing worker processes, their ids and offsets appended to the files as
each chunk comes back, the key hashed from the text on the way.

Nothing is kept per pair: the ids and the offsets go to disk a chunk at a time, the .npy headers
written last, over placeholders of the same size, so the writer's memory is a few chunks of text
and ids whatever the corpus' size.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import secrets
import shutil
import time
from collections import deque
from contextlib import ExitStack
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Iterator, cast

import numpy as np

from rosetta_trainer.preparation.token_ids import Encoder
from rosetta_trainer.runtime.durable_files import fsync_tree

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# 2: the key hashes each side's text and lengths apart, so the text can stream once.
FORMAT_VERSION = 2
MARKER = "COMPLETE"
# Below this many pairs, starting worker processes costs more than it saves.
PARALLEL_MIN_PAIRS = 20_000
CHUNK_PAIRS = 10_000
SIDES = ("source", "target")


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything about `tokenizer` that decides the ids it gives."""
    h = hashlib.blake2b(digest_size=16)
    h.update(type(tokenizer).__name__.encode())
    if getattr(tokenizer, "is_fast", False):
        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        # Set by the last call, not part of the tokenizer: every call passes its own.
        spec.pop("truncation", None)
        spec.pop("padding", None)
        h.update(json.dumps(spec, sort_keys=True).encode())
        h.update(json.dumps(sorted(map(str, tokenizer.get_added_vocab().items()))).encode())
        return h.hexdigest()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rosetta-tokenizer-hash-") as tmp:
        tokenizer.save_pretrained(tmp)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                h.update(path.name.encode())
                h.update(path.read_bytes())
    return h.hexdigest()


class TextHash:
    """The content half of a directory's key, fed the pairs chunk by chunk: each side's texts end
    to end and their lengths (which make the concatenation unambiguous), so the digest does not
    depend on how the pairs were cut into chunks."""

    def __init__(self) -> None:
        self.pairs = 0
        self._parts = [hashlib.blake2b(digest_size=16) for _ in range(4)]

    def update(self, sources: list[str], targets: list[str]) -> None:
        self.pairs += len(sources)
        for (lengths, text), texts in zip((self._parts[:2], self._parts[2:]), (sources, targets)):
            lengths.update(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)).tobytes())
            text.update("".join(texts).encode("utf-8", "surrogatepass"))

    def key(self, fingerprint: str, max_source: int, max_target: int) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(json.dumps({"format": FORMAT_VERSION, "pairs": self.pairs, "max_source": max_source,
                             "max_target": max_target, "tokenizer": fingerprint}).encode())
        for part in self._parts:
            h.update(part.digest())
        return h.hexdigest()


def _chunks(pairs: Iterable[tuple[str, str]], size: int,
            text_hash: TextHash | None = None) -> Iterator[tuple[list[str], list[str]]]:
    it = iter(pairs)
    while block := list(islice(it, size)):
        sources, targets = [s for s, _ in block], [t for _, t in block]
        if text_hash is not None:
            text_hash.update(sources, targets)
        yield sources, targets


def corpus_key(pairs: Iterable[tuple[str, str]], tokenizer: PreTrainedTokenizerBase, max_source: int, max_target: int) -> str:
    """The directory name for these (source, target) pairs tokenized by `tokenizer` (see the
    module docstring): one pass over the text, nothing tokenized, nothing held."""
    return content_key(pairs, tokenizer_fingerprint(tokenizer), max_source, max_target)


def content_key(pairs: Iterable[tuple[str, str]], fingerprint: str, max_source: int, max_target: int) -> str:
    text_hash = TextHash()
    for _ in _chunks(pairs, CHUNK_PAIRS, text_hash):
        pass
    return text_hash.key(fingerprint, max_source, max_target)


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)



# What the worker processes share: set in the parent before they fork, so the tokenizer is not
# pickled to them; each receives a chunk of text and returns compact arrays.
_JOB: tuple[Encoder, np.dtype] | None = None

Flat = tuple[np.ndarray, np.ndarray]  # ids end to end, and each sequence's length


def _encode_chunk(chunk: tuple[list[str], list[str]]) -> tuple[Flat, Flat]:
    encoder, dtype = cast("tuple[Encoder, np.dtype]", _JOB)  # set before the pool starts
    sources, targets = chunk
    return flatten(encoder.sources(sources), dtype), flatten(encoder.targets(targets), dtype)


def flatten(seqs: list[list[int]], dtype: np.dtype) -> Flat:
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    if flat.size and (flat.min() < 0 or flat.max() >= np.iinfo(dtype).max + 1):
        raise ValueError(f"token id {int(flat.max())} does not fit {dtype}")
    return flat.astype(dtype), lengths


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def tokenize(tokenizer: PreTrainedTokenizerBase, pairs: Iterable[tuple[str, str]], max_source: int, max_target: int, *,
             workers: int | None = None, chunk: int = CHUNK_PAIRS,
             text_hash: TextHash | None = None) -> Iterator[tuple[Flat, Flat]]:
    """The ids `batching.encode` gives, chunk by chunk in the pairs' order: (source ids and
    lengths, target ids and lengths) per `chunk` pairs, tokenized by `workers` processes (default:
    every core, or this process alone for fewer than PARALLEL_MIN_PAIRS pairs). The pairs are read
    as a stream, a few chunks ahead of the workers, so memory does not grow with the corpus."""
    global _JOB
    chunks = _chunks(pairs, chunk, text_hash)
    ahead: list[tuple[list[str], list[str]]] = []
    read = 0
    for piece in chunks:  # enough to build the encoder and to tell a small corpus
        ahead.append(piece)
        read += len(piece[0])
        if read >= PARALLEL_MIN_PAIRS:
            break
    if not ahead:
        return
    if workers is None:
        workers = default_workers() if read >= PARALLEL_MIN_PAIRS else 1
    _JOB = (Encoder(tokenizer, max_source, max_target, ahead[0]), id_dtype(len(tokenizer)))
    try:
        if workers <= 1:
            for piece in chain(ahead, chunks):
                yield _encode_chunk(piece)
            return
        # Frozen, the parent's objects are never walked (and so never copied) by the workers'
        # collector: 1.4x faster at 4M pairs when the text was inherited (docs/benchmarks.md).
        gc.freeze()
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                pending: deque[Any] = deque()
                for piece in chain(ahead, chunks):
                    pending.append(pool.apply_async(_encode_chunk, (piece,)))
                    if len(pending) >= 2 * workers:  # the reading stays this far ahead, no further
                        yield pending.popleft().get()
                while pending:
                    yield pending.popleft().get()
        finally:
            gc.unfreeze()
    finally:
        _JOB = None


def _npy_header(fh: BinaryIO, dtype: np.dtype, n: int) -> None:
    """A version 1.0 .npy header for n items of `dtype`; always HEADER_BYTES long, so the ids can
    be streamed after a placeholder and the real count written over it at the end."""
    np.lib.format.write_array_header_1_0(
        fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)})
    if fh.tell() != HEADER_BYTES:
        raise AssertionError(f"unexpected .npy header size {fh.tell()}")


HEADER_BYTES = 128
OFFSET_DTYPE = np.dtype(np.int64)


def write(root: Path, tokenizer: PreTrainedTokenizerBase, pairs: Iterable[tuple[str, str]], max_source: int, max_target: int, *,
          workers: int | None = None, chunk: int = CHUNK_PAIRS, fingerprint: str | None = None) -> Path:
    """Tokenize the pairs as they stream and write one prepared directory under `root`,
    atomically; returns it (`root/<key>`). Memory holds a few chunks of text, never the corpus.
    `fingerprint`: the tokenizer's, when the caller has it already."""
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{secrets.token_hex(6)}"
    tmp.mkdir()
    dtype = id_dtype(len(tokenizer))
    try:
        text_hash = TextHash()
        with ExitStack() as files:
            ids_files = {side: files.enter_context(open(tmp / f"{side}_ids.npy", "wb")) for side in SIDES}
            offset_files = {side: files.enter_context(open(tmp / f"{side}_offsets.npy", "wb")) for side in SIDES}
            for fh in ids_files.values():
                _npy_header(fh, dtype, 0)
            for fh in offset_files.values():
                _npy_header(fh, OFFSET_DTYPE, 0)
                fh.write(np.zeros(1, dtype=OFFSET_DTYPE).tobytes())
            tokens = dict.fromkeys(SIDES, 0)
            for encoded in tokenize(tokenizer, pairs, max_source, max_target, workers=workers, chunk=chunk,
                                    text_hash=text_hash):
                for side, (ids, side_lengths) in zip(SIDES, encoded):
                    ids_files[side].write(ids.tobytes())
                    ends = np.cumsum(side_lengths, dtype=OFFSET_DTYPE)
                    ends += tokens[side]
                    offset_files[side].write(ends.tobytes())
                    tokens[side] += len(ids)
            if not text_hash.pairs:
                raise ValueError("no training pairs to prepare")
            for side in SIDES:
                ids_files[side].seek(0)
                _npy_header(ids_files[side], dtype, tokens[side])
                offset_files[side].seek(0)
                _npy_header(offset_files[side], OFFSET_DTYPE, text_hash.pairs + 1)
        fingerprint = fingerprint or tokenizer_fingerprint(tokenizer)
        key = text_hash.key(fingerprint, max_source, max_target)
        directory = root / key
        meta = {"format": FORMAT_VERSION, "key": key, "pairs": text_hash.pairs, "tokens": tokens,
                "dtype": str(dtype), "vocab_size": len(tokenizer), "max_source_length": max_source,
                "max_target_length": max_target, "tokenizer": fingerprint,
                "seconds": round(time.monotonic() - started, 3)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        fsync_tree(tmp)
        (tmp / MARKER).write_text("")
        fsync_tree(tmp)
        if directory.exists() and not is_complete(directory):  # left by a crash or a half copy
            stale = root / f".stale-{directory.name}-{secrets.token_hex(4)}"
            directory.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(directory)
        except OSError:
            if not is_complete(directory):
                raise
            # Another node wrote the same directory first (shared storage): keep theirs.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()
