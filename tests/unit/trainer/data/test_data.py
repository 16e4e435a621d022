"""rosetta_trainer.data.reader: every DataSource format, read from files the tests write."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rosetta_contract.data_fields import DataSpec
from rosetta_trainer.data import corpus
from rosetta_trainer.data.examples import DataError, Example
from rosetta_trainer.data.reader import read_source, read_split

MT_GENEVAL = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "mt-geneval"


def spec(sources, target_langs=("de",), split="train", **extra) -> DataSpec:
    return DataSpec.model_validate(
        {"sourceLang": "en", "targetLangs": list(target_langs), split: sources, **extra}
    )


def read(source: dict, target_langs=("de",)) -> list[Example]:
    return read_split(spec([source], target_langs), "train")


def write(path: Path, data: bytes | str) -> Path:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)
    return path


# --------------------------------------------------------------------------- pairs


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_pairs_plain_and_gz(tmp_path, suffix):
    src = write(tmp_path / f"a.en{suffix}", "Hello.\nGood day.\nThree apples.\n")
    tgt = write(tmp_path / f"a.de{suffix}", "Hallo.\nGuten Tag.\nDrei Äpfel.\n")
    examples = read({"format": "pairs", "source": str(src), "target": str(tgt)})
    assert examples == [
        Example("Hello.", "Hallo.", "de"),
        Example("Good day.", "Guten Tag.", "de"),
        Example("Three apples.", "Drei Äpfel.", "de"),
    ]


def test_pairs_carriage_return_inside_line_does_not_split_it(tmp_path):
    src = write(tmp_path / "a.en", "one\rstill one\ntwo\n")
    tgt = write(tmp_path / "a.de", "eins\nzwei\r\n")
    examples = read({"format": "pairs", "source": str(src), "target": str(tgt)})
    assert [(e.source, e.target) for e in examples] == [("one\rstill one", "eins"), ("two", "zwei")]


def test_pairs_line_count_mismatch_names_both_files_and_counts(tmp_path):
    src = write(tmp_path / "a.en", "a\nb\nc\n")
    tgt = write(tmp_path / "a.de", "x\ny\n")
    with pytest.raises(DataError) as err:
        read({"format": "pairs", "source": str(src), "target": str(tgt)})
    msg = str(err.value)
    assert f"{src} has 3 lines" in msg and f"{tgt} has 2" in msg


def test_pairs_mismatch_longer_target(tmp_path):
    src = write(tmp_path / "a.en", "a\n")
    tgt = write(tmp_path / "a.de", "x\ny\nz\nw\n")
    with pytest.raises(DataError, match=r"has 1 lines, .* has 4"):
        read({"format": "pairs", "source": str(src), "target": str(tgt)})


def test_pairs_limit_reads_only_the_head(tmp_path):
    src = write(tmp_path / "a.en", "".join(f"s{i}\n" for i in range(10)))
    tgt = write(tmp_path / "a.de", "".join(f"t{i}\n" for i in range(10)))
    examples = read({"format": "pairs", "source": str(src), "target": str(tgt), "limit": 4})
    assert [e.source for e in examples] == ["s0", "s1", "s2", "s3"]
    assert [e.target for e in examples] == ["t0", "t1", "t2", "t3"]


def test_pairs_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "a.en", b"fine\nalso fine\nbad \xff byte\n")
    tgt = write(tmp_path / "a.de", "x\ny\nz\n")
    with pytest.raises(DataError, match=rf"{src}:3: not UTF-8"):
        read({"format": "pairs", "source": str(src), "target": str(tgt)})


def test_pairs_bom_is_stripped(tmp_path):
    src = write(tmp_path / "a.en", b"\xef\xbb\xbfHello\n")
    tgt = write(tmp_path / "a.de", "Hallo\n")
    [example] = read({"format": "pairs", "source": str(src), "target": str(tgt)})
    assert example.source == "Hello"


def test_pairs_target_lang_for_multilingual(tmp_path):
    src = write(tmp_path / "a.en", "Hello\n")
    tgt = write(tmp_path / "a.fr", "Bonjour\n")
    [example] = read(
        {"format": "pairs", "source": str(src), "target": str(tgt), "targetLang": "fr"}, ("de", "fr")
    )
    assert example.target_lang == "fr"


def test_missing_file_mentions_cwd(tmp_path):
    with pytest.raises(DataError) as err:
        read({"format": "pairs", "source": "nowhere/a.en", "target": "nowhere/a.de"})
    assert "nowhere/a.en" in str(err.value)
    assert str(Path.cwd()) in str(err.value)


def test_relative_paths_resolve_against_cwd(tmp_path, monkeypatch):
    write(tmp_path / "a.en", "Hello\n")
    write(tmp_path / "a.de", "Hallo\n")
    monkeypatch.chdir(tmp_path)
    [example] = read({"format": "pairs", "source": "a.en", "target": "a.de"})
    assert example.target == "Hallo"


# ----------------------------------------------------------------------- tsv / csv


def test_tsv_named_columns_no_quoting(tmp_path):
    path = write(tmp_path / "c.tsv", 'id\ten\tde\n1\tHe said "hi\tEr sagte "hallo\n2\tOK\tGut\n')
    examples = read({"format": "tsv", "path": str(path), "sourceColumn": "en", "targetColumn": "de"})
    assert examples == [Example('He said "hi', 'Er sagte "hallo', "de"), Example("OK", "Gut", "de")]


def test_tsv_gz(tmp_path):
    path = write(tmp_path / "c.tsv.gz", "source\ttarget\nHello\tHallo\n")
    assert read({"format": "tsv", "path": str(path)}) == [Example("Hello", "Hallo", "de")]


def test_csv_quoted_comma_and_newline(tmp_path):
    path = write(
        tmp_path / "c.csv",
        'en,de\n"Hello, world","Hallo, Welt"\n"two\nlines","zwei ""Zeilen"""\nplain,schlicht\n',
    )
    examples = read({"format": "csv", "path": str(path), "sourceColumn": "en", "targetColumn": "de"})
    assert [(e.source, e.target) for e in examples] == [
        ("Hello, world", "Hallo, Welt"),
        ("two\nlines", 'zwei "Zeilen"'),
        ("plain", "schlicht"),
    ]


