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

from rosetta_cli.main import main
from rosetta_contract import strict_yaml
from rosetta_contract.documents import apply_overrides, load_document, read_yaml
from rosetta_contract.spec import ConfigError, parse_spec, parse_training

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


# Where the reader stops in deep(5000): check() at the 101st level (column 115), unless libyaml (PyYAML >= 6.0.4)
# scans ahead to its own nesting limit first; levels and columns advance together, so the column moves with it.
LIBYAML_NEST_LIMIT = getattr(getattr(yaml, "_yaml", None), "_get_max_nest_level", lambda: -1)()
DEEP_STOP_COLUMN = 115 if LIBYAML_NEST_LIMIT < 0 else 115 - 100 + LIBYAML_NEST_LIMIT


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
    "5000 levels": (deep(5000).encode(), f"line 20, column {DEEP_STOP_COLUMN}: nested more than 100 levels deep"),
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


def volume(**fields) -> dict:
    return {"volumes": [{"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "corpus"},
                         **fields}]}


def doc_without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# Each was accepted once and meant something else on the cluster (or nothing at all).
ACCEPTED_BUT_WRONG = {
    "true as a node count": (spec_with(nodes=True), "spec.nodes", "expected an integer, not true"),
    "false as a learning rate": (spec_with(training={"maxSteps": 10, "learningRate": False}),
                                 "spec.training.learningRate", "expected a number, not false"),
    "true among Adam's betas": (spec_with(training={"maxSteps": 10, "adamBetas": [True, 0.98]}),
                                "spec.training.adamBetas[0]", "expected a number, not true"),
    "beta2 of 1.5": (spec_with(training={"maxSteps": 10, "adamBetas": [0.9, 1.5]}),
                     "spec.training.adamBetas[1]", "Input should be less than 1"),
    "a negative beta": (spec_with(training={"maxSteps": 10, "adamBetas": [-0.1, 0.98]}),
                        "spec.training.adamBetas[0]", "Input should be greater than or equal to 0"),
    "a negative CPU request": (spec_with(resources={"cpu": "-2"}), "spec.resources.cpu",
                               "'-2' is not a non-negative Kubernetes quantity (e.g. 8, 7500m, 64Gi)"),
    "a negative shm size": (spec_with(resources={"shmSize": "-1Gi"}), "spec.resources.shmSize",
                            "'-1Gi' is not a non-negative Kubernetes quantity (e.g. 8, 7500m, 64Gi)"),
    "a memory size as GPU count": (spec_with(gpusPerNode="8Gi"), "spec.gpusPerNode",
                                   "expected an integer, not a string ('8Gi')"),
    "a quoted node count": (spec_with(nodes="2"), "spec.nodes", "expected an integer, not a string ('2')"),
    "a number as suspend": (spec_with(suspend=1), "spec.suspend", "expected true or false, not an integer"),
    "half a CPU unquoted": (spec_with(resources={"cpu": 0.5}), "spec.resources.cpu",
                            "expected a whole number or a string, not 0.5; quote it (e.g. '0.5') or use milli-units"),
    "a seed beyond 64 bits": (spec_with(training={"maxSteps": 10, "seed": 2 ** 70}), "spec.training.seed",
                              "an integer this large does not fit in 64 bits"),
    "an unknown top-level key": ({**GOOD, "replicas": 3}, "replicas", "Extra inputs are not permitted"),
    "a field core/v1 Affinity does not have": (
        spec_with(scheduling={"affinity": {"nodeAffinity": {"requiredDuringScheduling": {}}}}),
        "spec.scheduling.affinity",
        "nodeAffinity.requiredDuringScheduling: NodeAffinity has no field 'requiredDuringScheduling' (it has: "
        "preferredDuringSchedulingIgnoredDuringExecution, requiredDuringSchedulingIgnoredDuringExecution)"),
    "a reserved path spelled differently": (spec_with(**volume(mountPath="/data/../tmp")), "spec.volumes[0].mountPath",
                                            "'/data/../tmp' is not a normalized path; write it as '/tmp'"),
    "a toleration for seconds that never evicts": (
        spec_with(scheduling={"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule",
                                               "tolerationSeconds": 60}]}),
        "spec.scheduling.tolerations[0]", "tolerationSeconds is for effect 'NoExecute' only"),
    "snake_case field": (spec_with(training={"maxSteps": 10, "warmup_steps": 5}), "spec.training.warmup_steps",
                         "Extra inputs are not permitted"),
    "no apiVersion": (doc_without("apiVersion"), "apiVersion", "Field required"),
    "no kind": (doc_without("kind"), "kind", "Field required"),
    "no metadata": (doc_without("metadata"), "metadata", "Field required"),
    "no name": ({**GOOD, "metadata": {"namespace": "ml"}}, "metadata.name", "Field required"),
    "source and target differ by case": (
        spec_with(data={**GOOD["spec"]["data"], "targetLangs": ["EN"]}), "spec.data",
        "targetLangs must not contain the source language 'en' (language codes are compared without case)"),
    "duplicate targets by case": (
        spec_with(data={**GOOD["spec"]["data"], "targetLangs": ["de", "DE"]}), "spec.data",
        "targetLangs has duplicates (language codes are compared without case)"),
    "a language that is no code": (
        spec_with(data={**GOOD["spec"]["data"], "sourceLang": "english!"}), "spec.data.sourceLang",
        "'english!' is not a language code (BCP 47 style: en, de, pt-BR, zh-Hans)"),
    "an uppercase repository": (spec_with(image="Rosetta/trainer:1"), "spec.image",
                                "'Rosetta/trainer:1' is not an image reference a registry accepts "
                                "(repository names are lowercase)"),
    "an empty tag": (spec_with(image="ghcr.io/rosetta-dev/trainer:"), "spec.image",
                     "'ghcr.io/rosetta-dev/trainer:' is not an image reference a registry accepts "
                     "([registry/]repository[:tag][@sha256:digest], repository in lowercase)"),
    "a space in the image": (spec_with(image="trainer latest"), "spec.image",
                             "'trainer latest' is not an image reference a registry accepts "
                             "([registry/]repository[:tag][@sha256:digest], repository in lowercase)"),
    "an absolute subPath": (spec_with(**volume(subPath="/etc")), "spec.volumes[0].subPath",
                            "'/etc' must be a relative path that stays inside the volume (no leading '/', no '..')"),
    "a subPath that climbs": (spec_with(**volume(subPath="runs/../../other-team")), "spec.volumes[0].subPath",
                              "'runs/../../other-team' must be a relative path that stays inside the volume "
                              "(no leading '/', no '..')"),
    "the launcher's shutdown timeout": (
        spec_with(env=[{"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": "5"}]), "spec.env[0].name",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT is set by the launcher; remove it"),
}


@pytest.mark.parametrize("doc, field, message", ACCEPTED_BUT_WRONG.values(), ids=ACCEPTED_BUT_WRONG.keys())
def test_values_that_used_to_mean_something_else_are_refused(doc, field, message):
    with pytest.raises(ConfigError) as info:
        parse_training(doc)
    assert info.value.errors == [(field, message)]


@pytest.mark.parametrize("image", [
    "ghcr.io/rosetta-dev/rosetta-trainer:0.1.0", "rosetta-trainer", "localhost:5000/team/trainer:v2",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/rosetta@sha256:" + "a" * 64, "nvcr.io/nvidia/pytorch:24.01-py3",
    "[::1]:5000/trainer:dev", "registry.example.com/a/b/c:1.0_rc-2",
])
def test_image_references_registries_accept_still_pass(image):
    assert parse_training(spec_with(image=image)).spec.image == image


@pytest.mark.parametrize("code", ["fr", "pt-BR", "pt_BR", "zh-Hans", "zh-Hans-CN", "yue", "sr-Latn"])
def test_language_tags_beyond_two_letters_still_pass(code):
    spec = parse_training(spec_with(data={**GOOD["spec"]["data"], "targetLangs": [code]})).spec
    assert spec.data.target_langs == [code]


def test_rosetta_train_refuses_what_the_cluster_refuses(tmp_path, capsys):
    # Cluster fields are the trainer's to ignore, not to skip: the same file fails in both places.
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec_with(nodes=0)))
    assert main(["train", "-f", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: invalid TranslationTraining in {path}: spec.nodes: "
                                       "Input should be greater than or equal to 1\n")


@pytest.mark.parametrize("spec, field, problem", [
    ({"env": [{"name": f"NOTE_{i}", "value": "x" * 30_000} for i in range(10)]}, "spec.env",
     "the JobSet keeps a copy in an annotation"),
    ({"scheduling": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["y" * 1000] * 300}]}],
    }}}}}, "spec.scheduling",
     "the JobSet keeps a copy in an annotation"),
])
def test_a_spec_too_large_for_its_objects_is_refused_before_any_api_call(spec, field, problem):
    from rosetta_operator.render import render

    training = parse_training(spec_with(**spec))
    with pytest.raises(ConfigError) as info:
        render("mt", "default", training.spec)
    (path, message), = info.value.errors
    assert path == field and message.startswith("too large: ") and problem in message


def test_the_size_limits_are_kubernetes_own():
    from rosetta_operator import render

    # apimachinery's TotalAnnotationSizeLimitB, the ConfigMap data limit, etcd's default request limit.
    assert render.ANNOTATIONS_LIMIT < 256 * 1024 and render.CONFIGMAP_LIMIT == 1 << 20
    assert render.OBJECT_LIMIT < 1536 * 1024
