"""resources.cpu → OMP_NUM_THREADS in the gang's pods: each process gets its share of the cores the
pod requested, not a thread per core of the node it shares."""

from __future__ import annotations

import copy

import pytest
from test_render_s3 import TRAINER, env_list

from rosetta_contract.spec import parse_spec
from rosetta_operator.render import render


def threads(**fields) -> list:
    rendered = render("mt", "team", parse_spec({**copy.deepcopy(TRAINER), **fields}))
    return [e.get("value") for e in env_list(rendered) if e["name"] == "OMP_NUM_THREADS"]


@pytest.mark.parametrize("resources, topology, expected", [
    ({"cpu": "1"}, {}, "1"),
    ({"cpu": "16"}, {"procsPerNode": 4}, "4"),
    ({"cpu": "7500m"}, {"procsPerNode": 2}, "3"),
    ({"cpu": "500m"}, {}, "1"),
    ({"cpu": "1k"}, {"procsPerNode": 8}, "125"),  # any quantity the spec admits, not only m and plain numbers
    ({"cpu": "96"}, {"gpusPerNode": 8, "training": {"maxSteps": 10, "device": "cuda"}}, "12"),
    ({"cpu": "4"}, {"gpusPerNode": 8, "training": {"maxSteps": 10, "device": "cuda"}}, "1"),
])
def test_each_process_gets_its_share_of_the_pods_whole_cores(resources, topology, expected):
    assert threads(resources=resources, **topology) == [expected]


def test_without_a_cpu_request_torch_and_torchrun_choose():
    assert threads() == []


def test_a_value_in_env_is_the_users():
    assert threads(resources={"cpu": "8"}, env=[{"name": "OMP_NUM_THREADS", "value": "2"}]) == ["2"]
