"""The core/v1 type table that free-form pod fields (scheduling.affinity) are checked against."""

import json
from pathlib import Path

from rosetta_contract import core_types
from rosetta_operator.core_types_table import table

TABLE = Path(core_types.__file__).with_name("core_types.json")


def test_the_committed_table_is_what_the_installed_client_says():
    """A client upgrade that adds a field must reach the table (`make generate`), or the field is
    refused as unknown."""
    assert json.loads(TABLE.read_text()) == table()


def test_the_table_reaches_every_type_under_an_affinity():
    types = json.loads(TABLE.read_text())
    assert {"V1Affinity", "V1NodeAffinity", "V1PodAffinityTerm", "V1LabelSelectorRequirement",
            "V1NodeSelectorRequirement", "V1WeightedPodAffinityTerm"} <= set(types)


def test_problems_name_the_path_and_what_was_expected():
    found = core_types.problems({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": "a"}]}]}},
        "podAffinity": {"preferredDuringScheduling": []},
    }, "V1Affinity")
    assert found == [
        "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]"
        ".values: expected a list, not a string",
        "podAffinity.preferredDuringScheduling: PodAffinity has no field 'preferredDuringScheduling' (it has: "
        "preferredDuringSchedulingIgnoredDuringExecution, requiredDuringSchedulingIgnoredDuringExecution)",
    ]
