"""spec.checkpoint.s3 → pod env: credentials only by Secret reference, or none (the standard AWS chain)."""

from __future__ import annotations

import copy

import pytest
import yaml

from rosetta_contract.spec import ConfigError, parse_spec
from rosetta_operator.render import render
from support.openapi_check import assert_valid_jobset

TRAINER = {
    "model": {"architecture": "transformer", "size": "tiny"},
    "tokenizer": {"train": {"vocabSize": 500}},
    "data": {"sourceLang": "en", "targetLangs": ["de"], "train": [{"format": "generated", "size": 100}]},
    "training": {"maxSteps": 10},
}
AWS_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
OTHER_SECRET = {"secretKeyRef": {"name": "team-aws", "key": "key"}}


def build(s3: dict | None, **cluster):
    raw = copy.deepcopy(TRAINER)
    if s3 is not None:
        raw["checkpoint"] = {"s3": s3}
    return render("mt", "team", parse_spec({**raw, **cluster}))


def env_list(rendered) -> list[dict]:
    (job,) = rendered.jobset["spec"]["replicatedJobs"]
    (trainer,) = job["template"]["spec"]["template"]["spec"]["containers"]
    return trainer["env"]


def test_credentials_secret_becomes_secret_key_refs():
    rendered = build({"uri": "s3://ckpts/runs/mt", "credentialsSecret": "s3-creds"})
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env_list(rendered) if e["name"] in AWS_KEYS}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"},
        # A Secret for static keys has no token: its absence must not keep the pod from starting.
        "AWS_SESSION_TOKEN": {"name": "s3-creds", "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    assert not any("value" in e for e in env_list(rendered) if e["name"] in AWS_KEYS)
    assert_valid_jobset(rendered.jobset)


def test_no_secret_means_no_credentials_in_the_pod():
    for s3 in (None, {"uri": "s3://ckpts/runs/mt", "region": "eu-west-1"}):
        names = {e["name"] for e in env_list(build(s3))}
        assert not names & AWS_KEYS, s3


def test_no_credential_reaches_the_configmap():
    rendered = build({"uri": "s3://ckpts/runs/mt", "endpointUrl": "http://minio.storage:9000",
                      "credentialsSecret": "s3-creds", "keep": 2})
    (text,) = rendered.configmap["data"].values()
    s3 = yaml.safe_load(text)["spec"]["checkpoint"]["s3"]
    assert s3 == {"uri": "s3://ckpts/runs/mt", "endpointUrl": "http://minio.storage:9000", "keep": 2,
                  "credentialsSecret": "s3-creds"}


def test_user_env_clashing_with_the_secret_is_an_error():
    with pytest.raises(ConfigError) as err:
        build({"uri": "s3://ckpts/x", "credentialsSecret": "s3-creds"},
              env=[{"name": "HOME_DIR", "value": "/x"}, {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": OTHER_SECRET}])
    assert err.value.errors == [("spec.env[1].name", "AWS_SECRET_ACCESS_KEY is set from "
                                 "checkpoint.s3.credentialsSecret 's3-creds'; remove one of them")]


def test_user_may_set_aws_env_when_no_secret_is_named():
    env = env_list(build({"uri": "s3://ckpts/x"}, env=[{"name": "AWS_REGION", "value": "us-west-2"},
                                                       {"name": "AWS_ACCESS_KEY_ID", "valueFrom": OTHER_SECRET}]))
    assert [e for e in env if e["name"] in AWS_KEYS] == [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": OTHER_SECRET}]


@pytest.mark.parametrize("s3, field, message", [
    ({"uri": "gs://ckpts/x"}, "uri", "must start with s3://"),
    ({"uri": "s3://"}, "uri", "names no bucket"),
    ({"uri": "s3://Ckpts_1/x"}, "uri", "is not a valid S3 bucket name"),
    ({"uri": "s3://ckpts", "endpointUrl": "minio:9000"}, "endpointUrl", "http:// or https://"),
    ({"uri": "s3://ckpts", "credentialsSecret": "S3_Creds"}, "credentialsSecret", "not a valid Secret name"),
    ({"uri": "s3://ckpts", "keep": 0}, "keep", "greater than or equal to 1"),
    ({"uri": "s3://ckpts", "accessKeyId": "AKIA"}, "accessKeyId", "Extra inputs are not permitted"),
])
def test_bad_s3_settings_name_the_field(s3, field, message):
    with pytest.raises(ConfigError) as err:
        build(s3)
    paths = [path for path, _ in err.value.errors]
    assert paths == [f"spec.checkpoint.s3.{field}"], err.value.errors
    assert message in err.value.errors[0][1]
