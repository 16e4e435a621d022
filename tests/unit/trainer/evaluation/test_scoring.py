from pathlib import Path

import pytest
import sacrebleu

from rosetta_trainer.evaluation.scoring import (
    bleu_tokenizer,
    corpus_scores,
    gender_correct,
    gender_scores,
    gender_words,
)

MTGENEVAL = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "mt-geneval"

HYPS = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over a lazy dog",
    "It is raining heavily in the city today.",
    "She reads books every evening before bed.",
    "The committee postponed its decision.",
]
REFS = [
    "The cat sat on the mat.",
    "The quick brown fox jumped over the lazy dog.",
    "Today it is raining hard in the city.",
    "Every evening she reads books before going to bed.",
    "The committee delayed the decision until next week.",
]


def test_bleu_and_chrf_match_sacrebleu():
    scores = corpus_scores(HYPS, REFS, "en")
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-9)
    assert 0 < scores["bleu"] < 100 and 0 < scores["chrf"] < 100
    assert scores["n"] == len(HYPS)


def test_chinese_uses_the_zh_tokenizer():
    hyps, refs = ["我喜欢吃苹果和香蕉。", "今天天气很好"], ["我喜欢吃香蕉和苹果。", "今天的天气非常好"]
    scores = corpus_scores(hyps, refs, "zh-Hans")
    assert "tok:zh" in scores["bleu_signature"]
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh").score)


def test_perfect_and_disjoint():
    perfect = corpus_scores(REFS, REFS, "en")
    assert perfect["bleu"] == pytest.approx(100.0)
    assert perfect["chrf"] == pytest.approx(100.0)
    disjoint = corpus_scores(["xyz qqq www vvv"] * 2, ["abc def ghi jkl"] * 2, "en")
    assert disjoint["bleu"] == 0.0
    assert disjoint["chrf"] == 0.0


def test_signatures():
    scores = corpus_scores(HYPS, REFS, "de")
    assert "nrefs:1" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert "nrefs:1" in scores["chrf_signature"] and "nc:6" in scores["chrf_signature"]


def test_metric_selection_and_errors():
    assert set(corpus_scores(HYPS, REFS, "en", metrics=("chrf", "gender"))) == {"n", "chrf", "chrf_signature"}
    with pytest.raises(ValueError, match="unknown metrics"):
        corpus_scores(HYPS, REFS, "en", metrics=("ter",))
    with pytest.raises(ValueError, match="equal lengths"):
        corpus_scores(HYPS, REFS[:2], "en")
    assert corpus_scores([], [], "en")["bleu"] is None


@pytest.mark.parametrize("lang, expected", [("de", "13a"), ("pt-BR", "13a"), ("zh", "zh"), ("zh_TW", "zh")])
def test_bleu_tokenizer(lang, expected):
    assert bleu_tokenizer(lang) == expected


def test_japanese_tokenizer_is_usable():
    # ja-mecab only when sacrebleu[ja] is installed; either way sacreBLEU must accept it.
    assert bleu_tokenizer("ja") in ("ja-mecab", "char")
    assert corpus_scores(["猫が好きです"], ["猫が好きです"], "ja")["bleu"] == pytest.approx(100.0)


# ---------------------------------------------------------------- gender


FEM_REF = "Sie hat ihr Buch der Lehrerin gegeben."
MASC_REF = "Er hat sein Buch dem Lehrer gegeben."


def test_gender_words_lowercase_and_strip_punctuation():
    assert gender_words("„Sie“ sagte: l’avocate, 2.000 Euro!") == {"sie", "sagte", "l", "avocate", "2", "000", "euro"}


@pytest.mark.parametrize(
    "hypothesis, correct",
    [
        (FEM_REF, True),
        ("Sie gab ihr Buch der Lehrerin.", True),
        ("Sie hat sein Buch der Lehrerin gegeben.", False),  # "sein" only in the masculine reference
        ("Er hat ihr Buch gegeben.", False),
        ("Das Buch wurde gegeben.", True),  # no gendered word either way: not wrong
        ("SEIN Buch.", False),
    ],
)
def test_gender_correct_on_hand_made_pairs(hypothesis, correct):
    assert gender_correct(hypothesis, FEM_REF, MASC_REF) is correct


def test_gender_scores_hand_made():
    hyps = [FEM_REF, "Sie hat sein Buch gegeben.", MASC_REF, MASC_REF]
    refs = [FEM_REF, FEM_REF, MASC_REF, MASC_REF]
    cfs = [MASC_REF, MASC_REF, FEM_REF, FEM_REF]
    genders = ["feminine", "feminine", "masculine", "masculine"]
    s = gender_scores(hyps, refs, genders, cfs, "de")
    assert s["count_feminine"] == 2 and s["correct_feminine"] == 1
    assert s["accuracy_feminine"] == pytest.approx(50.0)
    assert s["accuracy_masculine"] == pytest.approx(100.0)
    assert s["accuracy"] == pytest.approx(75.0)
    assert s["gender_gap_accuracy"] == pytest.approx(50.0)
    assert s["bleu_masculine"] == pytest.approx(100.0)
    assert s["gender_gap_bleu"] == pytest.approx(100.0 - s["bleu_feminine"])
    assert "tok:13a" in s["bleu_signature"]


