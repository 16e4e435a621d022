"""Every shipped TranslationTraining validates, renders, and passes both CRDs' schemas."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from openapi_check import assert_valid_jobset, cel_failures, schema_errors, with_defaults
from rosetta_operator.crd import build_crd
from rosetta_operator.render import render
from rosetta_operator.spec import load_training
from rosetta_trainer.cli import main

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
EXAMPLES = MANIFESTS + sorted((ROOT / "examples").glob("*.yaml"))
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_there_are_five_cluster_scenarios():
    assert len(MANIFESTS) >= 5
    specs = [load_training(path).spec for path in MANIFESTS]
    profiles = {spec.network.profile for spec in specs}
    assert {"generic", "eks-p5", "gke-a3"} <= profiles
    assert any(spec.gpus_per_node == 0 and spec.nodes > 1 for spec in specs)  # multi-node CPU
    assert any(spec.suspend and spec.scheduling.queue_name for spec in specs)  # Kueue
    assert any(spec.scheduling.tolerations for spec in specs)
    assert any(v.persistent_volume_claim for spec in specs for v in spec.volumes)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_example_validates_and_renders(path, capsys):
    assert main(["validate", "-f", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    training = load_training(path)
    rendered = render(training.metadata.name, training.metadata.namespace or "default", training.spec)
    assert_valid_jobset(rendered.jobset)
    assert main(["render", "-f", str(path)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["ConfigMap", "JobSet"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_example_passes_the_translation_training_crd(path):
    # What `kubectl apply` would check: the schema, then CEL on the defaulted object.
    raw = yaml.safe_load(path.read_text())
    assert schema_errors(SCHEMA, raw, skip=("metadata",)) == []
    assert cel_failures(SCHEMA, with_defaults(SCHEMA, raw)) == []
