"""The TranslationTraining document: valid files load, invalid ones list every error by field path."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rosetta_contract.documents import apply_overrides, load_document, parse_document, read_yaml
from rosetta_contract.languages import task_prefix
from rosetta_contract.spec import CLUSTER_FIELDS
from rosetta_contract.strict_model import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def minimal(**spec_overrides):
    spec = {
        "model": {"architecture": "transformer", "size": "tiny"},
        "tokenizer": {"train": {"vocabSize": 500}},
        "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
        "training": {"maxSteps": 10},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": "t"}, "spec": spec}


def errors_of(raw) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_document(raw)
    return dict(info.value.errors)


def test_quickstart_example_loads():
    doc = load_document(ROOT / "examples" / "quickstart.yaml")
    assert doc.kind == "TranslationTraining"
    assert doc.spec.data.target_langs


def test_minimal_document_gets_defaults():
    doc = parse_document(minimal())
    assert doc.spec.training.schedule == "noam"
    assert doc.spec.training.batch.tokens == 4096
    assert doc.spec.checkpoint.keep == 3
    assert doc.spec.evaluation.metrics == ["bleu", "chrf", "gender"]


@pytest.mark.parametrize("patch, path, fragment", [
    ({"training": {"maxSteps": 0}}, "spec.training.maxSteps", "greater than or equal to 1"),
    ({"training": {}}, "spec.training", "maxSteps"),
    ({"training": {"maxSteps": 5, "schedule": "step"}}, "spec.training.schedule", "noam"),
    ({"training": {"maxSteps": 5, "precision": "fp8"}}, "spec.training.precision", "bf16"),
    ({"training": {"maxSteps": 5, "batch": {"tokens": 100, "sentences": 4}}}, "spec.training.batch", "exactly one"),
    ({"training": {"maxSteps": 5, "learningRate": "fast"}}, "spec.training.learningRate", "number"),
    ({"model": {"name": "t5-small", "architecture": "t5"}}, "spec.model", "exactly one"),
    ({"model": {"architecture": "lstm"}}, "spec.model.architecture", "'t5' or 'transformer'"),
    ({"model": {"architecture": "t5", "dModel": 100, "heads": 3}}, "spec.model", "divisible"),
    ({"tokenizer": {"path": "x", "train": {}}}, "spec.tokenizer", "not both"),
    ({"data": {"sourceLang": "en", "targetLangs": []}}, "spec.data.targetLangs", "at least 1"),
    ({"data": {"sourceLang": "en", "targetLangs": ["en"]}}, "spec.data", "source language"),
    ({"data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "pairs", "source": "a"}]}},
     "spec.data.train[0]", "'target'"),
    ({"data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "xlsx"}]}},
     "spec.data.train[0].format", "pairs"),
    ({"data": {"sourceLang": "en", "targetLangs": ["de", "fr"],
               "train": [{"format": "pairs", "source": "a", "target": "b"}]}}, "spec.data", "targetLang is required"),
    ({"checkpoint": {"keep": 0}}, "spec.checkpoint.keep", "greater than or equal to 1"),
    ({"evaluation": {"metrics": ["bleu", "meteor"]}}, "spec.evaluation.metrics[1]", "bleu"),
    ({"trainig": {"maxSteps": 1}}, "spec.trainig", "Extra inputs"),
])
def test_each_error_names_its_field(patch, path, fragment):
    errs = errors_of(minimal(**patch))
    assert path in errs, errs
    assert fragment in errs[path]


def test_every_error_is_listed_at_once():
    raw = minimal(training={"maxSteps": -1, "learningRate": 0, "warmupSteps": -5},
                  checkpoint={"interval": 0}, metrics={"port": 70000})
    errs = errors_of(raw)
    assert {"spec.training.maxSteps", "spec.training.learningRate", "spec.training.warmupSteps",
            "spec.checkpoint.interval", "spec.metrics.port"} <= set(errs)
    message = str(ConfigError(list(errs.items()), "f.yaml"))
    assert message.startswith("invalid TranslationTraining in f.yaml (5 errors)")


def test_cluster_keys_are_ignored_by_the_trainer_but_typos_are_not():
    raw = minimal()
    raw["spec"].update({key: None for key in CLUSTER_FIELDS})
    parse_document(raw)
    raw["spec"]["nodez"] = 2
    assert "spec.nodez" in errors_of(raw)


def test_wrong_kind_and_api_version():
    raw = minimal()
    raw["kind"], raw["apiVersion"] = "Job", "batch/v1"
    errs = errors_of(raw)
    assert "kind" in errs and "apiVersion" in errs


def test_overrides_are_typed_yaml(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    doc = load_document(path, ["spec.training.maxSteps=7", "spec.training.precision=bf16",
                               "spec.data.targetLangs=[de, fr]"])
    assert doc.spec.training.max_steps == 7
    assert doc.spec.training.precision == "bf16"
    assert doc.spec.data.target_langs == ["de", "fr"]
    with pytest.raises(ConfigError, match="override must look like"):
        apply_overrides({}, ["no-equals-sign"])


def test_file_problems_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_document(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(ConfigError) as info:
        load_document(bad)
    assert info.value.errors[0][0] == "(yaml)"
    assert str(info.value) == (f"invalid TranslationTraining in {bad}: line 2, column 1: did not find expected ',' "
                               "or ']' (while parsing a flow sequence at line 1)")
    two = tmp_path / "two.yaml"
    two.write_text("a: 1\n---\nb: 2\n")
    with pytest.raises(ConfigError, match=r"one TranslationTraining document, found 0 among 2 documents "
                                          r"\(no kind, no kind\)"):
        load_document(two)
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump(minimal()) + "---\n" + yaml.safe_dump(minimal()))
    with pytest.raises(ConfigError, match="found 2 among 2 documents"):
        load_document(both)


def test_a_file_with_other_kinds_beside_the_training_gives_the_training(tmp_path):
    # What `kubectl apply -f` takes as a whole: e.g. the PVC the training mounts, then the training.
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "runs"},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    path = tmp_path / "with-claim.yaml"
    path.write_text("# comment\n---\n" + yaml.safe_dump_all([claim, minimal(), {"kind": "ConfigMap"}]))
    assert read_yaml(path) == minimal()
    assert load_document(path, ["spec.training.maxSteps=3"]).spec.training.max_steps == 3


def test_task_prefix_default_follows_model_and_targets():
    assert not parse_document(minimal()).spec.uses_task_prefix()
    multi = minimal(data={"sourceLang": "en", "targetLangs": ["de", "fr"], "train": [{"format": "generated"}]})
    assert parse_document(multi).spec.uses_task_prefix()
    t5 = minimal(model={"name": "google/flan-t5-small"}, tokenizer={})
    assert parse_document(t5).spec.uses_task_prefix()
    assert task_prefix("en", "de") == "translate English to German: "


def test_config_imports_without_torch():
    code = "import sys, rosetta_contract.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_reports_errors_with_exit_code_2(tmp_path, capsys):
    from rosetta_cli.main import main

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(minimal(training={"maxSteps": 0})))
    assert main(["train", "-f", str(path)]) == 2
    assert "spec.training.maxSteps" in capsys.readouterr().err