def test_table_missing_column_names_the_column_not_the_header(tmp_path):
    # The header row is the file's text: a spec may point at any file, so it is never quoted.
    path = write(tmp_path / "c.tsv", "en\tde\nHello\tHallo\n")
    with pytest.raises(DataError) as err:
        read({"format": "tsv", "path": str(path), "sourceColumn": "english", "targetColumn": "de"})
    assert str(err.value) == f"{path}:1: no column 'english' in the header row (2 columns)"


def test_table_lang_column_filters_to_target_langs(tmp_path):
    path = write(
        tmp_path / "c.csv",
        "source,target,lang\nHello,Hallo,de\nHello,Bonjour,fr\nHello,Hola,es\nBye,Tschüss,de\n",
    )
    examples = read({"format": "csv", "path": str(path), "langColumn": "lang"}, ("de", "fr"))
    assert [(e.target, e.target_lang) for e in examples] == [
        ("Hallo", "de"), ("Bonjour", "fr"), ("Tschüss", "de"),
    ]


def test_table_lang_column_with_no_matching_rows_is_an_error(tmp_path):
    path = write(tmp_path / "c.csv", "source,target,lang\nHello,Hola,es\n")
    with pytest.raises(DataError, match="no row has a 'lang'"):
        read({"format": "csv", "path": str(path), "langColumn": "lang"}, ("de", "fr"))


def test_table_limit(tmp_path):
    path = write(tmp_path / "c.tsv", "source\ttarget\n" + "".join(f"s{i}\tt{i}\n" for i in range(20)))
    examples = read({"format": "tsv", "path": str(path), "limit": 5})
    assert [e.source for e in examples] == [f"s{i}" for i in range(5)]


def test_table_wrong_field_count_names_line(tmp_path):
    path = write(tmp_path / "c.tsv", "source\ttarget\na\tb\nonly one field\n")
    with pytest.raises(DataError, match=rf"{path}:3: 1 fields, the header has 2"):
        read({"format": "tsv", "path": str(path)})


def test_table_several_langs_without_lang_column_is_an_error(tmp_path):
    path = write(tmp_path / "c.tsv", "source\ttarget\na\tb\n")
    with pytest.raises(DataError, match="cannot tell the target language"):
        read({"format": "tsv", "path": str(path)}, ("de", "fr"))


# --------------------------------------------------------------------------- jsonl


def test_jsonl_fields(tmp_path):
    lines = [{"en": "Hello", "xx": "Hallo", "lang": "de"}, {"en": "Hi", "xx": "Salut", "lang": "fr"},
             {"en": "Hey", "xx": "Hola", "lang": "es"}]
    path = write(tmp_path / "d.jsonl", "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in lines) + "\n")
    examples = read(
        {"format": "jsonl", "path": str(path), "sourceColumn": "en", "targetColumn": "xx", "langColumn": "lang"},
        ("de", "fr"),
    )
    assert examples == [Example("Hello", "Hallo", "de"), Example("Hi", "Salut", "fr")]


def test_jsonl_bad_json_names_file_and_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"source": "a", "target": "b"}\n{"source": "a", oops}\n')
    with pytest.raises(DataError, match=rf"{path}:2: invalid JSON"):
        read({"format": "jsonl", "path": str(path)})


