"""Where a first start hands freed heap back to the OS (runtime/cpu_allocator.give_back_freed_memory):
after the tokenizer's training and after the prepared shards are written, not when nothing was
freed. What it saves is measured in bench/first_start.py; tests/unit/trainer/runtime/
test_cpu_allocator.py shows that the call returns freed pages."""

import torch

from rosetta_contract.spec import parse_for_trainer
from rosetta_trainer.data.corpus import generate_pairs
from rosetta_trainer.preparation import prepare_data, shards
from rosetta_trainer.runtime.distributed import World
from support.training import TINY

ALONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), local_size=1)


def calls(monkeypatch, module) -> list[None]:
    made: list[None] = []
    monkeypatch.setattr(module, "give_back_freed_memory", lambda: made.append(None) or True)
    return made


def test_after_the_tokenizer_is_trained_and_not_when_it_is_reused(monkeypatch, tmp_path):
    made = calls(monkeypatch, prepare_data)
    spec = parse_for_trainer(TINY, "tiny").spec
    pairs = generate_pairs("de", 200, seed=1)
    prepare_data.prepare_tokenizer(spec, pairs, tmp_path, ALONE, None, identity="files")
    assert len(made) == 1
    prepare_data.prepare_tokenizer(spec, pairs, tmp_path, ALONE, None, identity="files")  # reused
    assert len(made) == 1


def test_after_the_shards_are_written_and_not_when_they_are_mapped(monkeypatch, tmp_path):
    made = calls(monkeypatch, shards)
    spec = parse_for_trainer(TINY, "tiny").spec
    pairs = generate_pairs("de", 200, seed=1)
    tokenizer = prepare_data.prepare_tokenizer(spec, pairs, tmp_path, ALONE, None)
    shards.prepare_corpus(tmp_path / "prepared", tokenizer, pairs, 48, 48, ALONE)
    assert len(made) == 1
    shards.prepare_corpus(tmp_path / "prepared", tokenizer, pairs, 48, 48, ALONE)  # already there
    assert len(made) == 1
