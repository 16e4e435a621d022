"""Quality scores: sacreBLEU BLEU and chrF, MT-GenEval gender metrics, and ROUGE for summaries.

Torch-free, and on plain lists of strings, so the evaluator, the CLI and the
tests can all call it.

Every score is on sacreBLEU's 0-100 scale and comes with a signature string
(sacreBLEU's own, and one in the same spirit for ROUGE), so a number in
metrics.jsonl can be reproduced and compared with published results.
"""

from __future__ import annotations

import functools
import importlib.metadata
import unicodedata
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import regex  # sacreBLEU's own dependency; unlike re it has \p{M}
from sacrebleu.metrics import BLEU, CHRF

from rosetta_contract.metrics import METRICS, ROUGE_METRICS

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

GENDERS = ("feminine", "masculine")


# ----------------------------------------------------------------- BLEU / chrF


@functools.lru_cache(maxsize=None)
def _tokenizer_available(name: str) -> bool:
    try:
        BLEU(tokenize=name)
    except (ImportError, RuntimeError):  # sacreBLEU raises RuntimeError for missing MeCab
        return False
    return True


def base_language(lang: str) -> str:
    """'pt-BR', 'zh_Hant' -> 'pt', 'zh'."""
    base: str = regex.split(r"[-_]", lang or "", maxsplit=1)[0].lower()
    return base


def bleu_tokenizer(target_lang: str) -> str:
    """The sacreBLEU tokenizer for BLEU in this target language.

    13a (sacreBLEU's default, and what WMT results use) for languages written
    with spaces. Chinese gets sacreBLEU's "zh" tokenizer. Japanese and Korean
    get sacreBLEU's MeCab tokenizers when `sacrebleu[ja]` / `sacrebleu[ko]` are
    installed; otherwise Japanese falls back to "char" (it has no spaces, so
    13a would score whole clauses as single words) and Korean to 13a (it does
    separate words with spaces). The choice is always in the signature.
    """
    lang = base_language(target_lang)
    if lang == "zh":
        return "zh"
    if lang == "ja":
        return "ja-mecab" if _tokenizer_available("ja-mecab") else "char"
    if lang == "ko":
        return "ko-mecab" if _tokenizer_available("ko-mecab") else "13a"
    return "13a"


def _check_parallel(**lists: Sequence[object]) -> int:
    lengths = {name: len(values) for name, values in lists.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"lists must have equal lengths, got {lengths}")
    return next(iter(lengths.values()))


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    target_lang: str,
    metrics: Iterable[str] = METRICS,
) -> dict[str, Any]:
    """Corpus BLEU and chrF (one reference per hypothesis) with their signatures.

    Returns e.g. {"bleu": 27.3, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|...",
    "chrf": 55.1, "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|...", "n": 500}.
    chrF is sacreBLEU's default chrF2 (character 6-grams, no word n-grams).
    "gender" in `metrics` is accepted and ignored: see gender_scores.
    With no sentences, scores are None.
    """
    n = _check_parallel(hypotheses=hypotheses, references=references)
    wanted = [m for m in metrics if m != "gender"]
    unknown = sorted(set(wanted) - set(METRICS))
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; known: {list(METRICS)} (and 'gender')")
    out: dict[str, Any] = {"n": n}
    hyps, refs = list(hypotheses), [list(references)]
    for name in wanted:
        metric = BLEU(tokenize=bleu_tokenizer(target_lang)) if name == "bleu" else CHRF()
        # sacreBLEU fails with IndexError on an empty corpus.
        out[name] = metric.corpus_score(hyps, refs).score if n else None
        out[f"{name}_signature"] = str(metric.get_signature()) if n else None
    return out


# ------------------------------------------------------------------------ ROUGE

_SPACELESS = r"\p{Han}\p{Hiragana}\p{Katakana}"
_ROUGE_TOKEN = regex.compile(rf"[{_SPACELESS}]|(?:(?![{_SPACELESS}])[\p{{L}}\p{{M}}\p{{N}}])+")