def test_jsonl_non_string_field(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"source": "a", "target": 7}\n')
    with pytest.raises(DataError, match=rf"{path}:1: field 'target' is int, not a string"):
        read({"format": "jsonl", "path": str(path)})


def test_jsonl_missing_field_names_the_field_not_the_object_keys(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"src": "a", "target": "b"}\n')
    with pytest.raises(DataError) as err:
        read({"format": "jsonl", "path": str(path)})
    assert str(err.value) == f"{path}:1: no field 'source' in the object (2 fields)"


def test_jsonl_limit(tmp_path):
    path = write(tmp_path / "d.jsonl", "".join(json.dumps({"source": f"s{i}", "target": f"t{i}"}) + "\n"
                                               for i in range(9)))
    assert [e.source for e in read({"format": "jsonl", "path": str(path), "limit": 3})] == ["s0", "s1", "s2"]


# ----------------------------------------------------------------------- mtgeneval


def test_mt_geneval_data_is_there():
    names = sorted(p.name for p in MT_GENEVAL.iterdir())
    for gender in ("feminine", "masculine"):
        for side in ("en", "de"):
            assert f"geneval-sentences-{gender}-dev.en_de.{side}" in names


def _geneval_lines(gender: str, lang: str, side: str) -> list[str]:
    path = MT_GENEVAL / f"geneval-sentences-{gender}-dev.en_{lang}.{side}"
    return path.read_text(encoding="utf-8").splitlines()


def test_mtgeneval_real_data():
    examples = read({"format": "mtgeneval", "path": str(MT_GENEVAL)})
    fem_en, fem_de = _geneval_lines("feminine", "de", "en"), _geneval_lines("feminine", "de", "de")
    masc_en, masc_de = _geneval_lines("masculine", "de", "en"), _geneval_lines("masculine", "de", "de")
    assert len(examples) == 2 * len(fem_en) == 2 * len(masc_de)
    assert [e.gender for e in examples[:4]] == ["feminine", "masculine", "feminine", "masculine"]
    assert all(e.target_lang == "de" for e in examples)
    for k in (0, 1, 7, len(fem_en) - 1):
        fem, masc = examples[2 * k], examples[2 * k + 1]
        assert fem.pair_id == masc.pair_id == k
        assert (fem.source, fem.target, fem.counterfactual) == (fem_en[k], fem_de[k], masc_de[k])
        assert (masc.source, masc.target, masc.counterfactual) == (masc_en[k], masc_de[k], fem_de[k])
    # The first pair differs only in "ihr"/"ihm".
    assert " ihr " in examples[0].target and " ihm " in examples[0].counterfactual


@pytest.mark.parametrize("limit, pairs", [(6, 3), (7, 3), (2, 1)])
def test_mtgeneval_limit_keeps_pairs_whole(limit, pairs):
    examples = read({"format": "mtgeneval", "path": str(MT_GENEVAL), "limit": limit})
    assert len(examples) == 2 * pairs
    assert [e.pair_id for e in examples] == [i for i in range(pairs) for _ in range(2)]
    assert {e.gender for e in examples[::2]} == {"feminine"} and {e.gender for e in examples[1::2]} == {"masculine"}


def test_mtgeneval_limit_of_one():
    [example] = read({"format": "mtgeneval", "path": str(MT_GENEVAL), "limit": 1})
    assert (example.gender, example.pair_id) == ("feminine", 0)


def test_mtgeneval_multilingual_quota():
    examples = read({"format": "mtgeneval", "path": str(MT_GENEVAL), "limit": 10}, ("de", "fr"))
    by_lang = [(e.target_lang, e.pair_id, e.gender[0]) for e in examples]
    assert by_lang == [("de", 0, "f"), ("de", 0, "m"), ("de", 1, "f"), ("de", 1, "m"), ("de", 2, "f"),
                       ("de", 2, "m"), ("fr", 0, "f"), ("fr", 0, "m"), ("fr", 1, "f"), ("fr", 1, "m")]
    fr = _geneval_lines("feminine", "fr", "fr")
    assert examples[6].target == fr[0]


