"""The duplicate filter (dedup.py, data_checks.TrainingText): the pairs it keeps are the ones the
former filter, a Python set of the same digests, kept."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from rosetta_contract.data_fields import DataSpec
from rosetta_trainer.preparation import dedup
from rosetta_trainer.preparation.data_checks import TrainingText, _rejected


def former_filter(text: TrainingText) -> tuple[list[tuple[str, str, str]], int]:
    """The kept (language, source, target) and the duplicates dropped, as the filter was: one
    Python set of 8-byte blake2b digests, asked pair by pair after the other filters."""
    data, checks = text.data, text.data.checks
    ratio = checks.max_length_ratio if data.task == "translation" else None
    from rosetta_trainer.data.reader import iter_source

    seen, kept, dropped = set(), [], 0
    for src in data.train:
        for ex in iter_source(src, data):
            if src.format != "generated":
                if _rejected(ex, ratio, text.held_out):
                    continue
                key = hashlib.blake2b(f"{ex.target_lang}\0{ex.source.strip()}\0{ex.target.strip()}".encode(),
                                      digest_size=8).digest()
                if key in seen:
                    dropped += 1
                    continue
                seen.add(key)
            kept.append((ex.target_lang, ex.source, ex.target))
    return kept, dropped


def corpus_with_duplicates(rng: random.Random, pairs: int) -> list[tuple[str, str]]:
    """Few distinct sentences, so most pairs repeat an earlier one: near (a batch), far (many
    batches back), with other whitespace around them; some empty, some of an extreme ratio."""
    words = ["cat", "dog", "runs", "sleeps", "the", "a", "red", "house", "Katze", "Hund", "läuft", "das"]
    out = []
    for _ in range(pairs):
        source = " ".join(rng.choice(words) for _ in range(rng.randint(0, 2)))
        target = " ".join(rng.choice(words) for _ in range(rng.randint(1, 2)))
        if rng.random() < 0.05:
            source = f"  {source}\t"
        if rng.random() < 0.01:
            target = target * 20
        out.append((source, target))
    return out


def write_pairs(path, pairs) -> dict:
    path.with_suffix(".en").write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    path.with_suffix(".de").write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return {"format": "pairs", "source": str(path.with_suffix(".en")), "target": str(path.with_suffix(".de"))}


@pytest.mark.parametrize("batch", [1, 7, 100, dedup.BATCH])
def test_the_kept_pairs_are_the_former_filters(tmp_path, monkeypatch, batch):
    monkeypatch.setattr(dedup, "BATCH", batch)
    monkeypatch.setattr(dedup.first_occurrences, "__defaults__", (batch,))
    rng = random.Random(7)
    sources = [write_pairs(tmp_path / f"part{i}", corpus_with_duplicates(rng, 3_000)) for i in range(3)]
    data = DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "train": sources})
    held_out = {("de", "the cat")}
    text = TrainingText(data, held_out)

    kept = [(ex.target_lang, ex.source, ex.target) for ex in text]
    expected, duplicates = former_filter(TrainingText(data, held_out))

    assert kept == expected
    assert text.report.dropped["duplicate"] == duplicates > 2_000  # many pairs repeat one
    assert text.report.read == 9_000
    assert text.report.kept + sum(text.report.dropped.values()) == text.report.read
    assert text.report.dropped["empty"] and text.report.dropped["length_ratio"] and text.report.dropped["test_overlap"]
    # Iterated again, the filter starts afresh: the same pairs.
    assert [(ex.target_lang, ex.source, ex.target) for ex in text] == kept


def test_seen_digests_is_a_set_a_batch_at_a_time():
    rng = np.random.default_rng(0)
    seen, reference = dedup.SeenDigests(), set()
    for size in rng.integers(0, 500, size=300):
        digests = rng.integers(0, 3_000, size=size).astype(np.uint64)
        digests[::17] = np.uint64(2**64 - 1)  # the extremes of the range are values like any other
        digests[::29] = 0
        expected = []
        for d in digests.tolist():
            expected.append(d not in reference)
            reference.add(d)
        assert seen.first_seen(digests).tolist() == expected
    assert len(seen) == len(reference)
    assert all((run[1:] > run[:-1]).all() for run in seen.runs)
    # Sizes fall geometrically: a handful of runs, not one per batch.
    assert len(seen.runs) <= 2 * int(np.log2(len(reference))) + 1
    assert seen.nbytes == 8 * len(reference)
