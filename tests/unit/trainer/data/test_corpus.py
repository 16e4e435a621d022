"""rosetta_trainer.data.corpus: the built-in demo corpus and its number words."""

from __future__ import annotations

import gzip

import pytest

from rosetta_trainer.data import corpus
from rosetta_trainer.data import number_words as nw
from rosetta_trainer.data.corpus import generate_pairs, write_pairs
from rosetta_trainer.data.number_words import number_words


def test_generate_pairs_is_deterministic():
    a = generate_pairs("de", 300, seed=5)
    b = generate_pairs("de", 300, seed=5)
    assert a == b and len(a) == 300
    assert generate_pairs("de", 50, seed=5) == a[:50]
    assert generate_pairs("de", 300, seed=6) != a


def test_seeds_0_1_2_are_disjoint():
    english = [{en for en, _ in generate_pairs("fr", 1500, seed)} for seed in (0, 1, 2)]
    assert not english[0] & english[1]
    assert not english[0] & english[2]
    assert not english[1] & english[2]
    assert all(len(s) > 500 for s in english)


def test_seeds_in_the_same_bucket_overlap():
    # 0 and 16 share a partition: their sets overlap (date sentences are few), unlike 0 and 1.
    a = {en for en, _ in generate_pairs("de", 2000, 0)}
    b = {en for en, _ in generate_pairs("de", 2000, corpus.PARTITIONS)}
    assert a & b


def test_english_side_identical_across_target_langs():
    by_lang = {lang: generate_pairs(lang, 200, 3) for lang in corpus.SUPPORTED_LANGS}
    english = {lang: [en for en, _ in pairs] for lang, pairs in by_lang.items()}
    assert english["de"] == english["es"] == english["fr"]
    targets = {lang: [t for _, t in pairs] for lang, pairs in by_lang.items()}
    assert targets["de"] != targets["es"] != targets["fr"]


def test_generate_pairs_rejects_bad_args():
    with pytest.raises(ValueError, match="no 'it'"):
        generate_pairs("it", 3, 0)
    with pytest.raises(ValueError, match="size"):
        generate_pairs("de", -1, 0)
    assert generate_pairs("de", 0, 0) == []


def test_generated_sentences_look_right():
    for lang in corpus.SUPPORTED_LANGS:
        for en, tgt in generate_pairs(lang, 500, 0):
            assert en.endswith(".") and tgt.endswith(".")
            assert en[0].isupper() and tgt[0].isupper()
            assert "  " not in en and "  " not in tgt
            assert "{" not in tgt and "None" not in tgt


# ---------------------------------------------------------------------- number words


@pytest.mark.parametrize("n, words", [
    (0, "null"), (1, "eins"), (7, "sieben"), (16, "sechzehn"), (17, "siebzehn"), (21, "einundzwanzig"),
    (30, "dreißig"), (71, "einundsiebzig"), (100, "einhundert"), (101, "einhunderteins"),
    (121, "einhunderteinundzwanzig"), (1000, "eintausend"), (1001, "eintausendeins"),
    (2021, "zweitausendeinundzwanzig"), (3400, "dreitausendvierhundert"),
    (9999, "neuntausendneunhundertneunundneunzig"),
])
def test_german_numbers(n, words):
    assert number_words(n, "de") == words


@pytest.mark.parametrize("n, words", [
    (0, "zéro"), (1, "un"), (17, "dix-sept"), (21, "vingt et un"), (22, "vingt-deux"),
    (70, "soixante-dix"), (71, "soixante et onze"), (77, "soixante-dix-sept"), (80, "quatre-vingts"),
    (81, "quatre-vingt-un"), (90, "quatre-vingt-dix"), (91, "quatre-vingt-onze"),
    (97, "quatre-vingt-dix-sept"), (100, "cent"), (200, "deux cents"), (201, "deux cent un"),
    (280, "deux cent quatre-vingts"), (1000, "mille"), (1080, "mille quatre-vingts"),
    (2000, "deux mille"), (1984, "mille neuf cent quatre-vingt-quatre"),
])
def test_french_numbers(n, words):
    # Traditional spelling: hyphens only below 100, "et" in 21-71 ("soixante et onze").
    assert number_words(n, "fr") == words


@pytest.mark.parametrize("n, words", [
    (1, "uno"), (16, "dieciséis"), (21, "veintiuno"), (22, "veintidós"), (31, "treinta y uno"),
    (100, "cien"), (101, "ciento uno"), (500, "quinientos"), (1000, "mil"), (2001, "dos mil uno"),
    (1984, "mil novecientos ochenta y cuatro"),
])
def test_spanish_numbers(n, words):
    assert number_words(n, "es") == words


@pytest.mark.parametrize("n, words", [
    (0, "zero"), (21, "twenty-one"), (101, "one hundred and one"), (1040, "one thousand and forty"),
    (9999, "nine thousand nine hundred and ninety-nine"),
])
def test_english_numbers(n, words):
    assert number_words(n, "en") == words


