"""docs/operator.md keeps up with the code: every cluster field, phase, reason and column."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel

from rosetta_contract.config import TrainerSpec
from rosetta_contract.resource import Phase
from rosetta_contract.scheduling_fields import SchedulingSpec
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.conditions import ConditionType, Reason
from rosetta_operator.crd import PRINTER_COLUMNS

DOC = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()


def _leaf_paths(model: type[BaseModel], prefix: str = "", top: bool = False):
    for name, field in model.model_fields.items():
        if top and name in TrainerSpec.model_fields:
            continue
        path = f"{prefix}{field.alias or name}"
        nested = [c for c in getattr(field.annotation, "__args__", ()) + (field.annotation,)
                  if isinstance(c, type) and issubclass(c, BaseModel)]
        if nested:
            yield from _leaf_paths(nested[0], path + ".")
        else:
            yield path


def test_every_cluster_field_is_documented():
    # Both env refs have the same fields and share rows: env.valueFrom.*.key.
    paths = {re.sub(r"\.(secretKeyRef|configMapKeyRef)\.", ".*.", p)
             for p in _leaf_paths(TranslationTrainingSpec, top=True)}
    assert len(paths) > 40
    missing = sorted(p for p in paths if f"| `{p}` |" not in DOC)
    assert not missing, f"docs/operator.md has no table row for {missing}"


def test_phases_reasons_conditions_and_columns_are_documented():
    constants = [v for cls in (Phase, Reason) for k, v in vars(cls).items()
                 if k.isupper() and isinstance(v, str)]
    constants += [v for k, v in vars(ConditionType).items() if k.isupper() and isinstance(v, str)]
    missing = [c for c in constants if f"`{c}`" not in DOC]
    assert not missing, f"docs/operator.md does not mention {missing}"
    for column in PRINTER_COLUMNS:
        assert f"| {column['name']} | `{column['jsonPath']}`" in DOC, column


def test_commands_are_documented():
    for command in ("rosetta validate -f", "rosetta render -f", "rosetta crd", "rosetta operator",
                    "kubectl apply -f manifests/crd.yaml"):
        assert command in DOC, command


def test_the_topology_example_fits_the_kueue_objects_beside_it():
    """The section's training, LocalQueue, ClusterQueue, ResourceFlavor and Topology name one another."""
    section = DOC[DOC.index("### Topology-aware placement"):]
    section = section[:section.index("\n### ", 1)]
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", section, re.S) for d in yaml.safe_load_all(block) if d]
    training = docs[0]["spec"]
    scheduling = SchedulingSpec.model_validate(training["scheduling"], by_name=False)
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs[1:]}
    queue = by_kind["LocalQueue", scheduling.queue_name]
    (flavor,) = by_kind["ClusterQueue", queue["spec"]["clusterQueue"]]["spec"]["resourceGroups"][0]["flavors"]
    topology = by_kind["Topology", by_kind["ResourceFlavor", flavor["name"]]["spec"]["topologyName"]]
    assert scheduling.topology is not None
    assert scheduling.topology.level in [level["nodeLabel"] for level in topology["spec"]["levels"]]
    flavors = [d for d in docs[1:] if d["kind"] == "ResourceFlavor"]  # EKS and GKE
    assert len(flavors) == 2 and all(("Topology", f["spec"]["topologyName"]) in by_kind for f in flavors)
