"""format: parquet and format: arrow, read from what Hugging Face `datasets` itself writes
(`to_parquet`, `save_to_disk`), including the hub's nested translation records."""

from __future__ import annotations

import os

import datasets  # the dev extra's: it writes the fixtures as users' pipelines do
import pytest

from rosetta_contract.data_fields import DataSpec
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.data.reader import read_split

WMT = [{"translation": {"en": f"The house {i}.", "de": f"Das Haus {i}."}} for i in range(30)]


def read(source: dict, target_langs=("de",)) -> list:
    return read_split(DataSpec.model_validate({"sourceLang": "en", "targetLangs": list(target_langs),
                                               "train": [source]}), "train")


@pytest.fixture(autouse=True)
def quiet_datasets(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    datasets.disable_progress_bars()


def test_a_saved_dataset_dict_reads_the_split_asked_for_with_nested_columns(tmp_path):
    d = datasets.DatasetDict({"train": datasets.Dataset.from_list(WMT),
                              "validation": datasets.Dataset.from_list(WMT[:3])})
    d.save_to_disk(str(tmp_path / "wmt"))
    source = {"format": "arrow", "path": str(tmp_path / "wmt"), "split": "train",
              "sourceColumn": "translation.en", "targetColumn": "translation.de"}
    examples = read(source)
    assert [(e.source, e.target, e.target_lang) for e in examples[:2]] == [
        ("The house 0.", "Das Haus 0.", "de"), ("The house 1.", "Das Haus 1.", "de")]
    assert len(examples) == 30
    assert len(read({**source, "split": "validation"})) == 3
    assert len(read({**source, "limit": 5})) == 5
    with pytest.raises(DataError, match=r"a DatasetDict with splits train, validation; set split .*\(not 'dev'\)"):
        read({**source, "split": "dev"})


def test_a_saved_dataset_in_several_shards_reads_them_all_in_order(tmp_path):
    rows = [{"src": f"s{i}", "tgt": f"t{i}", "lang": "de" if i % 2 else "fr"} for i in range(40)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    assert len(list((tmp_path / "ds").glob("*.arrow"))) == 3
    examples = read({"format": "arrow", "path": str(tmp_path / "ds"), "sourceColumn": "src", "targetColumn": "tgt",
                     "langColumn": "lang"}, target_langs=("de", "fr"))
    assert [e.source for e in examples] == [r["src"] for r in rows]
    assert [e.target_lang for e in examples[:2]] == ["fr", "de"]


def test_parquet_files_and_directories_of_them(tmp_path):
    (tmp_path / "data").mkdir()
    datasets.Dataset.from_list(WMT[:10]).to_parquet(str(tmp_path / "data" / "train-00000.parquet"))
    datasets.Dataset.from_list(WMT[10:]).to_parquet(str(tmp_path / "data" / "train-00001.parquet"))
    columns = {"sourceColumn": "translation.en", "targetColumn": "translation.de"}
    one = read({"format": "parquet", "path": str(tmp_path / "data" / "train-00000.parquet"), **columns})
    assert len(one) == 10
    both = read({"format": "parquet", "path": str(tmp_path / "data"), **columns})
    assert [e.source for e in both] == [row["translation"]["en"] for row in WMT]


@pytest.mark.parametrize("columns, says", [
    ({"sourceColumn": "text"}, "no column 'text' (columns: translation)"),
    ({"sourceColumn": "translation.fr"}, "'translation' has no field 'fr' (fields: en, de)"),
    ({"sourceColumn": "translation.en.x"}, "column 'translation.en' is string, not a struct"),
])
def test_a_column_that_is_not_there_is_named(tmp_path, columns, says):
    datasets.Dataset.from_list(WMT).to_parquet(str(tmp_path / "t.parquet"))
    source = {"format": "parquet", "path": str(tmp_path / "t.parquet"), "sourceColumn": "translation.en",
              "targetColumn": "translation.de", **columns}
    with pytest.raises(DataError, match=f"t.parquet: {says}".replace("(", r"\(").replace(")", r"\)")):
        read(source)


def test_nulls_and_numbers_are_refused_with_the_row(tmp_path):
    rows = [{"src": "a", "tgt": "b", "n": 1}, {"src": None, "tgt": "c", "n": 2}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(DataError, match=r"t.parquet: row 1: 'src' is null, not text"):
        read({"format": "parquet", "path": str(tmp_path / "t.parquet"), "sourceColumn": "src", "targetColumn": "tgt"})
    with pytest.raises(DataError, match=r"column 'n' is int64, not text"):
        read({"format": "parquet", "path": str(tmp_path / "t.parquet"), "sourceColumn": "n", "targetColumn": "tgt"})


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_what_is_not_such_data_is_a_data_error_that_shows_nothing_of_it(tmp_path, fmt):
    secret = tmp_path / "environ.parquet"
    secret.write_text("AWS_SECRET_ACCESS_KEY=do-not-print-me\n")
    path = secret if fmt == "parquet" else tmp_path
    with pytest.raises(DataError) as info:
        read({"format": fmt, "path": str(path)})
    assert "do-not-print-me" not in str(info.value)
    assert "not a Parquet file" in str(info.value) if fmt == "parquet" else "no state.json" in str(info.value)


def test_a_device_is_not_read(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    with pytest.raises(DataError, match="a character device, not a regular file"):
        read({"format": "parquet", "path": "/dev/zero"})


def test_a_glob_picks_one_split_of_files_kept_side_by_side(tmp_path):
    pair = tmp_path / "opus-100" / "de-en"
    pair.mkdir(parents=True)
    for split, rows in (("train", WMT[:20]), ("validation", WMT[20:25]), ("test", WMT[25:])):
        datasets.Dataset.from_list(rows).to_parquet(str(pair / f"{split}-00000-of-00001.parquet"))
    source = {"format": "parquet", "path": str(pair / "train-*.parquet"), "sourceColumn": "translation.en",
              "targetColumn": "translation.de"}
    assert [e.source for e in read(source)] == [r["translation"]["en"] for r in WMT[:20]]
    with pytest.raises(DataError, match="no file matches"):
        read({**source, "path": str(pair / "dev-*.parquet")})
