"""One parse: a pod parses its document once into the model its checkpoints record (dump_training)
and evaluate reads back (load_saved); the operator parses an applied spec once, not per event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rosetta_contract import strict_yaml
from rosetta_contract.config import TrainerSpec, TrainingDocument
from rosetta_contract.documents import parse_document, read_yaml
from rosetta_contract.saved_training import dump_training, load_saved
from rosetta_contract.spec import TranslationTraining, TranslationTrainingSpec, parse_for_trainer
from rosetta_contract.strict_model import ConfigError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("manifests/examples/*.yaml")])
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


@pytest.fixture
def validations(monkeypatch):
    """How often each document model is validated, from here on."""
    counts: dict[str, int] = {}
    for model in (TranslationTraining, TrainingDocument, TranslationTrainingSpec, TrainerSpec):
        original = model.model_validate.__func__  # type: ignore[attr-defined]

        def counting(cls, *args, _original=original, **kwargs):
            counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(model, "model_validate", classmethod(counting))
    return counts


def test_a_pod_start_parses_its_document_once(monkeypatch, validations, tmp_path):
    import rosetta_trainer.commands.train as main

    started = []

    def train(document, output, progress=True):
        # What train() hands the checkpoints, made as it makes it: no parse either.
        started.append((document, dump_training(document)))
        return {}

    monkeypatch.setattr(main, "train", train)
    main.train_from_file(str(QUICKSTART), output=str(tmp_path), overrides=["spec.training.maxSteps=7"])
    assert validations == {"TranslationTraining": 1}
    document, saved = started[0]
    assert isinstance(document, TranslationTraining)
    assert document.spec.training.max_steps == 7
    assert parse_for_trainer(strict_yaml.load(saved)) == document


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_parse_dump_parse_gives_the_same_model(path):
    first = parse_for_trainer(read_yaml(path), str(path))
    again = parse_for_trainer(strict_yaml.load(dump_training(first)))
    assert again == first
    assert dump_training(again) == dump_training(first)


def test_examples_are_found():
    assert len(EXAMPLES) >= 8


def saved(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "training.yaml"
    path.write_text(text)
    return path


def test_a_checkpoint_of_this_version_reads_back_as_the_model_it_ran(tmp_path):
    document = parse_for_trainer(read_yaml(QUICKSTART))
    assert load_saved(saved(tmp_path, dump_training(document))) == document


def test_an_old_checkpoint_holds_the_raw_document_and_still_reads(tmp_path):
    # Earlier versions wrote the document as read (overrides applied), not the resolved one.
    raw = read_yaml(QUICKSTART)
    raw["spec"]["training"]["maxSteps"] = 7
    document = load_saved(saved(tmp_path, strict_yaml_dump(raw)))
    assert document.spec.training.max_steps == 7
    assert document == parse_for_trainer(raw)


def test_an_old_checkpoint_the_cluster_rules_now_refuse_reads_as_its_trainer_fields(tmp_path):
    raw = read_yaml(QUICKSTART)
    raw["spec"]["launcher"] = "deepspeed"  # a cluster field today's rules refuse without GPUs
    with pytest.raises(ConfigError):
        parse_for_trainer(raw)
    document = load_saved(saved(tmp_path, strict_yaml_dump(raw)))
    assert document == parse_document(raw)  # as earlier versions read it


def test_a_saved_document_the_trainer_cannot_read_is_an_error_naming_the_field(tmp_path):
    raw = read_yaml(QUICKSTART)
    raw["spec"]["training"]["maxStep"] = 7
    with pytest.raises(ConfigError, match="maxStep"):
        load_saved(saved(tmp_path, strict_yaml_dump(raw)))


def strict_yaml_dump(raw) -> str:
    import yaml

    return yaml.safe_dump(raw, sort_keys=False)


def test_evaluate_reads_an_old_checkpoints_document(monkeypatch, tmp_path):
    import torch

    import rosetta_trainer.evaluation.inference as inference
    from rosetta_trainer.evaluation.inference import load_checkpoint_for_inference

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    raw = read_yaml(QUICKSTART)
    saved(tmp_path, strict_yaml_dump(raw))
    monkeypatch.setattr(inference, "load_pretrained", lambda path: torch.nn.Linear(1, 1))
    monkeypatch.setattr(inference, "load_tokenizer", lambda path: "tokenizer")
    _, tokenizer, spec = load_checkpoint_for_inference(tmp_path, torch.device("cpu"))
    assert tokenizer == "tokenizer"
    assert spec == parse_for_trainer(raw).spec


def test_the_operator_parses_an_applied_spec_once(monkeypatch):
    import rosetta_operator.applied_spec as applied

    spec = read_yaml(QUICKSTART)["spec"]
    parses = []
    original = applied.parse_spec

    def counting(raw, allow_host_path=False):
        parses.append(raw)
        return original(raw, allow_host_path=allow_host_path)

    monkeypatch.setattr(applied, "parse_spec", counting)
    applied._parsed.cache_clear()
    jobset = {"metadata": {"annotations": {applied.APPLIED_SPEC: json.dumps(spec, sort_keys=True)}}}
    first = applied.parsed_spec(applied.applied_spec_of(jobset, {}))
    again = applied.parsed_spec(applied.applied_spec_of(jobset, {}))  # the JobSet's next event
    assert first is again and len(parses) == 1
    assert first == parse_for_trainer(read_yaml(QUICKSTART)).spec
    assert applied.parsed_spec({**spec, "nodes": 0}) is None
