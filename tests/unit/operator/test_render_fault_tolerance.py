"""spec.faultTolerance → the spec's defaults and bounds, NCCL's settings in a GPU pod's env, and the
trainer config that carries the collective timeout to every rank."""

from __future__ import annotations

import copy

import pytest
import yaml
from test_render_s3 import TRAINER, env_list

from rosetta_contract.fault_tolerance_fields import FaultToleranceSpec
from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator.render import render
from support.openapi_check import assert_valid_jobset

NCCL = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
GPU = {"gpusPerNode": 8, "training": {"maxSteps": 10, "device": "cuda"}}


def build(**fields):
    return render("mt", "team", parse_spec({**copy.deepcopy(TRAINER), **fields}))


def test_defaults_leave_a_hung_collective_to_the_trainer_first():
    ft = FaultToleranceSpec()
    assert (ft.collective_timeout_seconds, ft.stall_timeout_seconds, ft.stall_action) == (1800, 3600, "restart")
    assert ft.stall_timeout_seconds > ft.collective_timeout_seconds


@pytest.mark.parametrize("given, path", [
    ({"stallTimeoutSeconds": 5}, "spec.faultTolerance.stallTimeoutSeconds"),
    ({"collectiveTimeoutSeconds": 0}, "spec.faultTolerance.collectiveTimeoutSeconds"),
    ({"stallAction": "none"}, "spec.faultTolerance.stallAction"),
    ({"stallTimeout": "30m"}, "spec.faultTolerance.stallTimeout"),
])
def test_bad_values_are_refused_with_their_field(given, path):
    with pytest.raises(ConfigError) as raised:
        parse_spec({**copy.deepcopy(TRAINER), "faultTolerance": given})
    assert path in str(raised.value)


def test_a_gpu_pod_gets_nccls_timeout_settings_from_the_spec():
    rendered = build(**GPU, faultTolerance={"collectiveTimeoutSeconds": 600})
    env = {e["name"]: e.get("value") for e in env_list(rendered)}
    assert {k: env[k] for k in NCCL} == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_ENABLE_MONITORING": "1",
                                          "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}
    assert_valid_jobset(rendered.jobset)


def test_a_cpu_pod_gets_none_of_them():
    names = {e["name"] for e in env_list(build())}
    assert not names & set(NCCL)


def test_a_setting_the_user_makes_in_env_is_theirs():
    rendered = build(**GPU, env=[{"name": "TORCH_NCCL_ENABLE_MONITORING", "value": "0"}])
    values = [(e["name"], e.get("value")) for e in env_list(rendered) if e["name"] == "TORCH_NCCL_ENABLE_MONITORING"]
    assert values == [("TORCH_NCCL_ENABLE_MONITORING", "0")]  # once, the user's


def test_the_trainer_config_carries_the_collective_timeout():
    rendered = build(faultTolerance={"collectiveTimeoutSeconds": 120, "stallAction": "report"})
    doc = yaml.safe_load(next(iter(rendered.configmap["data"].values())))
    assert {k: v for k, v in doc["spec"]["faultTolerance"].items() if k != "preflight"} == {
        "stallTimeoutSeconds": 3600, "stallAction": "report", "collectiveTimeoutSeconds": 120}