def test_gender_scores_skip_ungendered_and_handle_missing_gender():
    s = gender_scores([FEM_REF, "x"], [FEM_REF, "y"], ["feminine", None], [MASC_REF, None], "de")
    assert s["count_feminine"] == 1 and s["count_masculine"] == 0
    assert s["accuracy_masculine"] is None and s["bleu_masculine"] is None
    assert s["gender_gap_accuracy"] is None and s["gender_gap_bleu"] is None
    with pytest.raises(ValueError, match="gender must be"):
        gender_scores([FEM_REF], [FEM_REF], ["neutral"], [MASC_REF], "de")
    with pytest.raises(ValueError, match="counterfactual"):
        gender_scores([FEM_REF], [FEM_REF], ["feminine"], [None], "de")


def _read(name: str) -> list[str]:
    path = MTGENEVAL / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path.read_text(encoding="utf-8").splitlines()


def test_mtgeneval_en_de_discriminates():
    fem = _read("geneval-sentences-feminine-dev.en_de.de")
    masc = _read("geneval-sentences-masculine-dev.en_de.de")
    assert len(fem) == len(masc) > 1000
    n = len(fem)

    right = gender_scores(fem, fem, ["feminine"] * n, masc, "de")
    assert right["accuracy_feminine"] == pytest.approx(100.0)
    assert right["bleu_feminine"] == pytest.approx(100.0)

    # Masculine translations of feminine sources: the metric must call them wrong.
    wrong = gender_scores(masc, fem, ["feminine"] * n, masc, "de")
    assert wrong["accuracy_feminine"] < 20.0
    assert wrong["bleu_feminine"] < 100.0

    both = gender_scores(fem + fem, fem + masc, ["feminine"] * n + ["masculine"] * n, masc + fem, "de")
    assert both["accuracy_feminine"] == pytest.approx(100.0)
    assert both["accuracy_masculine"] < 20.0
    assert both["gender_gap_accuracy"] < -80.0


# ----------------------------------------------------------- per language


def examples(hyps_refs_langs, genders=None, counterfactuals=None):
    from rosetta_trainer.data.examples import Example

    rows = list(hyps_refs_langs)
    genders = genders or [None] * len(rows)
    counterfactuals = counterfactuals or [None] * len(rows)
    return [Example(source="-", target=ref, target_lang=lang, gender=g, counterfactual=c)
            for (_, ref, lang), g, c in zip(rows, genders, counterfactuals)]


def test_evaluation_scores_each_language_alone_and_reports_their_mean():
    from rosetta_trainer.evaluation.evaluate import score

    # Three German sentences, two French: a mean weighted by sentences would differ.
    de_h = ["Das ist gut.", "Ich habe Hunger.", "Der Hund schläft im Garten."]
    de_r = ["Das ist gut.", "Ich bin hungrig.", "Der Hund schläft im Garten."]
    fr_h, fr_r = ["C'est bon.", "J'ai faim."], ["C'est bien.", "J'ai faim."]
    rows = [(de_h[0], de_r[0], "de"), (fr_h[0], fr_r[0], "fr"), (de_h[1], de_r[1], "de"), (fr_h[1], fr_r[1], "fr"),
            (de_h[2], de_r[2], "de")]

    out = score(examples(rows), [h for h, _, _ in rows], ["bleu", "chrf"])
    assert set(out["langs"]) == {"de", "fr"} and out["samples"] == 5
    for lang, h, r in (("de", de_h, de_r), ("fr", fr_h, fr_r)):
        # Each language with its own BLEU tokenizer, not one corpus score over the concatenation.
        assert out["langs"][lang] == corpus_scores(h, r, lang, ["bleu", "chrf"])
    for metric in ("bleu", "chrf"):
        # Unweighted: each language counts the same however many sentences it has.
        assert out[metric] == pytest.approx((out["langs"]["de"][metric] + out["langs"]["fr"][metric]) / 2)
    assert "bleu_signature" not in out  # two tokenizers: no single signature at the top


def test_evaluation_scores_gender_only_where_the_examples_have_one():
    from rosetta_trainer.evaluation.evaluate import score

    rows = [(FEM_REF, FEM_REF, "de"), ("Sie hat sein Buch gegeben.", FEM_REF, "de"),
            ("Elle est avocate.", "Elle est avocate.", "fr")]
    out = score(examples(rows, genders=["feminine", "feminine", None], counterfactuals=[MASC_REF, MASC_REF, None]),
                [h for h, _, _ in rows], ["bleu", "gender"])
    assert out["langs"]["de"]["gender"]["accuracy_feminine"] == pytest.approx(50.0)
    assert out["langs"]["de"]["gender"]["count_feminine"] == 2
    assert "gender" not in out["langs"]["fr"]
