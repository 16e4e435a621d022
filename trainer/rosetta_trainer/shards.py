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
system's mtime resolution; it costs one pass over text that was just read.

Hashing the text needs the text, read and checked on every rank. So that a restart need not
read it again, a directory also holds one `source-<hash>.json` per identity of the data files it
was made from (data_identity.py: spec.data and each file's size and mtime, with the tokenizer and
lengths), with the training split's report; `find_prepared` maps the directory such a file names
and no rank reads the training text.

A directory is written under a hidden temporary name and renamed into place once its COMPLETE
marker is on disk, so a crash mid-write leaves nothing that is ever mapped. Exactly one process
writes: rank 0, or when ranks on several nodes do not share the output directory, local rank 0
of each node; the others wait for it and map the result.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import socket
import time
from itertools import chain
from pathlib import Path

import numpy as np

from rosetta_trainer.token_ids import Encoder

FORMAT_VERSION = 1
MARKER = "COMPLETE"
PREPARED_DIR = "prepared"  # under the run's output directory
# Below this many pairs, starting worker processes costs more than it saves.
PARALLEL_MIN_PAIRS = 20_000
CHUNK_PAIRS = 10_000
SIDES = ("source", "target")
_SHARED_PROBE = ".shared-probe-"

log = logging.getLogger(__name__)


