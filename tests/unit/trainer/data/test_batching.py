import threading

import numpy as np
import pytest
import torch

from rosetta_trainer.data import batching
from rosetta_trainer.data.batching import (
    IGNORE_INDEX,
    BatchShapes,
    Collation,
    EncodedCorpus,
    _length_sorted,
    collate,
    iterate,
    plan_epoch,
    rank_batches,
)
from support.plan_reference import reference_plan


@pytest.fixture
def lengths():
    # Like real parallel text: target length follows source length, with noise.
    rng = np.random.default_rng(0)
    src = rng.integers(3, 60, size=2000)
    return src, np.maximum(2, (src * 1.1).astype(int) + rng.integers(-3, 4, size=2000))


def padded_cost(batch, src, tgt):
    return len(batch) * (max(src[batch]) + max(tgt[batch]))


def test_token_budget_is_respected_and_every_example_is_used_once(lengths):
    src, tgt = lengths
    plan = plan_epoch(src, tgt, seed=1, epoch=0, max_tokens=1000)
    assert all(padded_cost(b, src, tgt) <= 1000 for b in plan)
    used = sorted(i for b in plan for i in b)
    assert used == list(range(len(src)))


def test_bucketing_wastes_far_less_padding_than_random_batches(lengths):
    src, tgt = lengths
    plan = plan_epoch(src, tgt, seed=1, epoch=0, max_sentences=32)
    real = (src + tgt).sum()
    bucketed = sum(padded_cost(b, src, tgt) for b in plan)
    rng = np.random.default_rng(1)
    order = rng.permutation(len(src))
    random_batches = [order[i:i + 32] for i in range(0, len(order), 32)]
    unbucketed = sum(padded_cost(b, src, tgt) for b in random_batches)
    assert bucketed / real < 1.1
    assert unbucketed / real > 1.5


@pytest.mark.parametrize("budget", [{"max_tokens": 64}, {"max_tokens": 1000}, {"max_tokens": 25_000},
                                    {"max_sentences": 1}, {"max_sentences": 32}])
@pytest.mark.parametrize("shapes", [BatchShapes(), BatchShapes(multiple=8), BatchShapes(buckets=(16, 48, 128))])
@pytest.mark.parametrize("longest", [120, 400, 70_000])  # packed words, and lengths too long to pack
def test_the_vectorised_plan_is_the_per_example_plan(budget, shapes, longest):
    # Long-tailed lengths: some batches are far longer than the packer's first window, some one sentence.
    rng = np.random.default_rng(7)
    src = np.minimum(rng.geometric(0.04 * 120 / longest, size=5000), longest)
    tgt = np.maximum(1, src + rng.integers(-5, 6, size=5000))
    for seed, epoch, world in ((1, 0, 1), (3, 2, 4)):
        expected = reference_plan(src, tgt, seed=seed, epoch=epoch, world_size=world, shapes=shapes, **budget)
        assert plan_epoch(src, tgt, seed=seed, epoch=epoch, world_size=world, shapes=shapes, **budget) == expected


@pytest.mark.parametrize("carry_index", [True, False])
@pytest.mark.parametrize("longest", [3, 180, 65_535])
def test_packed_length_sort_is_lexsort_whether_the_index_rides_in_the_word_or_not(carry_index, longest, monkeypatch):
    monkeypatch.setattr(batching, "_SLICE", 1000)  # three slices and a short one
    rng = np.random.default_rng(longest)
    src = rng.integers(0, longest + 1, size=3000).astype(np.int32)
    tgt = rng.integers(0, longest + 1, size=3000).astype(np.int32)
    noise = np.random.default_rng(1).permutation(3000)
    order, src_sorted, tgt_sorted = _length_sorted(src, tgt, np.random.default_rng(1), carry_index=carry_index)
    expected = np.lexsort((noise, np.minimum(src, tgt), np.maximum(src, tgt)))
    assert order.tolist() == expected.tolist()
    assert src_sorted.tolist() == src[expected].tolist() and tgt_sorted.tolist() == tgt[expected].tolist()


@pytest.mark.parametrize("longest", [180, 65_535])
def test_the_packed_sort_chooses_a_route_whose_word_holds_everything(longest):
    # 40,000 pairs: 16 bits of index; with sentences up to 65,535 tokens (a 32-bit key) the index
    # no longer fits beside the noise, and a wrong choice would overflow the words.
    rng = np.random.default_rng(longest)
    src = rng.integers(0, longest + 1, size=40_000).astype(np.int32)
    tgt = rng.integers(0, longest + 1, size=40_000).astype(np.int32)
    noise = np.random.default_rng(1).permutation(40_000)
    order, _, _ = _length_sorted(src, tgt, np.random.default_rng(1))
    assert order.tolist() == np.lexsort((noise, np.minimum(src, tgt), np.maximum(src, tgt))).tolist()


def test_an_empty_corpus_plans_no_batches():
    assert plan_epoch(np.zeros(0, int), np.zeros(0, int), seed=1, epoch=0, max_tokens=100) == []


def test_plan_is_deterministic_per_seed_and_epoch(lengths):
    src, tgt = lengths
    a = plan_epoch(src, tgt, seed=1, epoch=3, max_tokens=1500)
    assert a == plan_epoch(src, tgt, seed=1, epoch=3, max_tokens=1500)
    assert a != plan_epoch(src, tgt, seed=1, epoch=4, max_tokens=1500)
    assert a != plan_epoch(src, tgt, seed=2, epoch=3, max_tokens=1500)


