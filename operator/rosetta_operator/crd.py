"""The TranslationTraining CRD, generated from the pydantic spec so the two never drift.

The spec's schema is the spec models' JSON Schema made structural (structural_schema.py), with the
CEL rules of crd_validations.py; the status schema (crd_status.py) is written out by hand because
a structural schema silently prunes undeclared status fields.
"""

from __future__ import annotations

from typing import Any

from rosetta_contract.resource import GROUP, KIND, PLURAL, VERSION
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_contract.trainer_pod import MAX_NAME_LENGTH
from rosetta_operator.crd_status import status_schema
from rosetta_operator.crd_validations import cel_rules
from rosetta_operator.structural_schema import node_at, structural

# The JobSet's headless Service takes the training's name.
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def spec_schema() -> dict[str, Any]:
    schema = TranslationTrainingSpec.model_json_schema(by_alias=True, mode="validation")
    out = structural(schema)
    out["description"] = " ".join((TranslationTrainingSpec.__doc__ or "").split("\n\n")[0].split())
    for rule in cel_rules():
        node_at(out, rule.path).setdefault("x-kubernetes-validations", []).append(
            {"rule": rule.rule, "message": rule.message})
    # list-type map: the apiserver itself rejects two env vars or volumes of one name.
    for path in ("env", "volumes"):
        node = node_at(out, path)
        node["x-kubernetes-list-type"] = "map"
        node["x-kubernetes-list-map-keys"] = ["name"]
    return out


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
    {"name": "GPUs/node", "type": "integer", "jsonPath": ".spec.gpusPerNode"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.display"},
    {"name": "BLEU", "type": "number", "jsonPath": ".status.progress.bleu"},
    # -o wide only: most trainings never restart; the validation loss is for a closer look.
    {"name": "Val loss", "type": "number", "jsonPath": ".status.progress.validationLoss", "priority": 1},
    {"name": "Gender gap", "type": "number", "jsonPath": ".status.progress.genderGapBleu", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "Preemptions", "type": "integer", "jsonPath": ".status.preemptions", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": ["tt"], "categories": ["rosetta"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "Train a translation model on a Kubernetes cluster (one JobSet).",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        # Only name may be restricted here; longer names cannot fit the pods' names.
                        "metadata": {"type": "object", "properties": {"name": {
                            "type": "string", "maxLength": MAX_NAME_LENGTH, "pattern": DNS1035_LABEL}}},
                        "spec": spec_schema(),
                        "status": status_schema(),
                    },
                }},
            }],
        },
    }


__all__ = ["build_crd", "spec_schema", "PRINTER_COLUMNS"]
