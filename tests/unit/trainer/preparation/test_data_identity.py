"""The identity of a training's data files: unchanged while nothing that decides the text changes."""

import os

from rosetta_contract.data_fields import DataSpec
from rosetta_trainer.preparation.data_identity import data_identity


def _spec(**train):
    return DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "train": [train]})


def test_the_identity_follows_the_files_and_the_spec(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("a\tb\n")
    spec = _spec(format="tsv", path=str(tsv))
    first = data_identity(spec, use_prefix=False)

    assert first and data_identity(spec, use_prefix=False) == first
    assert data_identity(spec, use_prefix=True) != first
    assert data_identity(_spec(format="tsv", path=str(tsv), limit=1), use_prefix=False) != first
    st = tsv.stat()
    os.utime(tsv, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    touched = data_identity(spec, use_prefix=False)
    assert touched != first
    tsv.write_text("a\tc\n")  # the same size
    assert data_identity(spec, use_prefix=False) != touched


def test_a_glob_or_directory_identity_changes_with_a_new_file(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "train-0.parquet").write_bytes(b"x")
    by_glob = _spec(format="parquet", path=str(tmp_path / "shards" / "train-*.parquet"))
    by_dir = _spec(format="parquet", path=str(tmp_path / "shards"))
    before = data_identity(by_glob, use_prefix=False), data_identity(by_dir, use_prefix=False)
    (tmp_path / "shards" / "train-1.parquet").write_bytes(b"y")
    after = data_identity(by_glob, use_prefix=False), data_identity(by_dir, use_prefix=False)
    assert None not in before and all(a != b for a, b in zip(before, after))


def test_a_missing_file_has_no_identity(tmp_path):
    assert data_identity(_spec(format="tsv", path=str(tmp_path / "gone.tsv")), use_prefix=False) is None
    assert data_identity(_spec(format="parquet", path=str(tmp_path / "none-*.parquet")), use_prefix=False) is None
    assert data_identity(_spec(format="generated", size=10), use_prefix=False)  # no files: the spec decides
