"""Prepared training data: the ids of the in-memory path, one directory per corpus and tokenizer,
never a half-written one, and one copy mapped by every rank."""

import logging
import os
import pickle
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from rosetta_contract.model_fields import TokenizerTraining
from rosetta_trainer.data.batching import collate, encode, plan_epoch
from rosetta_trainer.data.corpus import generate_pairs
from rosetta_trainer.models.tokenization import load_tokenizer, train_tokenizer
from rosetta_trainer.preparation import shards
from rosetta_trainer.runtime.distributed import World

ALONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), local_size=1)


@pytest.fixture(scope="module")
def pairs():
    pairs = generate_pairs("de", 600, seed=1)
    return [s for s, _ in pairs], [t for _, t in pairs]


class Reported(list):
    """Pairs with the training split's report, as data_checks.TrainingPairs has."""

    def __init__(self, pairs, report):
        super().__init__(zip(*pairs))
        self._report = report

    def report(self):
        return self._report


class Unreadable:
    """Training text that no rank but the writer may read."""

    def __iter__(self):
        raise AssertionError("a rank that does not write read the training text")


class BadData:
    """Training text whose files turn out bad midway, as data_checks reports it."""

    def __init__(self, pairs):
        self.pairs = list(zip(*pairs))

    def __iter__(self):
        from rosetta_trainer.data.examples import DataError

        yield from self.pairs[:300]
        raise DataError("train.en:301: not UTF-8 text (invalid start byte at byte 4)")


def prepare(root, tokenizer, sources, targets, max_source=48, max_target=48, world=ALONE, **kw):
    corpus, _report = shards.prepare_corpus(root, tokenizer, list(zip(sources, targets)), max_source, max_target,
                                            world, **kw)
    return corpus


def flat(chunks):
    """tokenize's chunks end to end: ((source ids, lengths), (target ids, lengths))."""
    chunks = list(chunks)
    return tuple((np.concatenate([c[side][0] for c in chunks]), np.concatenate([c[side][1] for c in chunks]))
                 for side in range(2))


def _tokenizer(directory, sources, targets, vocab_size=200):
    train_tokenizer(TokenizerTraining(type="unigram", vocab_size=vocab_size), [*sources, *targets], directory)
    return load_tokenizer(directory)


@pytest.fixture(scope="module")
def tokenizer(pairs, tmp_path_factory):
    return _tokenizer(tmp_path_factory.mktemp("tok"), *pairs)


def test_prepared_ids_are_the_in_memory_ids(pairs, tokenizer, tmp_path):
    sources, targets = pairs
    expected = encode(tokenizer, sources, targets, 12, 40)  # 12: some sources are truncated
    corpus = prepare(tmp_path, tokenizer, sources, targets, 12, 40)

    assert len(corpus) == len(expected) == len(sources)
    assert corpus.meta["dtype"] == "uint16"
    assert all(corpus.sources[i].tolist() == expected.sources[i] for i in range(len(corpus)))
    assert all(corpus.targets[i].tolist() == expected.targets[i] for i in range(len(corpus)))
    for mine, theirs in zip(corpus.lengths(), expected.lengths()):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
    # The same plan, and the same batch tensors.
    plan = plan_epoch(*corpus.lengths(), seed=3, epoch=1, max_tokens=400)
    assert plan == plan_epoch(*expected.lengths(), seed=3, epoch=1, max_tokens=400)
    for batch in plan[:5]:
        a, b = collate(corpus, batch, 0), collate(expected, batch, 0)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_lengths_are_32_bit_and_the_same_across_the_slices_they_are_taken_in(monkeypatch):
    offsets = np.cumsum([0, *range(1, 40)], dtype=np.int64) + (1 << 33)  # offsets past 32 bits
    monkeypatch.setattr(shards, "LENGTHS_SLICE", 7)
    lengths = shards.Ragged(np.empty(0), offsets).lengths()
    assert lengths.dtype == np.int32
    assert lengths.tolist() == list(range(1, 40))


def test_worker_processes_give_the_same_ids(pairs, tokenizer):
    sources, targets = pairs
    alone = flat(shards.tokenize(tokenizer, zip(sources, targets), 48, 48, workers=1))
    parallel = flat(shards.tokenize(tokenizer, zip(sources, targets), 48, 48, workers=2, chunk=70))
    for (ids_a, len_a), (ids_b, len_b) in zip(alone, parallel):
        assert np.array_equal(ids_a, ids_b) and np.array_equal(len_a, len_b)


def test_ids_are_uint32_when_the_vocabulary_does_not_fit_uint16():
    assert shards.id_dtype(2**16) == np.uint16
    assert shards.id_dtype(2**16 + 1) == np.uint32
    with pytest.raises(ValueError, match="does not fit"):
        shards.flatten([[1, 70000]], np.dtype(np.uint16))


