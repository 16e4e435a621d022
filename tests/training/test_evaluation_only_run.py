"""The flan-T5 gender-evaluation example's CPU-sized twin: one multi-target model (en→de,fr with
task prefixes) trained, then evaluated as `spec.mode: evaluate` by `rosetta run` on MT-GenEval-
shaped test sets, with per-language and per-gender scores; and the untouched (pretrained) model
evaluated the same way."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from rosetta_operator.local.runner import run
from rosetta_trainer.checkpoints.checkpoint import latest_checkpoint
from rosetta_trainer.commands.train import train_from_file
from support.tiny_models import tiny_model, tiny_tokenizer
from support.training import TINY, deep_update

pytestmark = pytest.mark.slow

LANGS = ("de", "fr")
# (masculine English, feminine English, masculine target, feminine target) per language
SENTENCES = {
    "de": [("He is a teacher.", "She is a teacher.", "Er ist Lehrer.", "Sie ist Lehrerin."),
           ("My brother is a doctor.", "My sister is a doctor.", "Mein Bruder ist Arzt.", "Meine Schwester ist Ärztin."),
           ("The actor was tired.", "The actress was tired.", "Der Schauspieler war müde.",
            "Die Schauspielerin war müde.")],
    "fr": [("He is a teacher.", "She is a teacher.", "Il est enseignant.", "Elle est enseignante."),
           ("My brother is a doctor.", "My sister is a doctor.", "Mon frère est médecin.", "Ma sœur est médecin."),
           ("The actor was tired.", "The actress was tired.", "L'acteur était fatigué.", "L'actrice était fatiguée.")],
}


def write_mtgeneval(root: Path, split: str = "test") -> Path:
    """geneval-sentences-{feminine,masculine}-SPLIT.en_XX.{en,XX}, line i of each a counterfactual pair."""
    root.mkdir(parents=True, exist_ok=True)
    for lang, rows in SENTENCES.items():
        for gender, (en, tgt) in (("masculine", (0, 2)), ("feminine", (1, 3))):
            stem = root / f"geneval-sentences-{gender}-{split}.en_{lang}"
            Path(f"{stem}.en").write_text("".join(r[en] + "\n" for r in rows))
            Path(f"{stem}.{lang}").write_text("".join(r[tgt] + "\n" for r in rows))
    return root


def evaluate_mode(name: str, model: Path, tokenizer: Path, geneval: Path) -> dict:
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": name},
            "spec": {"mode": "evaluate", "model": {"name": str(model)}, "tokenizer": {"path": str(tokenizer)},
                     "data": {"sourceLang": "en", "targetLangs": list(LANGS), "taskPrefix": True,
                              "test": [{"format": "mtgeneval", "path": str(geneval), "split": "test"}],
                              "maxSourceLength": 48, "maxTargetLength": 48},
                     "evaluation": {"beams": 1, "maxNewTokens": 16, "metrics": ["bleu", "chrf", "gender"]},
                     "metrics": {"port": 0}}}


def run_evaluation(tmp_path: Path, doc: dict) -> tuple[dict, dict]:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "runs" / doc["metadata"]["name"]
    assert run(str(path), output=str(out), progress=False, quiet=True) == 0
    report = json.loads((out / "run.json").read_text())
    (scores_file,) = out.rglob("evaluation/test.scores.json")
    return report, json.loads(scores_file.read_text())


def assert_per_language_and_gender(scores: dict) -> None:
    assert scores["samples"] == 2 * 3 * len(LANGS)
    assert sorted(scores["langs"]) == list(LANGS)
    for lang in LANGS:
        figures = scores["langs"][lang]
        assert 0 <= figures["bleu"] <= 100 and 0 <= figures["chrf"] <= 100
        for key in ("bleu_feminine", "bleu_masculine", "gender_gap_bleu", "accuracy_feminine", "accuracy_masculine"):
            assert key in figures["gender"], (lang, key)


def test_one_multi_target_model_trained_then_evaluated_per_language_and_gender(tmp_path):
    geneval = write_mtgeneval(tmp_path / "mt-geneval")
    config = copy.deepcopy(deep_update(TINY, {"spec": {
        "data": {"targetLangs": list(LANGS), "taskPrefix": True,
                 "train": [{"format": "generated", "size": 400, "seed": 1}],
                 "validation": [{"format": "generated", "size": 8, "seed": 2}]},
        "training": {"maxSteps": 6}, "checkpoint": {"interval": 6}, "evaluation": {"interval": 6, "atEnd": False}}}))
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(config))
    summary = train_from_file(str(path), str(tmp_path / "train"), progress=False)
    assert summary["steps"] == 6
    final = latest_checkpoint(tmp_path / "train" / "checkpoints")

    # The fine-tuned model, as a pretrained one: mode evaluate on its saved directory.
    report, scores = run_evaluation(tmp_path, evaluate_mode("fine-tuned", final / "model", final / "tokenizer", geneval))
    assert report["phase"] == "Succeeded" and report["evaluation"]["phase"] == "Succeeded"
    assert report["evaluation"]["samples"] == 12 and "bleu" in report["evaluation"]
    assert_per_language_and_gender(scores)


def test_a_pretrained_model_saved_locally_is_evaluated_as_it_is(tmp_path):
    geneval = write_mtgeneval(tmp_path / "mt-geneval")
    tokenizer = tiny_tokenizer(tmp_path / "pretrained")  # saved into the model's own directory
    tiny_model(tokenizer, architecture="t5").save_pretrained(tmp_path / "pretrained")
    pretrained = tmp_path / "pretrained"

    report, scores = run_evaluation(tmp_path, evaluate_mode("pretrained", pretrained, pretrained, geneval))
    assert report["phase"] == "Succeeded" and report["evaluation"]["checkpoint"] == "pretrained"
    assert_per_language_and_gender(scores)