class Ragged:
    """Sequences stored end to end: `ragged[i]` is sequence i, a (memory-mapped) numpy view."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


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

    def __reduce__(self):
        # A loader process started by spawn reopens the maps rather than receiving a copy.
        return (ShardedCorpus, (str(self.path),))


def tokenizer_fingerprint(tokenizer) -> str:
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


def corpus_key(sources: list[str], targets: list[str], tokenizer, max_source: int, max_target: int) -> str:
    """The directory name for these pairs tokenized by `tokenizer` (see the module docstring)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": FORMAT_VERSION, "pairs": len(sources), "max_source": max_source,
                         "max_target": max_target, "tokenizer": tokenizer_fingerprint(tokenizer)}).encode())
    for texts in (sources, targets):
        for start in range(0, len(texts), CHUNK_PAIRS):
            chunk = texts[start:start + CHUNK_PAIRS]
            # The lengths make the concatenation unambiguous.
            h.update(np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk)).tobytes())
            h.update("".join(chunk).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


# The job the worker processes share: set in the parent before they fork, so neither the
# tokenizer nor the text is pickled to them, and each gets back only compact arrays.
_JOB: tuple | None = None


def _encode_range(bounds: tuple[int, int]):
    encoder, sources, targets, dtype = _JOB
    start, end = bounds
    return _flatten(encoder.sources(sources[start:end]), dtype), _flatten(encoder.targets(targets[start:end]), dtype)


def _flatten(seqs: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    if flat.size and (flat.min() < 0 or flat.max() >= np.iinfo(dtype).max + 1):
        raise ValueError(f"token id {int(flat.max())} does not fit {dtype}")
    return flat.astype(dtype), lengths


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def tokenize(tokenizer, sources: list[str], targets: list[str], max_source: int, max_target: int, *,
             workers: int | None = None, chunk: int = CHUNK_PAIRS):
    """((source ids, source lengths), (target ids, target lengths)): the ids `batching.encode`
    gives, flat, tokenized in `chunk`-pair pieces by `workers` processes (default: every core,
    or this process alone for a corpus under PARALLEL_MIN_PAIRS)."""
    global _JOB
    dtype = id_dtype(len(tokenizer))
    bounds = [(start, min(start + chunk, len(sources))) for start in range(0, len(sources), chunk)]
    if workers is None:
        workers = 1 if len(sources) < PARALLEL_MIN_PAIRS else default_workers()
    workers = min(workers, len(bounds))
    _JOB = (Encoder(tokenizer, max_source, max_target, (sources, targets)), sources, targets, dtype)
    try:
        if workers <= 1:
            parts = [_encode_range(b) for b in bounds]
        else:
            # The workers inherit the text as millions of objects. Frozen, the workers' collector
            # never walks them, and so never touches (and copies) the parent's pages: 1.4x faster
            # at 4M pairs (docs/benchmarks.md).
            gc.freeze()
            try:
                with multiprocessing.get_context("fork").Pool(workers) as pool:
                    parts = pool.map(_encode_range, bounds, chunksize=1)
            finally:
                gc.unfreeze()
    finally:
        _JOB = None
    out = []
    for side in range(2):
        ids = [p[side][0] for p in parts]
        lengths = [p[side][1] for p in parts]
        out.append((np.concatenate(ids) if ids else np.zeros(0, dtype),
                    np.concatenate(lengths) if lengths else np.zeros(0, np.int64)))
    return tuple(out)


def write(directory: Path, tokenizer, sources: list[str], targets: list[str], max_source: int,
          max_target: int, *, key: str, workers: int | None = None) -> Path:
    """Tokenize and write one prepared directory, atomically; returns `directory`."""
    started = time.monotonic()
    encoded = tokenize(tokenizer, sources, targets, max_source, max_target, workers=workers)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".tmp-{directory.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        tokens = {}
        for side, (ids, lengths) in zip(SIDES, encoded):
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            np.save(tmp / f"{side}_ids.npy", ids)
            np.save(tmp / f"{side}_offsets.npy", offsets)
            tokens[side] = int(offsets[-1])
        meta = {"format": FORMAT_VERSION, "key": key, "pairs": len(sources), "tokens": tokens,
                "dtype": str(encoded[0][0].dtype), "vocab_size": len(tokenizer),
                "max_source_length": max_source, "max_target_length": max_target,
                "tokenizer": tokenizer_fingerprint(tokenizer), "seconds": round(time.monotonic() - started, 3)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        _fsync_tree(tmp)
        (tmp / MARKER).write_text("")
        _fsync_tree(tmp)
        if directory.exists() and not is_complete(directory):  # left by a crash or a half copy
            stale = directory.parent / f".stale-{directory.name}-{secrets.token_hex(4)}"
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


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _shared_between_nodes(root: Path, world) -> bool:
    """Collective: whether every rank sees `root` as one directory (rank 0 writes a probe file)."""
    from rosetta_trainer.distributed import all_gather_objects, barrier, broadcast_object

    token = broadcast_object(world, secrets.token_hex(16) if world.is_main else None)
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


def _identity_file(identity: str, tokenizer, max_source: int, max_target: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": FORMAT_VERSION, "data": identity, "max_source": max_source,
                         "max_target": max_target, "tokenizer": tokenizer_fingerprint(tokenizer)}).encode())
    return f"source-{h.hexdigest()}.json"


def _record_identity(directory: Path, name: str, train_report: dict | None) -> None:
    tmp = directory / f".{name}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps({"train": train_report}, indent=1) + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    tmp.rename(directory / name)


def find_prepared(root: Path, identity: str | None, tokenizer, max_source: int, max_target: int,
                  world) -> tuple[ShardedCorpus, dict] | None:
    """Collective: the prepared directory made from data files of this identity with this
    tokenizer and these lengths, mapped, with the training split's report as it was when the
    text was read; None (on every rank) unless every rank can map it."""
    from rosetta_trainer.distributed import all_gather_objects, broadcast_object

    started = time.monotonic()
    name = _identity_file(identity, tokenizer, max_source, max_target) if identity else None
    found = None
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


def prepare_corpus(root: Path, tokenizer, sources: list[str], targets: list[str], max_source: int,
                   max_target: int, world, *, workers: int | None = None, identity: str | None = None,
                   train_report: dict | None = None) -> ShardedCorpus:
    """Collective: the prepared directory for these pairs under `root`, written by one process
    when it is missing, then mapped by every rank. With `identity` (data_identity.py) the writer
    also records it, so that `find_prepared` finds the directory without the text next time."""
    from rosetta_trainer.distributed import all_gather_objects, broadcast_object

    started = time.monotonic()
    key = broadcast_object(world, corpus_key(sources, targets, tokenizer, max_source, max_target)
                           if world.is_main else None)
    directory = Path(root) / key
    shared = not world.spans_nodes or _shared_between_nodes(Path(root), world)
    writer = world.is_main if shared else world.local_rank == 0
    wrote, error = False, None
    if writer:
        try:
            if not is_complete(directory):
                write(directory, tokenizer, sources, targets, max_source, max_target, key=key, workers=workers)
                wrote = True
                prune(Path(root), keep=key)
            if identity:
                _record_identity(directory, _identity_file(identity, tokenizer, max_source, max_target),
                                 train_report)
        except Exception as exc:  # every rank must hear of it, not wait for a directory forever
            error = f"rank {world.rank} could not write {directory}: {type(exc).__name__}: {exc}"
            if not world.distributed:
                raise
    errors = [e for e in all_gather_objects(world, error) if e]  # also the wait for the writer
    if errors:
        raise RuntimeError("; ".join(errors))
    corpus = ShardedCorpus(directory)
    meta = corpus.meta
    log.info("training data: %s %d pairs (%d source + %d target tokens, %s) %s %s in %.1fs",
             "tokenized and wrote" if wrote else "mapped prepared", meta["pairs"], meta["tokens"]["source"],
             meta["tokens"]["target"], meta["dtype"], "to" if wrote else "from", directory,
             time.monotonic() - started)
    return corpus


def prepare_command(args) -> int:
    """`rosetta prepare`: read and check the data, train or load the tokenizer as `rosetta train`
    would, and write the prepared training data under <output>/prepared/."""
    from rosetta_contract.spec import load_for_trainer
    from rosetta_trainer import checkpoint as ckpt
    from rosetta_trainer.__main__ import _prepare_tokenizer
    from rosetta_trainer.data_checks import describe, read_checked
    from rosetta_trainer.data_identity import data_identity
    from rosetta_trainer.distributed import init_world
    from rosetta_trainer.evaluate import model_inputs

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    document = load_for_trainer(args.file, args.overrides)
    spec = document.spec
    output = Path(args.output or Path("runs") / document.metadata.name)
    output.mkdir(parents=True, exist_ok=True)
    world = init_world("cpu")
    ckpt_root = Path(spec.checkpoint.dir) if spec.checkpoint.dir else Path("checkpoints")
    ckpt_root = ckpt_root if ckpt_root.is_absolute() else output / ckpt_root
    data = read_checked(spec.data)
    log.info("data: %s", describe(data))
    if not data.train:
        raise ValueError("spec.data.train: no training examples")
    d = spec.data
    sources = model_inputs(data.train, d.source_lang, spec.uses_task_prefix())
    targets = [e.target for e in data.train]
    train_report = data.reports["train"].as_dict("train")
    del data
    tokenizer = _prepare_tokenizer(spec, sources, targets, output, world, ckpt.latest_checkpoint(ckpt_root))
    corpus = prepare_corpus(output / PREPARED_DIR, tokenizer, sources, targets, d.max_source_length,
                            d.max_target_length, world, workers=args.workers,
                            identity=data_identity(d, use_prefix=spec.uses_task_prefix()), train_report=train_report)
    meta = corpus.meta
    print(f"prepared: {corpus.path}\npairs: {meta['pairs']}   source tokens: {meta['tokens']['source']}   "
          f"target tokens: {meta['tokens']['target']}   ids: {meta['dtype']}", flush=True)
    return 0
