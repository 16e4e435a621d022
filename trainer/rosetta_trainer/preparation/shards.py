"""Training token ids written once per corpus and tokenizer, memory-mapped by every rank.

Tokenizing a corpus into Python lists of ints costs about 4.5 GiB per million pairs in every
rank, and the same minutes of tokenizing at every restart. Here the ids are tokenized once, in
parallel across the cores, into compact arrays (fairseq's binarized data, Megatron's indexed
datasets), and every rank maps the same files: the operating system's page cache holds one
copy per node, however many ranks read it.

One directory per corpus, tokenizer and settings, `<output>/prepared/<key>/`:

    source_ids.npy       every source's ids, end to end (uint16 when the vocabulary fits, else uint32)
    source_offsets.npy   int64, len + 1: source i is source_ids[offsets[i]:offsets[i + 1]]
    target_ids.npy, target_offsets.npy   the same for the targets
    meta.json            pairs, tokens, dtype and what the key was made of
    COMPLETE             written last

The key hashes what decides the ids: the training pairs' text exactly as it is tokenized
(after spec.data.checks' filters, with the task prefixes), the tokenizer (its full definition,
not its path), the maximum lengths and FORMAT_VERSION. Hashing the checked text rather than
the data files' size and mtime keys every source format alike (files, `generated`, Hugging Face
datasets), follows every setting that changes the text without a list to keep in sync, and is
not fooled by a copy (a new mtime, the same content) or an in-place edit within the file
system's mtime resolution.

The text streams: the one process that writes reads and checks it (data_checks.TrainingText),
hashes it and hands it to the tokenizing workers a few chunks at a time, appending their ids and
offsets to the files (shard_writer.py), so its memory does not grow with the corpus and the other
ranks read no training text at all. The key is known once the last pair is read, so the directory is written under a hidden
temporary name and renamed to it. When a complete directory of the same tokenizer and lengths is
there already (the same data copied anew, say), the text is hashed first, without tokenizing,
and that directory is mapped if the key names it.

So that a restart need not read the text again, a directory also holds one `source-<hash>.json`
per identity of the data files it was made from (data_identity.py: spec.data and each file's
size and mtime, with the tokenizer and lengths), with the training split's report;
`find_prepared` maps the directory such a file names and no rank reads the training text.

A directory is renamed into place only once its COMPLETE marker is on disk, so a crash mid-write
leaves nothing that is ever mapped. Exactly one process writes: rank 0, or when ranks on several
nodes do not share the output directory, local rank 0 of each node (their keys must agree); the
others wait for it and map the result. An error in the writer (a bad file found midway) is sent
to every rank, which raises it alike.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, cast, runtime_checkable

import numpy as np

# The writing half lives in shard_writer.py; its names are this module's too, as callers know them.
from rosetta_trainer.preparation.shard_writer import (  # noqa: F401
    CHUNK_PAIRS,
    FORMAT_VERSION,
    HEADER_BYTES,
    MARKER,
    PARALLEL_MIN_PAIRS,
    SIDES,
    TextHash,
    content_key,
    corpus_key,
    default_workers,
    flatten,
    id_dtype,
    is_complete,
    tokenize,
    tokenizer_fingerprint,
    write,
)
from rosetta_trainer.runtime.cpu_allocator import give_back_freed_memory
from rosetta_trainer.runtime.distributed import (
    World,
    all_gather_objects,
    barrier,
    broadcast_object,
    failure,
    raise_failures,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PREPARED_DIR = "prepared"  # under the run's output directory
_SHARED_PROBE = ".shared-probe-"

log = logging.getLogger(__name__)


LENGTHS_SLICE = 1 << 20


class Ragged:
    """Sequences stored end to end: `ragged[i]` is sequence i, a (memory-mapped) numpy view."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        """Each sequence's length in 32 bits (a sequence is one sentence's tokens): a training holds
        them for every epoch's plan, and np.diff of the 64-bit offsets would take twice the memory
        and a 64-bit copy of the whole. Taken a slice at a time."""
        out = np.empty(len(self), dtype=np.int32)
        for start in range(0, len(out), LENGTHS_SLICE):
            stop = min(start + LENGTHS_SLICE, len(out))
            np.subtract(self.offsets[start + 1:stop + 1], self.offsets[start:stop], out=out[start:stop], casting="unsafe")
        return out


class ShardedCorpus:
    """What batching.EncodedCorpus offers (len, `.sources[i]`, `.targets[i]`, `lengths()`), read
    from a prepared directory through memory maps."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = json.loads((self.path / "meta.json").read_text())
        self.sources, self.targets = (
            Ragged(np.load(self.path / f"{side}_ids.npy", mmap_mode="r"),
                   np.load(self.path / f"{side}_offsets.npy", mmap_mode="r")) for side in SIDES)

    def __len__(self) -> int:
        return len(self.sources)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        return self.sources.lengths(), self.targets.lengths()

    def __reduce__(self) -> tuple[type[ShardedCorpus], tuple[str]]:
        # A loader process started by spawn reopens the maps rather than receiving a copy.
        return (ShardedCorpus, (str(self.path),))