class UnicodeTokenizer:
    """Lowercased runs of Unicode letters, marks and digits; Chinese and Japanese per character.

    rouge-score's default tokenizer keeps only [a-z0-9]: "Müller" becomes "m", "ller" and a
    Russian, Hindi or Chinese summary becomes no tokens at all, so every score would be 0 or
    computed on the digits alone. Han and kana characters are single tokens, as is usual for
    Chinese and Japanese ROUGE, since those scripts put no spaces between words.

    rouge-score only calls tokenize(), so this does not subclass its Tokenizer: importing
    rouge-score (and the NLTK it loads) is left to the first ROUGE score, not every trainer's start.
    """

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = _ROUGE_TOKEN.findall(unicodedata.normalize("NFC", text).lower())
        return tokens


@functools.lru_cache(maxsize=None)
def _rouge_scorer(metrics: tuple[str, ...], english: bool) -> RougeScorer:
    from rouge_score import rouge_scorer

    if english:
        return rouge_scorer.RougeScorer(list(metrics), use_stemmer=True, split_summaries=False)
    return rouge_scorer.RougeScorer(list(metrics), tokenizer=UnicodeTokenizer(), split_summaries=False)


def rouge_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    metrics: Iterable[str] = ("rouge1", "rouge2", "rougeL"),
    lang: str = "en",
) -> dict[str, Any]:
    """Corpus ROUGE with Google's rouge-score: the mean over examples of each pair's F1, x100.

    English uses rouge-score's own tokenizer and Porter stemmer, the setting behind published
    XSum and CNN/DailyMail results. Other languages use UnicodeTokenizer and no stemming (the
    Porter stemmer is English-only and would clip German or French words at random). rougeLsum
    is the summary-level LCS over sentences split on newlines, rouge-score's convention (one
    CNN/DailyMail highlight per line); for one-line summaries it equals rougeL.

    Returns e.g. {"rouge1": 41.2, "rouge2": 18.3, "rougeL": 33.9, "rouge_signature":
    "rouge-score:0.1.2|tok:default|stem:porter|agg:mean-f1", "n": 500}. With no pairs, scores are None.
    """
    n = _check_parallel(hypotheses=hypotheses, references=references)
    wanted = tuple(metrics)
    unknown = sorted(set(wanted) - set(ROUGE_METRICS))
    if unknown:
        raise ValueError(f"unknown ROUGE metrics {unknown}; known: {list(ROUGE_METRICS)}")
    english = base_language(lang) == "en"
    out: dict[str, Any] = {"n": n, **{name: None for name in wanted}}
    if n and wanted:
        scorer = _rouge_scorer(wanted, english)
        totals = dict.fromkeys(wanted, 0.0)
        for hyp, ref in zip(hypotheses, references):
            for name, score in scorer.score(ref, hyp).items():  # score(target, prediction)
                totals[name] += score.fmeasure
        out.update({name: 100.0 * total / n for name, total in totals.items()})
    tokenizer = "default|stem:porter" if english else "unicode|stem:none"
    out["rouge_signature"] = f"rouge-score:{importlib.metadata.version('rouge-score')}|tok:{tokenizer}|agg:mean-f1"
    return out


# --------------------------------------------------------------- gender metrics

# Marks (\p{M}) belong to words: re's \w would split Hindi or decomposed accents.
_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+")


def gender_words(text: str) -> set[str]:
    """Lowercased words of a sentence, punctuation dropped (MT-GenEval style)."""
    return set(_WORD.findall(unicodedata.normalize("NFC", text).lower()))


