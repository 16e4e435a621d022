"""spec.task: summarization: its config rules, ROUGE against hand-computed values, prefixes, demo corpus."""

import pytest

from rosetta_contract.documents import parse_document
from rosetta_contract.languages import task_prefix
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.commands.train import _print_result
from rosetta_trainer.data.corpus import PARTITIONS, generate_articles
from rosetta_trainer.data.examples import DataError, Example
from rosetta_trainer.data.reader import read_split
from rosetta_trainer.evaluation.evaluate import model_inputs, primary_metric, score
from rosetta_trainer.evaluation.scoring import UnicodeTokenizer, rouge_scores


def document(task="summarization", **spec_overrides):
    spec = {
        "task": task,
        "model": {"architecture": "t5", "size": "tiny"},
        "tokenizer": {"train": {"vocabSize": 500}},
        "data": {"sourceLang": "en", "train": [{"format": "generated", "size": 20}],
                 "validation": [{"format": "generated", "size": 5, "seed": 2}]},
        "training": {"maxSteps": 10},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "s"},
            "spec": spec}


def errors_of(raw) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_document(raw)
    return dict(info.value.errors)


# ---------------------------------------------------------------------- config


def test_summarization_defaults_to_same_language_summaries_rouge_and_the_t5_prefix():
    spec = parse_document(document()).spec
    assert spec.task == "summarization"
    assert spec.data.target_langs == ["en"]
    assert spec.evaluation.metrics == ["rouge1", "rouge2", "rougeL"]
    assert spec.uses_task_prefix()  # a T5 model, as for translation
    assert primary_metric(spec) == "rougeL"


def test_translation_keeps_its_defaults_and_rules():
    spec = parse_document(document("translation", data={"sourceLang": "en", "targetLangs": ["de"]},
                                   tokenizer={"path": "/tok"})).spec
    assert spec.evaluation.metrics == ["bleu", "chrf", "gender"]
    assert primary_metric(spec) == "bleu"
    errs = errors_of(document("translation", tokenizer={"path": "/tok"}, data={"sourceLang": "en"}))
    assert errs == {"spec.data": "targetLangs is required for task: translation (the languages to translate into)"}
    errs = errors_of(document("translation", tokenizer={"path": "/tok"},
                              data={"sourceLang": "en", "targetLangs": ["en"]}))
    assert "must not contain the source language 'en'" in errs["spec.data"]


def test_summarization_may_name_the_source_language_or_another_one():
    same = parse_document(document(data={"sourceLang": "en", "targetLangs": ["en"], "train": [
        {"format": "generated"}]})).spec
    assert same.data.target_langs == ["en"]
    cross = parse_document(document(tokenizer={"path": "/tok"}, data={"sourceLang": "en", "targetLangs": ["de"]}))
    assert cross.spec.data.target_langs == ["de"]


def test_gender_is_an_error_for_summarization_and_rouge_is_fine_for_translation():
    errs = errors_of(document(evaluation={"metrics": ["rougeL", "gender"]}))
    assert list(errs) == ["spec.evaluation.metrics"]
    assert "'gender'" in errs["spec.evaluation.metrics"] and "task: translation" in errs["spec.evaluation.metrics"]
    spec = parse_document(document("translation", tokenizer={"path": "/tok"},
                                   data={"sourceLang": "en", "targetLangs": ["de"]},
                                   evaluation={"metrics": ["bleu", "rougeL"]})).spec
    assert spec.evaluation.metrics == ["bleu", "rougeL"]
    assert primary_metric(spec) == "bleu"


def test_unknown_task_and_metric_are_named():
    errs = errors_of(document("summarisation"))
    # Only the task is reported: the data rules that depend on it stay quiet rather than guess.
    assert list(errs) == ["spec.task"] and "'summarization'" in errs["spec.task"]
    errs = errors_of(document(evaluation={"metrics": ["rouge3"]}))
    assert "rougeLsum" in errs["spec.evaluation.metrics[0]"]


def test_primary_metric_falls_back_to_the_first_metric_asked_for():
    spec = parse_document(document(evaluation={"metrics": ["rouge2", "rouge1"]})).spec
    assert primary_metric(spec) == "rouge2"


# -------------------------------------------------------------------- prefixes


def test_summarization_prefix_is_t5s_own():
    assert task_prefix("en", "en", "summarization") == "summarize: "
    assert task_prefix("en", "de", "summarization") == "summarize in German: "
    assert task_prefix("en", "de") == "translate English to German: "
    article = Example("Long text.", "Short.", "en", task="summarization")
    assert model_inputs([article], "en", True) == ["summarize: Long text."]
    assert model_inputs([article], "en", False) == ["Long text."]


# --------------------------------------------------------------- demo corpus


def test_generated_articles_are_tagged_and_condensed():
    spec = parse_document(document()).spec
    train = read_split(spec.data, "train")
    assert len(train) == 20 and all(e.task == "summarization" and e.target_lang == "en" for e in train)
    for e in train:
        town, group = e.target.split()[:2]
        # The summary is the lead sentence's story: its town, group and count are in the article.
        assert f"the {group} of {town} " in e.source
        assert len(e.target.split()) < len(e.source.split())
    assert model_inputs(train, "en", spec.uses_task_prefix())[0].startswith("summarize: ")