def test_a_changed_pair_tokenizer_or_length_gives_a_new_directory(pairs, tokenizer, tmp_path):
    sources, targets = pairs
    key = shards.corpus_key(zip(sources, targets), tokenizer, 48, 48)
    assert shards.corpus_key(zip(list(sources), list(targets)), tokenizer, 48, 48) == key  # content, not identity
    edited = [sources[0] + " x", *sources[1:]]
    assert shards.corpus_key(zip(edited, targets), tokenizer, 48, 48) != key
    # The same text split differently between pairs is other data.
    moved = [sources[0] + sources[1][:1], sources[1][1:], *sources[2:]]
    assert shards.corpus_key(zip(moved, targets), tokenizer, 48, 48) != key
    assert shards.corpus_key(zip(sources, targets), tokenizer, 40, 48) != key
    other = _tokenizer(tmp_path / "other", sources, targets, vocab_size=150)
    assert shards.corpus_key(zip(sources, targets), other, 48, 48) != key


def test_the_tokenizer_fingerprint_survives_a_call_and_a_save(tokenizer, tmp_path):
    before = shards.tokenizer_fingerprint(tokenizer)
    tokenizer(["a b c"], truncation=True, max_length=5)  # leaves truncation set on the backend
    assert shards.tokenizer_fingerprint(tokenizer) == before
    tokenizer.save_pretrained(tmp_path / "copy")
    assert shards.tokenizer_fingerprint(load_tokenizer(tmp_path / "copy")) == before


def test_a_half_written_directory_is_never_mapped(pairs, tokenizer, tmp_path):
    sources, targets = pairs
    key = shards.corpus_key(zip(sources, targets), tokenizer, 48, 48)
    half = tmp_path / key
    half.mkdir()
    np.save(half / "source_ids.npy", np.zeros(3, np.uint16))  # a crash before COMPLETE
    (tmp_path / f".tmp-{key}-dead").mkdir()  # a crashed writer's temporary directory

    corpus = prepare(tmp_path, tokenizer, sources, targets)
    assert corpus.path == half and shards.is_complete(half)
    assert len(corpus) == len(sources)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".tmp-")] == [key]


def test_a_complete_directory_is_mapped_not_rewritten(pairs, tokenizer, tmp_path, caplog):
    sources, targets = pairs
    first = prepare(tmp_path, tokenizer, sources, targets)
    stamp = (first.path / "source_ids.npy").stat().st_mtime_ns
    caplog.set_level("INFO", logger="rosetta_trainer.preparation.shards")
    second = prepare(tmp_path, tokenizer, sources, targets)
    assert second.path == first.path and (first.path / "source_ids.npy").stat().st_mtime_ns == stamp
    assert "mapped prepared 600 pairs" in caplog.text
    assert isinstance(second.sources.ids, np.memmap)


def test_a_pickled_corpus_reopens_its_files(pairs, tokenizer, tmp_path):
    corpus = prepare(tmp_path, tokenizer, *pairs)
    blob = pickle.dumps(corpus)
    assert len(blob) < 1000  # the path, not the ids
    again = pickle.loads(blob)
    assert again.sources[5].tolist() == corpus.sources[5].tolist()


def _find_rank(rank: int, port: int, roots: list[str], local_size: int, tokenizer_dir: str, pairs, results) -> None:
    """What find_prepared gives this rank, for identity "same-files"."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    torch.distributed.init_process_group("gloo")
    try:
        world = World(rank=rank, local_rank=rank % local_size, size=2, device=torch.device("cpu"), local_size=local_size)
        found = shards.find_prepared(roots[rank], "same-files", load_tokenizer(tokenizer_dir), 48, 48, world)
        results.put((rank, found is not None, None, None, None))
    finally:
        torch.distributed.destroy_process_group()


def _rank(rank: int, port: int, roots: list[str], local_size: int, tokenizer_dir: str, texts, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    torch.distributed.init_process_group("gloo")
    try:
        local_rank = rank % local_size
        world = World(rank=rank, local_rank=local_rank, size=2, device=torch.device("cpu"), local_size=local_size)
        messages = []
        handler = logging.Handler()
        handler.emit = lambda record: messages.append(record.getMessage())
        shards.log.addHandler(handler)
        shards.log.setLevel(logging.INFO)
        try:
            corpus, _ = shards.prepare_corpus(roots[rank], load_tokenizer(tokenizer_dir), texts[rank], 48, 48, world)
        except Exception as exc:
            results.put((rank, type(exc).__name__, str(exc), None, None))
            return
        maps = [line.split()[-1] for line in open("/proc/self/maps") if str(corpus.path) in line]
        wrote = any("tokenized and wrote" in m for m in messages)
        results.put((rank, str(corpus.path), corpus.sources[7].tolist(), sorted(set(maps)), wrote))
    finally:
        torch.distributed.destroy_process_group()


def _rank_processes():
    """Fresh processes forked from one server that imported torch and this module once: spawning
    each rank imported them again (six tests, fourteen processes, ~4 s of imports each), and
    forking the pytest worker itself would copy its threads' state into the ranks."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
    return ctx


def _two_ranks(tmp_path, tokenizer, pairs, roots, local_size, target=_rank, texts=None):
    """What each of two ranks got; `texts`: what each passes as its training text (by default the
    pairs for both)."""
    tokenizer.save_pretrained(tmp_path / "tok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = _rank_processes()
    results = ctx.Queue()
    texts = texts or [list(zip(*pairs))] * 2
    procs = [ctx.Process(target=target, args=(r, port, [str(root) for root in roots], local_size, str(tmp_path / "tok"),
                                             texts, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


@pytest.mark.slow  # ~5-6 s: two rank processes
def test_two_ranks_map_the_files_one_of_them_wrote(pairs, tokenizer, tmp_path):
    root = tmp_path / "prepared"
    # The rank that does not write never reads the training text.
    texts = [list(zip(*pairs)), Unreadable()]
    (_, path0, ids0, maps0, wrote0), (_, path1, ids1, maps1, wrote1) = _two_ranks(tmp_path, tokenizer, pairs,
                                                                                  [root, root], 2, texts=texts)
    assert path0 == path1 and ids0 == ids1
    assert (wrote0, wrote1) == (True, False)
    assert [p.name for p in root.iterdir()] == [os.path.basename(path0)]  # written once
    # Both processes map the same files (one page-cache copy), rather than reading them in.
    assert maps0 == maps1 and any(m.endswith("source_ids.npy") for m in maps0)


@pytest.mark.slow  # ~5-6 s: two rank processes
def test_on_two_nodes_without_shared_storage_each_node_writes_its_own(pairs, tokenizer, tmp_path):
    # One rank per node; each node's output is its own directory (a pod's local disk).
    roots = [tmp_path / "node0" / "prepared", tmp_path / "node1" / "prepared"]
    (_, path0, ids0, _, wrote0), (_, path1, ids1, _, wrote1) = _two_ranks(tmp_path, tokenizer, pairs, roots, 1)
    assert ids0 == ids1 and (wrote0, wrote1) == (True, True)
    assert path0 == str(roots[0] / os.path.basename(path0)) and path1 == str(roots[1] / os.path.basename(path0))
    assert all(shards.is_complete(root / os.path.basename(path0)) for root in roots)
    assert not [p for root in roots for p in root.iterdir() if p.name.startswith(".")]  # no probe left


def test_data_files_unchanged_since_they_were_prepared_find_the_directory_without_the_text(pairs, tokenizer, tmp_path):
    report = {"read": 601, "kept": 600, "dropped": {"empty": 1}}
    written, returned = shards.prepare_corpus(tmp_path, tokenizer, Reported(pairs, report), 48, 48, ALONE,
                                              identity="same-files")
    assert returned == report
    corpus, report = shards.find_prepared(tmp_path, "same-files", tokenizer, 48, 48, ALONE)
    assert corpus.path == written.path and corpus.sources[3].tolist() == written.sources[3].tolist()
    assert report == {"read": 601, "kept": 600, "dropped": {"empty": 1}}
    assert shards.find_prepared(tmp_path, "other-files", tokenizer, 48, 48, ALONE) is None
    assert shards.find_prepared(tmp_path, "same-files", tokenizer, 40, 48, ALONE) is None  # other lengths
    assert shards.find_prepared(tmp_path, None, tokenizer, 48, 48, ALONE) is None
    (written.path / shards.MARKER).unlink()  # a directory being replaced is not mapped
    assert shards.find_prepared(tmp_path, "same-files", tokenizer, 48, 48, ALONE) is None


@pytest.mark.slow  # ~5-6 s: two rank processes
def test_a_node_whose_disk_lacks_the_prepared_directory_makes_every_rank_read_the_text(pairs, tokenizer, tmp_path):
    roots = [tmp_path / "node0" / "prepared", tmp_path / "node1" / "prepared"]
    shards.prepare_corpus(roots[0], tokenizer, Reported(pairs, {"read": 600, "kept": 600}), 48, 48, ALONE,
                          identity="same-files")
    assert [found for _, found, *_ in _two_ranks(tmp_path, tokenizer, pairs, roots, 1, _find_rank)] == [False, False]
    shards.prepare_corpus(roots[1], tokenizer, Reported(pairs, {"read": 600, "kept": 600}), 48, 48, ALONE,
                          identity="same-files")
    assert [found for _, found, *_ in _two_ranks(tmp_path, tokenizer, pairs, roots, 1, _find_rank)] == [True, True]


@pytest.mark.slow  # ~5-6 s: two rank processes
def test_on_two_nodes_with_shared_storage_rank_0_writes(pairs, tokenizer, tmp_path):
    root = tmp_path / "shared" / "prepared"
    (_, path0, _, _, wrote0), (_, path1, _, _, wrote1) = _two_ranks(tmp_path, tokenizer, pairs, [root, root], 1,
                                                                    texts=[list(zip(*pairs)), Unreadable()])
    assert path0 == path1 and (wrote0, wrote1) == (True, False)
    assert [p.name for p in root.iterdir()] == [os.path.basename(path0)]


@pytest.mark.slow  # ~3-5 s: two rank processes
def test_a_data_error_in_the_writer_stops_every_rank_with_its_message(pairs, tokenizer, tmp_path):
    root = tmp_path / "prepared"
    got = _two_ranks(tmp_path, tokenizer, pairs, [root, root], 2, texts=[BadData(pairs), Unreadable()])
    message = "train.en:301: not UTF-8 text (invalid start byte at byte 4)"
    assert [(kind, text) for _, kind, text, *_ in got] == [("DataError", message)] * 2
    assert not list(root.iterdir())  # nothing mapped or kept, the writer's temporary directory neither


@pytest.mark.slow  # ~5-6 s: two rank processes
def test_nodes_whose_copies_of_the_data_differ_are_told(pairs, tokenizer, tmp_path):
    roots = [tmp_path / "node0" / "prepared", tmp_path / "node1" / "prepared"]
    edited = ([pairs[0][0] + " x", *pairs[0][1:]], pairs[1])
    got = _two_ranks(tmp_path, tokenizer, pairs, roots, 1, texts=[list(zip(*pairs)), list(zip(*edited))])
    assert {kind for _, kind, *_ in got} == {"RuntimeError"}
    assert all("the nodes' training data differ" in text for _, _, text, *_ in got)


def test_the_text_is_read_as_a_stream_a_few_chunks_ahead(pairs, tokenizer):
    sources, targets = pairs
    read = 0

    def stream():
        nonlocal read
        for i in range(100_000):
            read += 1
            yield sources[i % 600], targets[i % 600]

    chunks = shards.tokenize(tokenizer, stream(), 48, 48, workers=2, chunk=1_000)
    next(chunks)
    # What was read before the first chunk came back: enough to choose the workers, and what the
    # workers were given ahead (two chunks each), never the corpus.
    assert read <= shards.PARALLEL_MIN_PAIRS + 2 * 2 * 1_000 + 1_000
    chunks.close()


def test_the_key_does_not_depend_on_how_the_text_was_chunked(pairs, tokenizer, tmp_path):
    text = list(zip(*pairs))
    a = shards.write(tmp_path / "a", tokenizer, text, 48, 48, workers=1, chunk=70)
    b = shards.write(tmp_path / "b", tokenizer, text, 48, 48, workers=2, chunk=250)
    assert a.name == b.name == shards.corpus_key(text, tokenizer, 48, 48)
    for name in ("source_ids.npy", "source_offsets.npy", "target_ids.npy", "target_offsets.npy"):
        assert np.array_equal(np.load(a / name), np.load(b / name))


def test_writing_new_data_removes_what_older_data_and_crashed_writers_left(pairs, tokenizer, tmp_path, caplog):
    sources, targets = pairs
    old = prepare(tmp_path, tokenizer, sources[:300], targets[:300]).path
    crashed = tmp_path / ".tmp-deadbeef-0000"
    crashed.mkdir()
    (crashed / "source_ids.npy").write_bytes(b"\0" * 100)
    in_progress = tmp_path / ".tmp-cafe-1111"  # another node's write, still going
    in_progress.mkdir()
    hour_ago = shards.time.time() - shards.STALE_SECONDS - 60
    os.utime(crashed, (hour_ago, hour_ago))
    caplog.set_level("INFO", logger="rosetta_trainer.preparation.shards")

    new = prepare(tmp_path, tokenizer, sources, targets).path
    assert new != old and not old.exists() and not crashed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([new.name, in_progress.name])
    assert "prepared for other data or another tokenizer" in caplog.text
    # Mapping what is there removes nothing.
    in_progress.rmdir()
    prepare(tmp_path, tokenizer, sources, targets)
    assert [p.name for p in tmp_path.iterdir()] == [new.name]