@runtime_checkable
class ReportingPairs(Protocol):
    """Training pairs that count what their reading kept and dropped (data_checks.TrainingPairs):
    the report comes back with the prepared data, and is recorded beside it."""

    def __iter__(self) -> Iterator[tuple[str, str]]: ...

    def report(self) -> dict[str, Any]: ...


# A writer's temporary directory older than this was left by a crash, not by a write in progress.
STALE_SECONDS = 3600


def prune(root: Path, keep: str) -> int:
    """Remove what `root` holds besides the directory `keep`: prepared directories of an earlier
    corpus, tokenizer or settings (superseded: a run keys its data afresh at every start), and what
    crashed writers left. Bytes freed. A directory that went from the training's shared volume
    would otherwise stay there, one per data change, each as large as the corpus' ids."""
    freed = 0
    now = time.time()
    for entry in Path(root).iterdir():
        if entry.name == keep or not entry.is_dir() or entry.name.startswith(_SHARED_PROBE):
            continue
        hidden = entry.name.startswith((".tmp-", ".stale-"))
        if hidden and now - entry.stat().st_mtime < STALE_SECONDS:
            continue  # perhaps another node's write in progress
        if not hidden and not is_complete(entry) and now - entry.stat().st_mtime < STALE_SECONDS:
            continue
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            freed += size
            log.info("removed %s (%.1f MB): %s", entry, size / 1e6,
                     "left by a crashed write" if hidden else "prepared for other data or another tokenizer")
    return freed


def _shared_between_nodes(root: Path, world: World) -> bool:
    """Collective: whether every rank sees `root` as one directory (rank 0 writes a probe file)."""
    token = cast(str, broadcast_object(world, secrets.token_hex(16) if world.is_main else None))  # rank 0's
    probe = root / f"{_SHARED_PROBE}{token}"
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    barrier(world)
    deadline = time.monotonic() + 3.0  # a network file system may show a new file a moment later
    while not (seen := _holds(probe, token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    views = all_gather_objects(world, (seen, socket.gethostname()))
    if world.is_main:
        probe.unlink(missing_ok=True)
    return all(ok for ok, _ in views)


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False


def _identity_file(identity: str, fingerprint: str, max_source: int, max_target: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": FORMAT_VERSION, "data": identity, "max_source": max_source,
                         "max_target": max_target, "tokenizer": fingerprint}).encode())
    return f"source-{h.hexdigest()}.json"


def _record_identity(directory: Path, name: str, train_report: dict[str, Any] | None) -> None:
    tmp = directory / f".{name}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps({"train": train_report}, indent=1) + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    tmp.rename(directory / name)


