"""The operator's default trainer image (`--default-image`, ROSETTA_DEFAULT_IMAGE; the chart's
trainer.image) for trainings without spec.image, and the chart's image names against what
build_and_push.sh pushes."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess

import kopf
import pytest

from rosetta_contract.trainer_pod import DEFAULT_IMAGE
from rosetta_operator import handlers
from support.chart import CHART, GUIDES, MONITORING_APIS, REPO, helm_installs, render, render_install
from support.handler_api import NAME, memo, reconcile, training

OTHER = "registry.internal/ml/rosetta-trainer:2.0"


def trainer_image(fake_api) -> str:
    jobset = fake_api.get("jobsets", NAME)
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"]


def test_a_spec_without_image_gets_the_operators_default(api):  # noqa: F811
    training(api)
    m = memo(api)
    m.default_image = OTHER
    reconcile(api, m)
    assert trainer_image(api) == OTHER
    # Rendered, not written back: the training says what its author wrote.
    assert "image" not in api.get("translationtrainings", NAME)["spec"]


def test_a_spec_with_an_image_keeps_it(api):  # noqa: F811
    training(api, image="ghcr.io/me/trainer:1")
    m = memo(api)
    m.default_image = OTHER
    reconcile(api, m)
    assert trainer_image(api) == "ghcr.io/me/trainer:1"


def test_without_a_default_the_specs_own_applies(api):  # noqa: F811
    training(api)
    reconcile(api, memo(api))
    assert trainer_image(api) == DEFAULT_IMAGE


def test_the_policy_sees_the_default_image(api, warnings):  # noqa: F811
    from rosetta_operator.policy import Policy

    training(api)
    m = memo(api)
    m.default_image, m.policy = OTHER, Policy.model_validate({"allowedRegistries": ["ghcr.io/"]}, by_name=False)
    body = reconcile(api, m)
    assert api.of("jobsets") == []
    assert "registry.internal/ml/rosetta-trainer:2.0" in warnings[0]["message"]
    assert body["status"]["phase"] == "Failed"


@pytest.mark.parametrize("flag, env, expected", [
    (None, None, None), (None, OTHER, OTHER), ("ghcr.io/x/t:1", OTHER, "ghcr.io/x/t:1"),
], ids=["none", "env", "flag-wins"])
def test_startup_reads_the_flag_then_the_environment(flag, env, expected, monkeypatch, tmp_path):
    import yaml
    from kubernetes.config import kube_config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "unit",
        "clusters": [{"name": "unit", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "unit", "user": {"token": "unit"}}],
        "contexts": [{"name": "unit", "context": {"cluster": "unit", "user": "unit"}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    if env:
        monkeypatch.setenv(handlers.DEFAULT_IMAGE_ENV, env)
    else:
        monkeypatch.delenv(handlers.DEFAULT_IMAGE_ENV, raising=False)
    m = kopf.Memo(default_image=flag) if flag else kopf.Memo()
    handlers.configure(settings=kopf.OperatorSettings(), memo=m, logger=logging.getLogger(__name__))
    try:
        assert m.default_image == expected
    finally:
        m.api_client.close()


def test_the_cli_flag_reaches_the_memo(monkeypatch):
    from rosetta_operator import main as operator_main
    from rosetta_operator.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["operator", "--default-image", OTHER])
    seen = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(kopf, "configure", lambda **_: None)
    assert operator_main.run(args) == 0
    assert seen["memo"].default_image == OTHER


# ---------------------------------------------------------------------------------- the chart


def operator_env(objects: list[dict]) -> dict[str, str]:
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def test_chart_passes_trainer_image_to_the_operator():
    assert operator_env(render())[handlers.DEFAULT_IMAGE_ENV] == DEFAULT_IMAGE
    env = operator_env(render({"trainer": {"image": {"repository": "registry.internal/ml/rosetta-trainer",
                                                     "tag": "2.0"}}}))
    assert env[handlers.DEFAULT_IMAGE_ENV] == OTHER
    # The tag follows the operator's when unset: one release, one version of both images.
    env = operator_env(render({"image": {"tag": "0.2.0"}}))
    assert env[handlers.DEFAULT_IMAGE_ENV] == "ghcr.io/rosetta-dev/rosetta-trainer:0.2.0"


def test_chart_default_images_are_what_build_and_push_publishes():
    import yaml

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    registry = values["image"]["repository"].rsplit("/", 1)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "IMAGE_NAME", "TARGETS")}
    run = subprocess.run(["bash", str(REPO / "build_and_push.sh"), "--dry-run"], capture_output=True, text=True,
                         env={**env, "REGISTRY": registry, "TAG": chart["appVersion"]}, timeout=60)
    assert run.returncode == 0, run.stderr
    pushed = [line.split()[-1] for line in run.stdout.splitlines() if " push " in f" {line} "]
    (deploy,) = [o for o in render() if o["kind"] == "Deployment"]
    operator_image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert sorted(pushed) == sorted([operator_image, operator_env(render())[handlers.DEFAULT_IMAGE_ENV]])
    assert DEFAULT_IMAGE in pushed  # the spec's own default too


@pytest.mark.parametrize("cloud", ["eks", "gke"])
def test_cloud_guides_take_both_images_from_one_registry(cloud):
    # The cloud values alone are refused (their placeholders); the guide's own command is what users run.
    (install,) = [i for i in helm_installs(GUIDES[cloud]) if i.values_files]
    objects = render_install(install, api_versions=MONITORING_APIS)
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    operator_image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    trainer = operator_env(objects)[handlers.DEFAULT_IMAGE_ENV]
    assert operator_image.replace("/rosetta-operator:", "/rosetta-trainer:") == trainer


def test_readmes_cluster_steps_give_the_operator_the_trainer_they_pushed():
    """README's `rosetta operator` (step 3) runs trainings without spec.image, the quickstart among
    them, on the trainer image its build_and_push.sh line (step 1) pushed, not the project's."""
    import re
    import shlex

    block = (REPO / "README.md").read_text().split("## On a cluster", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    lines = block.splitlines()
    (push,) = [line for line in lines if "./build_and_push.sh" in line]
    words = shlex.split(push, comments=True)
    pushed_env = dict(w.split("=", 1) for w in words[:words.index("./build_and_push.sh")])
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "IMAGE_NAME", "TARGETS")}
    run = subprocess.run(["bash", str(REPO / "build_and_push.sh"), "--dry-run"], capture_output=True, text=True,
                         env={**env, **pushed_env}, timeout=60)
    assert run.returncode == 0, run.stderr
    (trainer,) = [line.split()[-1] for line in run.stdout.splitlines()
                  if line.startswith("docker push ") and "/rosetta-trainer:" in line]
    (operator,) = [line for line in lines if re.match(r"rosetta operator\b", line)]
    args = cli_parser().parse_args(shlex.split(operator, comments=True)[1:])
    assert args.default_image == trainer, operator
    helm = " ".join(line.lstrip("# ").rstrip("\\ ") for line in lines if line.startswith("#") and "--set" in line)
    assert f"trainer.image.repository={trainer.rsplit(':', 1)[0]}" in helm, "the chart's alternative, too"


def cli_parser() -> argparse.ArgumentParser:
    from rosetta_operator.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    return parser