def gender_correct(hypothesis: str, reference: str, counterfactual: str) -> bool:
    """False when the hypothesis uses a word only the other-gender reference has.

    Follows MT-GenEval's accuracy_metric.py (amazon-science/machine-translation-
    gender-eval): both references are reduced to word sets, the words unique
    to the counterfactual (its set minus the reference's set) are the
    wrong-gender words, and a hypothesis containing any of them is incorrect;
    otherwise (including a hypothesis with neither gender's words) it is
    correct. The one difference is tokenisation: the official script replaces
    ASCII punctuation with spaces and splits on whitespace, so non-ASCII
    punctuation („“ « » ¿ ¡ and typographic apostrophes) stays glued to words
    there; here a word is a run of Unicode letters, marks and digits (after NFC
    normalisation), so "l’avocate" and "l'avocate" both yield "avocate". On
    MT-GenEval's references, which use ASCII punctuation, the two agree.
    """
    wrong = gender_words(counterfactual) - gender_words(reference)
    return not (gender_words(hypothesis) & wrong)


def _normalise_gender(gender: str) -> str:
    g = gender.lower()
    aliases = {"f": "feminine", "female": "feminine", "m": "masculine", "male": "masculine"}
    g = aliases.get(g, g)
    if g not in GENDERS:
        raise ValueError(f"gender must be one of {GENDERS}, got {gender!r}")
    return g


def _percent(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole else None


def _gap(scores: dict[str, Any], metric: str) -> float | None:
    fem, masc = scores[f"{metric}_feminine"], scores[f"{metric}_masculine"]
    return None if fem is None or masc is None else masc - fem


def gender_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    genders: Sequence[str | None],
    counterfactuals: Sequence[str | None],
    target_lang: str,
) -> dict[str, Any]:
    """MT-GenEval metrics (Currey et al., EMNLP 2022) for counterfactual pairs.

    For pair i, `references[i]` is the reference in the gender `genders[i]`
    ("feminine"/"masculine") and `counterfactuals[i]` the other-gender
    reference of the same sentence. Items whose gender is None (a non-gendered
    corpus mixed in) are skipped.

    Returns, per gender g: "bleu_<g>" (corpus BLEU of that subset, tokenizer as
    in corpus_scores), "accuracy_<g>" (percent of hypotheses with no
    wrong-gender word, see gender_correct), "count_<g>", "correct_<g>"; and
    "accuracy" over both, "gender_gap_bleu" and "gender_gap_accuracy"
    (masculine minus feminine: positive means the model favours masculine),
    "bleu_signature". A gender with no items has None scores, and so do gaps.
    """
    _check_parallel(hypotheses=hypotheses, references=references, genders=genders,
                    counterfactuals=counterfactuals)
    groups: dict[str, list[tuple[str, str, str]]] = {g: [] for g in GENDERS}
    for hyp, ref, gender, cf in zip(hypotheses, references, genders, counterfactuals):
        if gender is None:
            continue
        if cf is None:
            raise ValueError(f"a {gender} item has no counterfactual reference: {ref!r}")
        groups[_normalise_gender(gender)].append((hyp, ref, cf))

    out: dict[str, Any] = {}
    signature = None
    for gender, items in groups.items():
        hyps = [h for h, _, _ in items]
        refs = [r for _, r, _ in items]
        correct = sum(gender_correct(h, r, cf) for h, r, cf in items)
        bleu = corpus_scores(hyps, refs, target_lang, metrics=("bleu",))
        signature = signature or bleu["bleu_signature"]
        out[f"bleu_{gender}"] = bleu["bleu"]
        out[f"accuracy_{gender}"] = _percent(correct, len(items))
        out[f"count_{gender}"] = len(items)
        out[f"correct_{gender}"] = correct
    out["accuracy"] = _percent(
        sum(out[f"correct_{g}"] for g in GENDERS), sum(out[f"count_{g}"] for g in GENDERS)
    )
    out["gender_gap_bleu"] = _gap(out, "bleu")
    out["gender_gap_accuracy"] = _gap(out, "accuracy")
    out["bleu_signature"] = signature
    return out