def test_ranks_get_equal_disjoint_shares(lengths):
    src, tgt = lengths
    plan = plan_epoch(src, tgt, seed=1, epoch=0, max_tokens=999, world_size=3)
    assert len(plan) % 3 == 0
    shares = [rank_batches(plan, r, 3) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    seen = [i for s in shares for b in s for i in b]
    assert len(seen) == len(set(seen))


def test_oversized_example_gets_its_own_batch():
    plan = plan_epoch(np.array([5, 500, 6]), np.array([5, 500, 6]), seed=0, epoch=0, max_tokens=100)
    assert sorted(map(sorted, plan)) == [[0, 2], [1]]


def test_collate_pads_inputs_and_masks_labels():
    corpus = EncodedCorpus([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 9, 1]])
    batch = collate(corpus, [0, 1], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 1], [7, 1, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[8, 1, IGNORE_INDEX, IGNORE_INDEX], [9, 9, 9, 1]]
    assert set(batch) == {"input_ids", "attention_mask", "labels", "counts"}
    assert batch["counts"][:3].tolist() == [3 + 2 + 2 + 4, 2 + 4, 2]  # tokens, target tokens, sentences


def test_collate_counts_tokens_sentences_and_flops():
    corpus = EncodedCorpus([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 9, 1]])
    seen = []

    def flops(src, tgt):
        seen.append((src, tgt))
        return 123.0

    batch = collate(corpus, [0, 1], pad_id=0, flops=flops)
    assert batch["counts"].dtype == torch.float64
    assert batch["counts"].tolist() == [5 + 6, 6, 2, 123.0]
    assert [(list(s), list(t)) for s, t in seen] == [([3, 2], [2, 4])]
    assert collate(corpus, [1], pad_id=0)["counts"].tolist() == [2 + 4, 4, 1, 0.0]


# ------------------------------------------------------------------ shapes for a compiled step


def test_lengths_pad_to_a_multiple_or_to_the_next_bucket():
    assert [BatchShapes(multiple=8).length(n) for n in (1, 8, 9, 17)] == [8, 8, 16, 24]
    buckets = BatchShapes(buckets=(16, 24, 32, 48))
    assert [buckets.length(n) for n in (3, 16, 17, 40, 48)] == [16, 16, 24, 48, 48]
    assert buckets.length(np.array([3, 30])).tolist() == [16, 32]
    assert BatchShapes().length(13) == 13  # the default pads to the longest sentence only


def test_a_padded_batch_masks_and_ignores_what_padding_added():
    corpus = EncodedCorpus([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 9, 1]])
    batch = Collation(0, BatchShapes(multiple=8))(corpus, [0, 1])
    assert batch["input_ids"].shape == (2, 8) and batch["labels"].shape == (2, 8)
    assert batch["input_ids"][0].tolist() == [5, 6, 1, 0, 0, 0, 0, 0]
    assert batch["attention_mask"].sum().item() == 5
    assert (batch["labels"] != IGNORE_INDEX).sum().item() == 6
    assert batch["counts"].tolist() == [11, 6, 2, 0.0]  # the real tokens only


def test_static_rows_fill_the_token_budget_with_ignored_pairs():
    corpus = EncodedCorpus([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 9, 1]])
    batch = Collation(0, BatchShapes(multiple=8, static_rows=True), max_tokens=100)(corpus, [0, 1])
    # 100 tokens hold 6 rows of 8 + 8: the batch's shape follows from its lengths alone.
    assert batch["input_ids"].shape == (6, 8) and batch["labels"].shape == (6, 8)
    assert batch["attention_mask"][2:].sum() == 0 and (batch["labels"][2:] == IGNORE_INDEX).all()
    assert batch["counts"][2].item() == 2
    sentences = Collation(0, BatchShapes(static_rows=True), max_sentences=5)(corpus, [1])
    assert sentences["input_ids"].shape == (5, 2)


def test_the_plan_keeps_the_padded_batch_within_the_budget(lengths):
    src, tgt = lengths
    shapes = BatchShapes(buckets=(8, 16, 24, 32, 48, 64, 96, 128))
    plan = plan_epoch(src, tgt, seed=1, epoch=0, max_tokens=1000, shapes=shapes)
    assert sorted(i for b in plan for i in b) == list(range(len(src)))
    for b in plan:
        cost = len(b) * (shapes.length(int(src[b].max())) + shapes.length(int(tgt[b].max())))
        assert len(b) == 1 or cost <= 1000
    exact = plan_epoch(src, tgt, seed=1, epoch=0, max_tokens=1000)
    assert len(plan) > len(exact)  # padding takes room: more, smaller batches


def feeders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "QueueFeederThread"]


def test_no_loader_thread_is_still_ending_when_the_next_epoch_forks():
    """The next epoch's loader forks at once; a thread then mid-exit can hang the forked worker
    (batching._settled). Without the join, about a third of epochs ended with the feeder alive."""
    corpus = EncodedCorpus([[1, 2, 3]] * 40, [[4, 5]] * 40)
    plan = [[i, i + 1] for i in range(0, 40, 2)]
    for epoch in range(12):
        assert len(list(iterate(corpus, plan, Collation(0)))) == len(plan)
        assert not feeders(), f"epoch {epoch}"
    batches = iterate(corpus, plan, Collation(0), start=3)
    next(batches)
    batches.close()  # a loop that stops mid-epoch (the run's last step) settles it too
    assert not feeders()