def find_prepared(root: Path, identity: str | None, tokenizer: PreTrainedTokenizerBase, max_source: int,
                  max_target: int, world: World) -> tuple[ShardedCorpus, dict[str, Any]] | None:
    """Collective: the prepared directory made from data files of this identity with this
    tokenizer and these lengths, mapped, with the training split's report as it was when the
    text was read; None (on every rank) unless every rank can map it."""
    started = time.monotonic()
    name = _identity_file(identity, tokenizer_fingerprint(tokenizer), max_source, max_target) if identity else None
    found: tuple[str, dict[str, Any]] | None = None
    if world.is_main and name:
        for record in sorted(Path(root).glob(f"*/{name}")):
            if not record.parent.name.startswith(".") and is_complete(record.parent):
                try:
                    report = json.loads(record.read_text())["train"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if isinstance(report, dict) and {"read", "kept"} <= report.keys():
                    found = (record.parent.name, report)
                    break
    found = broadcast_object(world, found)
    here = found is not None and is_complete(Path(root) / found[0])
    if found is None or not all(all_gather_objects(world, here)):  # another node's disk may lack it
        return None
    key, report = found
    directory = Path(root) / key
    corpus = ShardedCorpus(directory)
    log.info("training data: mapped prepared %d pairs from %s in %.1fs, the data files unchanged since "
             "they were prepared: the training text was not read", corpus.meta["pairs"], directory,
             time.monotonic() - started)
    return corpus, report


def _holds_prepared(root: Path, fingerprint: str, max_source: int, max_target: int) -> bool:
    """Whether `root` has a complete directory of this tokenizer and these lengths, which the
    text, once hashed, might name."""
    for meta_file in Path(root).glob("*/meta.json"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        if (is_complete(meta_file.parent) and meta.get("format") == FORMAT_VERSION
                and meta.get("tokenizer") == fingerprint and meta.get("max_source_length") == max_source
                and meta.get("max_target_length") == max_target):
            return True
    return False


def _prepare_here(root: Path, tokenizer: PreTrainedTokenizerBase, fingerprint: str,
                  pairs: Iterable[tuple[str, str]], max_source: int, max_target: int,
                  workers: int | None) -> tuple[str, bool]:
    """(key, whether it was written): the directory these pairs name, written unless it is there.
    When it might be (same tokenizer and lengths, other text or the same), the text is hashed
    first, a pass that reads without tokenizing; else it is hashed while it is tokenized."""
    if _holds_prepared(root, fingerprint, max_source, max_target):
        key = content_key(pairs, fingerprint, max_source, max_target)
        if is_complete(root / key):
            return key, False
    key = write(root, tokenizer, pairs, max_source, max_target, workers=workers, fingerprint=fingerprint).name
    prune(root, keep=key)
    return key, True


def prepare_corpus(root: Path, tokenizer: PreTrainedTokenizerBase, pairs: Iterable[tuple[str, str]], max_source: int,
                   max_target: int, world: World, *, workers: int | None = None,
                   identity: str | None = None) -> tuple[ShardedCorpus, dict[str, Any] | None]:
    """Collective: the prepared directory for these (source, target) pairs under `root`, written
    by one process when it is missing, then mapped by every rank; with the training split's
    report.

    Only the writing process iterates `pairs` (a list, or data_checks.TrainingPairs, which reads
    and checks the files as it goes; it may be iterated twice): the other ranks read no training
    text. When `pairs` are ReportingPairs, rank 0's is returned to every rank and, with `identity`
    (data_identity.py), recorded so that `find_prepared` finds the directory without the text."""
    started = time.monotonic()
    root = Path(root)
    shared = not world.spans_nodes or _shared_between_nodes(root, world)
    outcome: dict[str, Any] | None = None
    if world.is_main if shared else world.local_rank == 0:
        try:
            # One fingerprint for the key, the write and the identity file: for a tokenizer
            # without a fast backend it is a save_pretrained into a temporary directory.
            fingerprint = tokenizer_fingerprint(tokenizer)
            key, wrote = _prepare_here(root, tokenizer, fingerprint, pairs, max_source, max_target, workers)
            report = pairs.report() if isinstance(pairs, ReportingPairs) else None
            if identity:
                _record_identity(root / key, _identity_file(identity, fingerprint, max_source, max_target), report)
            outcome = {"key": key, "wrote": wrote, "report": report}
        except Exception as exc:  # every rank must hear of it, not wait for a directory forever
            if not world.distributed:
                raise
            outcome = {"failure": failure(exc, world.rank, f"write {root}")}
    outcomes = all_gather_objects(world, outcome)  # also every rank's wait for the writers
    raise_failures([o["failure"] for o in outcomes if o and "failure" in o])
    keys = sorted({o["key"] for o in outcomes if o})
    if len(keys) > 1:  # each node read its own copy of the files, and the copies differ
        raise RuntimeError(f"the nodes' training data differ: their prepared directories under {root} are "
                           f"{', '.join(keys)}; give every node the same files")
    first = cast("dict[str, Any]", outcomes[0])  # rank 0 always writes
    corpus = ShardedCorpus(root / keys[0])
    meta = corpus.meta
    wrote = bool(outcome and outcome["wrote"])  # by this process
    if wrote:
        # The reading, the duplicate filter and the batches sent to the tokenizing processes are
        # freed now; the training's own allocations would not reuse most of that heap.
        give_back_freed_memory()
    log.info("training data: %s %d pairs (%d source + %d target tokens, %s) %s %s in %.1fs",
             "tokenized and wrote" if wrote else "mapped prepared", meta["pairs"],
             meta["tokens"]["source"], meta["tokens"]["target"], meta["dtype"],
             "to" if wrote else "from", corpus.path, time.monotonic() - started)
    return corpus, first["report"]
