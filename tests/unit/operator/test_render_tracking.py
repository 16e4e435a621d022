"""spec.tracking → pod env: the W&B key and the MLflow token only by Secret reference."""

from __future__ import annotations

import copy
import json

import pytest
from test_render_s3 import TRAINER, env_list

from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator.render import render
from support.openapi_check import assert_valid_jobset

TRACKING = {
    "wandb": {"project": "mt-de", "entity": "team", "apiKeySecret": {"name": "wandb-creds", "key": "api-key"}},
    "mlflow": {"trackingUri": "https://mlflow.team.svc:5000", "tokenSecret": {"name": "mlflow", "key": "token"}},
}


def build(tracking: dict, env: list | None = None):
    raw = {**copy.deepcopy(TRAINER), "tracking": tracking}
    if env is not None:
        raw["env"] = env
    return render("mt", "team", parse_spec(raw))


def test_secret_refs_become_env_on_the_trainer_pod():
    rendered = build(TRACKING)
    env = {e["name"]: e for e in env_list(rendered)}
    assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": "wandb-creds", "key": "api-key"}}}
    assert env["MLFLOW_TRACKING_TOKEN"] == {"name": "MLFLOW_TRACKING_TOKEN",
                                            "valueFrom": {"secretKeyRef": {"name": "mlflow", "key": "token"}}}
    assert_valid_jobset(rendered.jobset)


def test_no_secret_named_means_no_credential_env():
    rendered = build({"wandb": {"project": "mt-de", "mode": "offline"}, "mlflow": {}})
    names = {e["name"] for e in env_list(rendered)}
    assert not names & {"WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN"}


def test_no_literal_credential_anywhere_in_the_rendered_objects():
    rendered = build(TRACKING)
    text = json.dumps([rendered.configmap, rendered.jobset])
    for e in env_list(rendered):
        if e["name"] in ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN"):
            assert "value" not in e
    # the ConfigMap's copy of the spec names the Secrets, never a key
    assert "apiKeySecret" in text and "wandb-creds" in text
    assert '"value": "' not in json.dumps([e for e in env_list(rendered) if "KEY" in e["name"] or "TOKEN" in e["name"]])


def test_a_literal_key_in_the_spec_is_refused():
    with pytest.raises(ConfigError):
        parse_spec({**copy.deepcopy(TRAINER), "env": [{"name": "WANDB_API_KEY", "value": "0123456789abcdef"}]})
    with pytest.raises(ConfigError):
        parse_spec({**copy.deepcopy(TRAINER), "tracking": {"wandb": {"project": "p", "apiKey": "0123456789abcdef"}}})


def test_the_same_variable_from_env_and_tracking_is_refused():
    with pytest.raises(ConfigError, match="tracking.wandb.apiKeySecret"):
        build(TRACKING, env=[{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}])
