"""model.source / data.source from a Hugging Face hub repository, against a stand-in hub on loopback
(support/fake_hub.py; HF_ENDPOINT points huggingface_hub at it): the files land whole at the
revision asked for, without huggingface_hub's bookkeeping, and a repository the hub does not have
is a data error."""

from __future__ import annotations

import pytest

from rosetta_contract.staging_fields import StagingSpec
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.preparation.staging import MARKER, StagingError, stage
from support.fake_hub import fake_hub

MODEL = {"config.json": b'{"model_type": "t5"}', "model.safetensors": b"\x01" * 70_000, "spiece.model": b"spm"}
CORPUS = {"data/train.jsonl": b'{"source": "a", "target": "b"}\n', "README.md": b"# corpus"}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with fake_hub({("model", "org/tiny-t5"): MODEL, ("dataset", "org/corpus"): CORPUS}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token or cache of the machine's
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield hub


def tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_model_repository_is_copied_at_its_revision(hub, tmp_path):
    dest = tmp_path / "models" / "tiny-t5"
    done = stage(StagingSpec(uri="hf://org/tiny-t5@v1.0", path=str(dest)), "model")
    assert done["copied"] and done["files"] == 3
    files = tree(dest)
    assert {k: v for k, v in files.items() if k != MARKER} == MODEL  # no .cache/huggingface left behind
    assert ("GET", "/api/models/org/tiny-t5/revision/v1.0") in hub.requests
    asked = len(hub.requests)
    assert not stage(StagingSpec(uri="hf://org/tiny-t5@v1.0", path=str(dest)), "model")["copied"]
    assert len(hub.requests) == asked  # staged already: the hub is not asked again


def test_a_dataset_repository_is_copied_with_its_folders(hub, tmp_path):
    dest = tmp_path / "corpora" / "corpus"
    stage(StagingSpec(uri="hf://datasets/org/corpus", path=str(dest)), "data")
    assert {k: v for k, v in tree(dest).items() if k != MARKER} == CORPUS
    assert any(path.startswith("/api/datasets/org/corpus/revision/") for _, path in hub.requests), hub.requests


def test_a_repository_the_hub_does_not_have_is_a_data_error(hub, tmp_path):
    with pytest.raises(StagingError, match="hf://org/missing: RepositoryNotFoundError") as info:
        stage(StagingSpec(uri="hf://org/missing", path=str(tmp_path / "m")), "model")
    assert isinstance(info.value, DataError)
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []
