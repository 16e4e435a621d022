"""The CRD: generated from the spec, committed fresh, structural, and its CEL rules agree with pydantic."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from rosetta_cli.main import main
from rosetta_contract.resource import PHASES
from rosetta_contract.spec import ConfigError, TranslationTrainingSpec, parse_training
from rosetta_operator.conditions import MAX_MESSAGE, Cond
from rosetta_operator.crd import build_crd
from rosetta_operator.crd_validations import cel_rules
from rosetta_operator.status import Observation, merge_status
from support.cel_cases import CASES, _raw
from support.openapi_check import cel_failures, cel_holds, schema_errors, with_defaults

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "manifests" / "crd.yaml"
REGENERATE = "rosetta crd > manifests/crd.yaml"

CRD = build_crd()
VERSION = CRD["spec"]["versions"][0]
ROOT_SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT_SCHEMA["properties"]["spec"]
STATUS_SCHEMA = ROOT_SCHEMA["properties"]["status"]


def crd_text() -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["crd"]) == 0
    return out.getvalue()


def test_committed_crd_is_fresh():
    assert CRD_FILE.exists(), f"manifests/crd.yaml is missing; generate it with: {REGENERATE}"
    assert CRD_FILE.read_text() == crd_text(), f"manifests/crd.yaml is stale; regenerate it with: {REGENERATE}"
    assert yaml.safe_load(CRD_FILE.read_text()) == CRD


def test_identity():
    assert CRD["metadata"]["name"] == "translationtrainings.rosetta.dev"
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("rosetta.dev", "Namespaced")
    assert spec["names"]["kind"] == "TranslationTraining"
    assert spec["names"]["plural"] == "translationtrainings"
    assert spec["names"]["shortNames"] == ["tt"]
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [("v1alpha1", True, True)]
    assert VERSION["subresources"] == {"status": {}}
    assert ROOT_SCHEMA["required"] == ["spec"]


def test_printer_columns():
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Nodes", "GPUs/node", "Progress", "BLEU", "Val loss", "Gender gap", "Restarts",
                             "Preemptions", "Age"]
    assert columns["Age"] == ("date", ".metadata.creationTimestamp")
    wide = [c["name"] for c in VERSION["additionalPrinterColumns"] if c.get("priority")]
    assert wide == ["Val loss", "Gender gap", "Restarts", "Preemptions"]  # -o wide only
    for name, (kind, path) in columns.items():
        if name == "Age":
            continue
        node = ROOT_SCHEMA
        for part in path.strip(".").split("."):
            node = node["properties"][part]  # every column points at a declared field
        assert node["type"] == kind, name


# ---------------------------------------------------------------------- status


def test_status_declares_every_field_the_operator_writes():
    props = STATUS_SCHEMA["properties"]
    observation = Observation(
        "Running", "running", (Cond("Running", "True", "AllJobsReady", "ok"),),
        restarts=1, preemptions=2, start_time="2024-01-01T00:00:00Z", completion_time="2024-01-02T00:00:00Z")
    merged = merge_status({}, observation, now="2024-01-01T00:00:00Z", generation=2)
    # what the handlers add to every status (jobSet identity and the spec's shape)
    handler_fields = {"observedGeneration", "jobSetName", "configMapName", "nodes", "gpusPerNode", "worldSize"}
    for key in set(merged) | handler_fields | {"progress", "kopf"}:
        assert key in props, f"status.{key} is not declared; the apiserver would prune it"
    condition = props["conditions"]["items"]["properties"]
    assert set(merged["conditions"][0]) <= set(condition)
    assert props["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert schema_errors(STATUS_SCHEMA, merged) == []


def test_the_crd_accepts_every_phase_the_operator_writes_and_no_other():
    # PHASES is derived from Phase (rosetta_contract.resource); the API server refuses a status
    # whose phase is not in the CRD's enum, so the two must not drift.
    assert STATUS_SCHEMA["properties"]["phase"]["enum"] == list(PHASES)
    assert "Succeeded" in PHASES and "Restarting" in PHASES


def test_progress_fields_needed_by_the_printer_columns():
    progress = STATUS_SCHEMA["properties"]["progress"]["properties"]
    assert {"display", "bleu", "step", "totalSteps", "percent", "lastCheckpoint"} <= set(progress)


# ------------------------------------------------------------------ structure


def _nodes(schema: dict, path: str = "spec"):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name, schema", [("spec", SPEC_SCHEMA), ("status", STATUS_SCHEMA)])
def test_schema_is_structural(name, schema):
    for path, node in _nodes(schema, name):
        assert not {"$ref", "$defs", "const", "allOf", "oneOf", "not", "prefixItems"} & set(node), path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node and node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
        for flag in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(flag, True) is True, path
        if "default" in node:
            assert schema_errors(node, node["default"]) == [], path
        if node.get("x-kubernetes-list-type") == "map":
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in node["items"]["required"], path


def _fields(model: type[BaseModel], schema: dict, path: str):
    for name, field in model.model_fields.items():
        key = field.alias or name
        assert key in schema["properties"], f"{path}.{key} is missing from the CRD"
        sub = schema["properties"][key]
        sub = sub.get("items", sub) if sub.get("type") == "array" else sub
        annotation = field.annotation
        for candidate in getattr(annotation, "__args__", ()) + (annotation,):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                yield from _fields(candidate, sub, f"{path}.{key}")
        yield f"{path}.{key}"


def test_every_spec_field_is_in_the_schema_with_its_description():
    paths = list(_fields(TranslationTrainingSpec, SPEC_SCHEMA, "spec"))
    assert {"spec.nodes", "spec.network.profile", "spec.volumes.persistentVolumeClaim.claimName",
            "spec.env.valueFrom.secretKeyRef.key", "spec.scheduling.tolerations.effect",
            "spec.training.batch.tokens"} <= set(paths)
    for key in ("image", "nodes", "gpusPerNode", "launcher", "network", "volumes", "suspend"):
        assert SPEC_SCHEMA["properties"][key]["description"], key
    assert SPEC_SCHEMA["properties"]["network"]["properties"]["profile"]["enum"] == [
        "generic", "eks-p4d", "eks-p5", "gke-a3"]
    assert SPEC_SCHEMA["properties"]["volumes"]["items"]["properties"]["name"]["pattern"]
    assert SPEC_SCHEMA["properties"]["env"]["items"]["properties"]["name"]["pattern"]


def test_schema_enforces_simple_bounds_itself():
    good = _raw()
    assert schema_errors(SPEC_SCHEMA, good) == []
    for patch, path in [({"nodes": 0}, "nodes"), ({"nodes": "two"}, "nodes"), ({"launcher": "mpirun"}, "launcher"),
                        ({"resources": {"cpu": "lots"}}, "resources.cpu"), ({"bogus": 1}, "bogus"),
                        ({"env": [{"name": "A"}, {"name": "A"}]}, "env")]:
        errors = schema_errors(SPEC_SCHEMA, {**good, **patch})
        assert errors and errors[0].startswith(path), (patch, errors)


# ------------------------------------------------------------------------ CEL

def _pydantic_valid(raw: dict) -> bool:
    doc = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "mt"}, "spec": raw}
    try:
        parse_training(doc)
    except ConfigError:
        return False
    return True


def _cel_failures(raw: dict) -> list[tuple[str, str, str]]:
    # The apiserver applies the schema's defaults before it runs the rules.
    return cel_failures(SPEC_SCHEMA, with_defaults(SPEC_SCHEMA, raw))


@pytest.mark.parametrize("case, raw, valid", CASES, ids=[c[0] for c in CASES])
def test_cel_rules_agree_with_pydantic(case, raw, valid):
    assert schema_errors(SPEC_SCHEMA, raw) == [], "cases must pass the plain schema; CEL is what is tested"
    assert _pydantic_valid(raw) is valid
    failures = _cel_failures(raw)
    if valid:
        assert failures == []
    else:
        assert len(failures) == 1, failures  # one rule, with its message, explains it


def test_every_cel_rule_is_exercised():
    broken = {rule for _, raw, valid in CASES if not valid for _, rule, _ in _cel_failures(raw)}
    assert broken == {rule.rule for rule in cel_rules()}


def test_cel_rules_sit_at_their_declared_paths():
    placed = [(path, rule) for path, node in _nodes(SPEC_SCHEMA, "")
              for rule in (c["rule"] for c in node.get("x-kubernetes-validations", []))]
    declared = [("." + r.path.replace(".[]", "[]") if r.path else "", r.rule) for r in cel_rules()]
    assert sorted(placed) == sorted(declared)
    for rule in cel_rules():
        assert rule.message and len(rule.message) <= MAX_MESSAGE


def test_cel_rules_guard_optional_fields():
    # A rule that touches an absent optional field errors in the apiserver ("no such key");
    # the smallest valid spec has every optional field absent.
    minimal = {"model": {"name": "t5-small"}, "data": {"sourceLang": "en", "targetLangs": ["de"]},
               "training": {"maxSteps": 1}}
    assert _pydantic_valid(minimal)
    assert cel_failures(SPEC_SCHEMA, minimal) == []
    assert cel_holds("has(self.a) != has(self.b)", {"a": 1})