def _tiny_geneval(root: Path, lang: str = "de", skip: str | None = None) -> None:
    root.mkdir(exist_ok=True)
    text = {("feminine", "en"): ["She is a doctor.", "Her book."],
            ("masculine", "en"): ["He is a doctor.", "His book."],
            ("feminine", lang): ["Sie ist Ärztin.", "Ihr Buch."],
            ("masculine", lang): ["Er ist Arzt.", "Sein Buch."]}
    for (gender, side), lines in text.items():
        name = f"geneval-sentences-{gender}-dev.en_{lang}.{side}"
        if name != skip:
            (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_mtgeneval_synthetic_dir(tmp_path):
    _tiny_geneval(tmp_path / "g")
    examples = read({"format": "mtgeneval", "path": str(tmp_path / "g")})
    assert [(e.target, e.counterfactual) for e in examples] == [
        ("Sie ist Ärztin.", "Er ist Arzt."), ("Er ist Arzt.", "Sie ist Ärztin."),
        ("Ihr Buch.", "Sein Buch."), ("Sein Buch.", "Ihr Buch."),
    ]


def test_mtgeneval_incomplete_files(tmp_path):
    missing = "geneval-sentences-masculine-dev.en_de.de"
    _tiny_geneval(tmp_path / "g", skip=missing)
    with pytest.raises(DataError) as err:
        read({"format": "mtgeneval", "path": str(tmp_path / "g")})
    assert "incomplete" in str(err.value) and missing in str(err.value)
    assert "feminine-dev.en_de.de" not in str(err.value)


def test_mtgeneval_line_count_mismatch(tmp_path):
    _tiny_geneval(tmp_path / "g")
    (tmp_path / "g" / "geneval-sentences-masculine-dev.en_de.de").write_text("Er ist Arzt.\n", encoding="utf-8")
    with pytest.raises(DataError, match="geneval-sentences-masculine-dev.en_de.de has 1"):
        read({"format": "mtgeneval", "path": str(tmp_path / "g")})


def test_mtgeneval_no_files_for_any_lang(tmp_path):
    _tiny_geneval(tmp_path / "g", lang="it")
    with pytest.raises(DataError, match="for any of de"):
        read({"format": "mtgeneval", "path": str(tmp_path / "g")})


def test_mtgeneval_needs_a_directory(tmp_path):
    f = write(tmp_path / "file.txt", "x\n")
    with pytest.raises(DataError, match="needs the MT-GenEval directory"):
        read({"format": "mtgeneval", "path": str(f)})


# ----------------------------------------------------------------------- generated


def test_generated_single_lang_matches_corpus():
    examples = read({"format": "generated", "size": 7, "seed": 3})
    assert [(e.source, e.target) for e in examples] == corpus.generate_pairs("de", 7, 3)
    assert {e.target_lang for e in examples} == {"de"}


def test_generated_multilingual_quota_split():
    examples = read({"format": "generated", "size": 100, "limit": 7}, ("de", "es", "fr"))
    assert [e.target_lang for e in examples] == ["de"] * 3 + ["es"] * 2 + ["fr"] * 2
    assert [(e.source, e.target) for e in examples[3:5]] == corpus.generate_pairs("es", 2, 0)


def test_generated_size_caps_quota():
    examples = read({"format": "generated", "size": 2, "limit": 10}, ("de", "fr"))
    assert [e.target_lang for e in examples] == ["de", "de", "fr", "fr"]


def test_generated_unsupported_lang():
    with pytest.raises(DataError, match="supports de, es, fr"):
        read({"format": "generated", "size": 3}, ("it",))


def test_read_split_order_and_bad_split(tmp_path):
    data = spec([{"format": "generated", "size": 2, "seed": 1}, {"format": "generated", "size": 1, "seed": 2}],
                split="validation")
    examples = read_split(data, "validation")
    assert [(e.source, e.target) for e in examples] == (
        corpus.generate_pairs("de", 2, 1) + corpus.generate_pairs("de", 1, 2))
    assert read_split(data, "train") == []
    with pytest.raises(ValueError, match="split must be"):
        read_split(data, "dev")
    assert read_source(data.validation[1], data) == examples[2:]


# -------------------------------------------------------------------------- prefix


def test_model_inputs_carry_the_t5_task_prefix_of_each_example():
    from rosetta_trainer.evaluation.evaluate import model_inputs

    examples = [Example("Three apples.", "Drei Äpfel.", "de"), Example("x", "y", "fr"), Example("x", "y", "xx")]
    assert model_inputs(examples, "en", True) == [
        "translate English to German: Three apples.", "translate English to French: x", "translate English to xx: x"]
    assert model_inputs(examples[:1], "en", False) == ["Three apples."]