def test_generated_articles_are_deterministic_and_splits_share_no_summary():
    assert generate_articles(30, 1) == generate_articles(30, 1)
    train = {s for _, s in generate_articles(3000, 1)}
    held_out = {s for _, s in generate_articles(300, 2)} | {s for _, s in generate_articles(300, 1 + PARTITIONS + 1)}
    assert not train & held_out


def test_generated_articles_are_english_only():
    spec = parse_document(document(tokenizer={"path": "/tok"},
                                   data={"sourceLang": "en", "targetLangs": ["de"],
                                         "train": [{"format": "generated", "size": 3}]})).spec
    with pytest.raises(DataError, match=r"English articles with English summaries .* would be in de"):
        read_split(spec.data, "train")


# ----------------------------------------------------------------------- ROUGE


def test_rouge_matches_hand_counts():
    # hyp and ref share the, the, cat, on, mat of 6 words each; bigrams the-cat, on-the, the-mat of 5;
    # the longest common subsequence is "the cat on the mat".
    out = rouge_scores(["the cat sat on the mat"], ["the cat was on the mat"],
                       ["rouge1", "rouge2", "rougeL", "rougeLsum"])
    assert out["rouge1"] == pytest.approx(100 * 5 / 6)
    assert out["rouge2"] == pytest.approx(100 * 3 / 5)
    assert out["rougeL"] == pytest.approx(100 * 5 / 6)
    assert out["n"] == 1
    assert out["rouge_signature"].startswith("rouge-score:0.1.") and "stem:porter" in out["rouge_signature"]


def test_rouge_is_the_mean_f1_over_examples_with_stemming():
    # Porter stemming makes "cats running" and "cat runs" the same two words.
    out = rouge_scores(["cats running", "a b"], ["cat runs", "c d"], ["rouge1"])
    assert out["rouge1"] == pytest.approx(50.0)


def test_rouge_lsum_splits_sentences_on_newlines():
    out = rouge_scores(["a b\nc d"], ["c d\na b"], ["rougeL", "rougeLsum"])
    assert out["rougeL"] == pytest.approx(50.0)  # one LCS over all words: "a b" or "c d"
    assert out["rougeLsum"] == pytest.approx(100.0)  # per reference sentence, each found whole


def test_rouge_keeps_non_latin_words():
    assert UnicodeTokenizer().tokenize("Die Häuser, 北京!") == ["die", "häuser", "北", "京"]
    ru = rouge_scores(["кошка сидит на ковре"], ["кошка лежит на ковре"], ["rouge1", "rouge2", "rougeL"], "ru")
    assert (ru["rouge1"], ru["rouge2"], ru["rougeL"]) == pytest.approx((75.0, 100 / 3, 75.0))
    assert "tok:unicode" in ru["rouge_signature"]
    # Chinese has no spaces: characters are the units, so 我爱 is the one shared bigram of three.
    zh = rouge_scores(["我爱北京"], ["我爱上海"], ["rouge1", "rouge2"], "zh")
    assert (zh["rouge1"], zh["rouge2"]) == pytest.approx((50.0, 100 / 3))
    # English scoring would see no words at all in Russian: the reason for the tokenizer.
    assert rouge_scores(["кошка"], ["кошка"], ["rouge1"], "en")["rouge1"] == 0.0
    assert rouge_scores(["кошка"], ["кошка"], ["rouge1"], "ru")["rouge1"] == 100.0


def test_rouge_edge_cases():
    assert rouge_scores([], [], ["rougeL"])["rougeL"] is None
    assert rouge_scores([""], ["a summary"], ["rougeL"])["rougeL"] == 0.0
    with pytest.raises(ValueError, match="equal lengths"):
        rouge_scores(["a"], [], ["rougeL"])
    with pytest.raises(ValueError, match="unknown ROUGE metrics \\['bleu'\\]"):
        rouge_scores(["a"], ["a"], ["bleu"])


def test_score_reports_rouge_per_language_and_overall():
    examples = [Example("doc one", "the cat sat", "en", task="summarization"),
                Example("doc two", "a dog ran", "en", task="summarization")]
    out = score(examples, ["the cat sat", "a cat ran"], ["rouge1", "rougeL"])
    assert out["rouge1"] == pytest.approx((100 + 100 * 2 / 3) / 2)
    assert out["langs"]["en"]["rougeL"] == out["rougeL"]
    assert "bleu" not in out and out["rouge_signature"]


def test_the_result_printout_names_rouge_for_summarization(capsys):
    summary = {"steps": 4, "total_steps": 4, "world_size": 1, "wall_seconds": 3.0, "tokens_per_s": 10.0,
               "primary_metric": "rougeL", "final_score": 41.5, "best_score": 42.25, "best_step": 2,
               "test": {"rouge1": 50.0, "rouge2": 20.0, "rougeL": 40.0}, "latest_checkpoint": "c",
               "best_checkpoint": "b"}
    _print_result(summary, "summary.json")
    out = capsys.readouterr().out
    assert "validation ROUGE-L: 41.50   best: 42.25 (step 2)" in out
    assert "test ROUGE-1: 50.00   ROUGE-2: 20.00   ROUGE-L: 40.00" in out
    assert "BLEU" not in out
