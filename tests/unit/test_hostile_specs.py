"""Hostile and malformed TranslationTraining files: every one refused with one line, none crashes.

The reader (rosetta_trainer/strict_yaml.py, behind config.read_yaml) bounds what a file may make
the parser do: 1 MiB, UTF-8, no duplicate keys, aliases that add at most 10,000 nodes and no
recursive ones, at most 100 levels of nesting. The spec models turn what gets through into field
errors: a list where a string belongs, a YAML date in a free-form field, a megabyte-long path.
Checked on the module, in-process through `rosetta validate/render/run/plan`, and through the
installed command (exit status 2, one line on stderr, no traceback).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rosetta_operator.spec import ConfigError, parse_spec, parse_training
from rosetta_trainer import strict_yaml
from rosetta_trainer.cli import main
from rosetta_trainer.config import apply_overrides, load_document, read_yaml

GOOD = {
    "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "mt"},
    "spec": {
        "model": {"architecture": "transformer", "size": "tiny"},
        "tokenizer": {"train": {"vocabSize": 500}},
        "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
        "training": {"maxSteps": 10},
    },
}
GOOD_TEXT = yaml.safe_dump(GOOD, sort_keys=False)

# Nine nested anchors of nine aliases each: 9^9 ≈ 387 million strings from under 600 bytes.
BILLION_LAUGHS = GOOD_TEXT + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else 'lol'] * 9)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi")
)


def deep(levels: int) -> str:
    return GOOD_TEXT.replace("  training:\n", f"  scheduling:\n    affinity: {{x: {'[' * levels}{']' * levels}}}\n"
                                              "  training:\n", 1)


def with_spec(text: str) -> str:
    return GOOD_TEXT.replace("spec:\n", "spec:\n" + text, 1)


HOSTILE = {
    # name: (file bytes, the line the error must be, exactly)
    "duplicate key": (GOOD_TEXT.replace("kind: TranslationTraining\n", "kind: TranslationTraining\nkind: Job\n").encode(),
                      "line 3, column 1: duplicate key 'kind' (first at line 2)"),
    "duplicate nested key": (with_spec("  nodes: 1\n  gpusPerNode: 0\n  nodes: 4\n").encode(),
                             "line 8, column 3: duplicate key 'nodes' (first at line 6)"),
    "billion laughs": (BILLION_LAUGHS.encode(),
                       "line 25, column 8: aliases expand to more than 10000 nodes (nested aliases, a \"billion "
                       "laughs\"?); write the values out"),
    "recursive alias": (with_spec("  scheduling: {affinity: &a {x: [*a]}}\n").encode(),
                        "line 6, column 34: alias *a refers to a collection that contains it (a recursive structure)"),
    "5000 levels": (deep(5000).encode(), "line 20, column 115: nested more than 100 levels deep"),
    "over 1 MiB": ((GOOD_TEXT + "# " + "x" * (1 << 20) + "\n").encode(),
                   "file is larger than 1 MiB (1048576 bytes), the limit for a TranslationTraining"),
    "latin-1": (GOOD_TEXT.replace("name: mt", "name: caf\xe9").encode("latin-1"),
                "line 4, column 12: not UTF-8 text (invalid continuation byte at byte 80 of the file)"),
    "control character": (GOOD_TEXT.replace("name: mt", "name: m\x07t").encode(),
                          "line 4, column 10: control characters are not allowed (code point 0x7)"),
    "syntax": (b"spec: [unclosed\n", "line 2, column 1: did not find expected ',' or ']' "
                                     "(while parsing a flow sequence at line 1)"),
}


@pytest.fixture(params=HOSTILE.values(), ids=HOSTILE.keys())
def hostile(request, tmp_path) -> tuple[str, str]:
    content, expected = request.param
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    return str(path), expected


def test_the_reader_refuses_each_with_where_and_what(hostile):
    path, expected = hostile
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert time.perf_counter() - started < 2.0
    assert info.value.errors == [("(yaml)", expected)]
    assert str(info.value) == f"invalid TranslationTraining in {path}: {expected}"


@pytest.mark.parametrize("command", [["validate"], ["render"], ["plan"], ["run", "--no-progress"]])
def test_every_command_that_reads_a_file_refuses_it_in_one_line(hostile, command, tmp_path, capsys):
    path, expected = hostile
    args = [*command, "-f", path] + (["-o", str(tmp_path / "run")] if command[0] == "run" else [])
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"error: invalid TranslationTraining in {path}: {expected}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["duplicate key", "billion laughs", "5000 levels", "over 1 MiB", "latin-1"])
def test_the_installed_command_prints_one_line_and_no_traceback(name, tmp_path):
    rosetta = Path(sys.executable).with_name("rosetta")
    if not rosetta.exists():
        pytest.skip("the rosetta console script is not installed")
    content, expected = HOSTILE[name]
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    # A timeout, not a hang, if the bomb ever goes off again.
    got = subprocess.run([str(rosetta), "validate", "-f", str(path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert (got.returncode, got.stdout) == (2, "")
    assert got.stderr == f"error: invalid TranslationTraining in {path}: {expected}\n"


def test_a_multi_document_file_is_read_strictly_too(tmp_path):
    claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: runs, name: other}\n"
    path = tmp_path / "both.yaml"
    path.write_text(claim + "---\n" + GOOD_TEXT)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert info.value.errors == [("(yaml)", "line 3, column 24: duplicate key 'name' (first at line 3)")]
    path.write_text(claim.replace(", name: other", "") + "---\n" + GOOD_TEXT)
    assert read_yaml(path)["kind"] == "TranslationTraining"  # and the training is still picked out


def test_ordinary_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD_TEXT.replace("    train:\n    - format: generated\n      size: 100\n",
                                      "    train: [&src {format: generated, size: 100}]\n"
                                      "    validation: [*src]\n    test: [*src]\n")
                    + "  evaluation: {<<: {beams: 2, maxSamples: 8}, beams: 3}\n")
    doc = load_document(path)
    assert doc.spec.data.validation[0].size == doc.spec.data.test[0].size == 100
    # A key beside a merge overrides the merged one: not a duplicate.
    assert (doc.spec.evaluation.beams, doc.spec.evaluation.max_samples) == (3, 8)


def test_a_file_that_is_not_a_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        read_yaml(tmp_path)
    assert str(info.value) == f"invalid TranslationTraining in {tmp_path}: cannot read {tmp_path}: Is a directory"
    with pytest.raises(ConfigError) as info:  # an endless device is cut at the size limit
        read_yaml("/dev/zero")
    assert "larger than 1 MiB" in str(info.value)


@pytest.mark.parametrize("value, message", [
    ("&a [*a]", "the value is not valid YAML: line 1, column 5: alias *a refers to a collection that contains it "
                "(a recursive structure)"),
    ("{a: 1, a: 2}", "the value is not valid YAML: line 1, column 8: duplicate key 'a' (first at line 1)"),
    ("[" * 200, "the value is not valid YAML: line 1, column 101: nested more than 100 levels deep"),
])
def test_set_values_are_read_with_the_same_rules(value, message):
    with pytest.raises(ConfigError) as info:
        apply_overrides(copy.deepcopy(GOOD), [f"spec.scheduling={value}"])
    assert info.value.errors == [("spec.scheduling", message)]


def test_set_on_a_document_that_is_not_a_mapping_is_an_error_not_a_crash(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    assert main(["validate", "-f", str(path), "--set", "spec.nodes=2"]) == 2
    assert capsys.readouterr().err == (f"error: invalid TranslationTraining in {path}: (document): expected a YAML "
                                       "mapping with apiVersion, kind and spec\n")


# ------------------------------------------------------------------ field errors, not crashes


def spec_with(**fields) -> dict:
    doc = copy.deepcopy(GOOD)
    doc["spec"].update(fields)
    return doc


# 1 MB: under the 1 MiB file limit, so the field itself is what is refused.
MEGABYTE = "/" + "a" * 999_999
FIELD_ERRORS = {
    "a list as task": (spec_with(task=["translation"]),
                       [("spec.task", "Input should be 'translation' or 'summarization'")]),
    "a mapping as task": (spec_with(task={"x": 1}),
                          [("spec.task", "Input should be 'translation' or 'summarization'")]),
    "a list as a model name": (spec_with(model={"name": ["t5-small"]}), [("spec.model.name", "Input should be a valid string")]),
    "a date in the affinity": (
        spec_with(scheduling={"affinity": {"nodeAffinity": {"since": __import__("datetime").date(2024, 1, 1)}}}),
        [("spec.scheduling.affinity", "nodeAffinity.since: a YAML date (2024-01-01) is not a JSON value; quote it to "
                                      "pass it as a string")]),
    "a set in deepspeedConfig": (
        spec_with(gpusPerNode=1, distributed={"backend": "deepspeed", "deepspeedConfig": {"a": [{1, 2}]}}),
        [("spec.distributed.deepspeedConfig", "a[0]: a YAML set ({1, 2}) is not a JSON value; quote it to pass it "
                                              "as a string")]),
    "NaN": (spec_with(training={"maxSteps": 10, "weightDecay": float("nan")}),
            [("spec.training.weightDecay", "Input should be a finite number")]),
    "a 1 MB checkpoint path": (spec_with(checkpoint={"dir": MEGABYTE}),
                               [("spec.checkpoint.dir", "String should have at most 4096 characters")]),
    "a 1 MB data path": (spec_with(data={**GOOD["spec"]["data"], "train": [{"format": "tsv", "path": MEGABYTE}]}),
                         [("spec.data.train[0].path", "String should have at most 4096 characters")]),
    "a 1 MB node selector": (spec_with(scheduling={"nodeSelector": {"pool": "a" * 1_000_000}}),
                             [("spec.scheduling.nodeSelector.pool", "String should have at most 63 characters")]),
    "a 1 MB namespace": ({**GOOD, "metadata": {"name": "mt", "namespace": "a" * 1_000_000}},
                         [("metadata.namespace", "String should have at most 63 characters")]),
}


@pytest.mark.parametrize("doc, errors", FIELD_ERRORS.values(), ids=FIELD_ERRORS.keys())
def test_wrong_types_and_huge_values_are_field_errors(doc, errors):
    with pytest.raises(ConfigError) as info:
        parse_training(doc)
    assert info.value.errors == errors


@pytest.mark.parametrize("name", ["a list as task", "a date in the affinity", "a 1 MB checkpoint path",
                                  "a 1 MB namespace"])
@pytest.mark.parametrize("command", ["validate", "render"])
def test_through_the_cli_they_are_one_short_line(name, command, tmp_path, capsys):
    doc, errors = FIELD_ERRORS[name]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))  # a date stays a YAML date, a list a list
    assert main([command, "-f", str(path)]) == 2
    out, err = capsys.readouterr()
    (field, message), = errors
    assert out == "" and err == f"error: invalid TranslationTraining in {path}: {field}: {message}\n"


def test_a_message_that_quotes_a_huge_value_is_cut():
    with pytest.raises(ConfigError) as info:
        parse_training(spec_with(resources={"cpu": "x" * (1 << 20)}))
    (field, message), = info.value.errors
    assert field == "spec.resources.cpu"
    assert message.startswith("'xxxx") and message.endswith(" characters)") and len(message) < 1100


def test_the_operator_refuses_a_spec_nested_deeper_than_yaml_allows():
    # JSON from the apiserver is not read by strict_yaml: the operator's own bound applies.
    nested: dict = {}
    inner = nested
    for _ in range(5000):
        inner["x"] = {}
        inner = inner["x"]
    spec = copy.deepcopy(GOOD["spec"])
    spec["scheduling"] = {"affinity": nested}
    with pytest.raises(ConfigError) as info:
        parse_spec(spec)
    (field, message), = info.value.errors
    assert field.startswith("spec.scheduling.affinity.x.x.") and message == "nested more than 100 levels deep"
    with pytest.raises(ConfigError):
        parse_training({**GOOD, "spec": spec})


def test_strict_yaml_bounds_are_what_the_docs_say():
    assert (strict_yaml.MAX_BYTES, strict_yaml.MAX_DEPTH, strict_yaml.MAX_ALIAS_NODES) == (1 << 20, 100, 10_000)
    assert strict_yaml.load(GOOD_TEXT) == GOOD