def test_spanish_and_french_agreement_before_nouns():
    assert nw.es_cardinal(21, "f") == "veintiuna"
    assert nw.es_cardinal(21, "m") == "veintiún"
    assert nw.es_cardinal(31, "f") == "treinta y una"
    assert nw.es_cardinal(31, "m") == "treinta y un"
    assert nw.es_cardinal(231, "f") == "doscientas treinta y una"
    assert nw.es_cardinal(700, "f") == "setecientas"
    assert nw.es_cardinal(1000, "f") == "mil"
    assert nw.fr_cardinal(21, True) == "vingt et une"
    assert nw.fr_cardinal(81, True) == "quatre-vingt-une"
    assert nw.fr_cardinal(71, True) == "soixante et onze"


def test_agreement_in_generated_sentences():
    # Counts ending in 1 agree with the noun: "veintiuna manzanas", "veintiún libros", "vingt et une pommes".
    es = [t for _, t in generate_pairs("es", 5000, 0)]
    assert any("veintiuna " in t for t in es) and any("veintiún " in t for t in es)
    for t in es:
        assert "uno años" not in t and "uno euros" not in t  # "veintiún años", "treinta y un euros"
        for fem in ("manzanas", "sillas", "botellas", "tazas", "flores", "casas", "llaves", "camisas"):
            assert f"un {fem}" not in t and f"veintiún {fem}" not in t
        for masc in ("libros", "coches", "pájaros", "lápices", "perros", "gatos", "árboles"):
            assert f"una {masc}" not in t
    fr = [t for _, t in generate_pairs("fr", 5000, 0)]
    assert any("et une" in t for t in fr)
    for t in fr:
        for fem in ("pommes", "chaises", "bouteilles", "voitures", "tasses", "fleurs", "maisons", "clés"):
            assert f" un {fem}" not in t and f"-un {fem}" not in t


def test_dates_and_years():
    assert nw.de_ordinal_dative(1) == "ersten"
    assert nw.de_ordinal_dative(3) == "dritten"
    assert nw.de_ordinal_dative(7) == "siebten"
    assert nw.de_ordinal_dative(21) == "einundzwanzigsten"
    assert nw.de_year(1984) == "neunzehnhundertvierundachtzig"
    assert nw.de_year(2005) == "zweitausendfünf"
    assert nw.en_year(1905) == "nineteen oh five"
    assert nw.en_year(1900) == "nineteen hundred"
    assert nw.en_year(2007) == "two thousand and seven"
    assert nw.en_ordinal(20) == "twentieth"
    assert nw.en_ordinal(22) == "twenty-second"
    assert nw.fr_day(1) == "premier"
    assert nw.es_day(1) == "primero"


def test_number_words_range_and_lang():
    with pytest.raises(ValueError, match="0-9999"):
        number_words(10000, "de")
    with pytest.raises(ValueError, match="-1"):
        number_words(-1, "de")
    with pytest.raises(ValueError, match="no number words for 'it'"):
        number_words(3, "it")


# ---------------------------------------------------------------------- write_pairs


def test_write_pairs_plain(tmp_path):
    written = write_pairs(tmp_path / "out", "en", "fr", {"train": (30, 0), "test": (5, 2)})
    assert set(written) == {"train", "test"}
    src, tgt = written["train"]
    assert (src.name, tgt.name) == ("train.en", "train.fr")
    en = src.read_text(encoding="utf-8").splitlines()
    fr = tgt.read_text(encoding="utf-8").splitlines()
    assert list(zip(en, fr)) == generate_pairs("fr", 30, 0)
    assert len(written["test"][0].read_text(encoding="utf-8").splitlines()) == 5


def test_write_pairs_gz_is_reproducible(tmp_path):
    a = write_pairs(tmp_path / "a", "en", "de", {"validation": (20, 1)}, gzip_files=True)
    b = write_pairs(tmp_path / "b", "en", "de", {"validation": (20, 1)}, gzip_files=True)
    src, tgt = a["validation"]
    assert (src.name, tgt.name) == ("validation.en.gz", "validation.de.gz")
    assert src.read_bytes() == b["validation"][0].read_bytes()
    en = gzip.decompress(src.read_bytes()).decode("utf-8").splitlines()
    de = gzip.decompress(tgt.read_bytes()).decode("utf-8").splitlines()
    assert list(zip(en, de)) == generate_pairs("de", 20, 1)


def test_write_pairs_default_splits_and_source_check(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="from 'en'"):
        write_pairs(tmp_path, "de", "fr")
    monkeypatch.setattr(corpus, "generate_pairs", lambda lang, size, seed: [(f"{size}/{seed}", lang)])
    written = write_pairs(tmp_path, "en", "es")
    assert {split: paths[0].read_text() for split, paths in written.items()} == {
        "train": "20000/0\n", "validation": "500/1\n", "test": "500/2\n",
    }
