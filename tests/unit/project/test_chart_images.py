"""The chart's image references: the `helm install` commands of docs/eks.md, docs/gke.md and
docs/helm.md, read out of the pages (shell variables expanded as the shell would), install exactly
the images the guides' `build_and_push.sh` lines push and name no placeholder; the cloud values files
alone, or any reference a container runtime would refuse, fail to render with a message that names
the value to set."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from rosetta_contract.documents import deep_merge
from rosetta_operator.handlers import DEFAULT_IMAGE_ENV
from support.chart import (
    CHART,
    GUIDES,
    MONITORING_APIS,
    REPO,
    HelmInstall,
    RenderError,
    expand,
    helm_installs,
    load_values,
    page_variables,
    parse_set,
    render,
    render_files,
    render_install,
    shell_blocks,
)

HELM_DOC = REPO / "docs" / "helm.md"
PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9])(ACCOUNT|REGION|PROJECT|REPO)(?![A-Za-z0-9])")
CLOUD_VALUES = {"eks": CHART / "values-eks.yaml", "gke": CHART / "values-gke.yaml"}


def cloud_install(page: Path, values_file: Path) -> HelmInstall:
    (install,) = [i for i in helm_installs(page) if values_file in i.values_files]
    return install


def images(objects: list[dict]) -> tuple[str, str]:
    """(operator image, default trainer image) of the rendered Deployment."""
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c["image"], {e["name"]: e.get("value") for e in c["env"]}[DEFAULT_IMAGE_ENV]


def pushed_by(page: Path) -> list[str]:
    """The images the page's `... ./build_and_push.sh` line pushes (--dry-run), its variables expanded."""
    variables = page_variables(page)
    (line,) = [line for block in shell_blocks(page) for line in block.splitlines() if "./build_and_push.sh" in line]
    words = shlex.split(expand(line, variables, page), comments=True)
    env = dict(w.split("=", 1) for w in words[:words.index("./build_and_push.sh")])
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "REGISTRY", "IMAGE_NAME", "TARGETS")}
    run = subprocess.run(["bash", str(REPO / "build_and_push.sh"), "--dry-run"], capture_output=True, text=True,
                         env={**inherited, **env}, timeout=60)
    assert run.returncode == 0, run.stderr
    return [line.split()[-1] for line in run.stdout.splitlines() if " push " in f" {line} "]


# ------------------------------------------------------------------------------ the guides


@pytest.mark.parametrize("cloud", sorted(GUIDES))
def test_guide_sets_its_variables_once_at_the_top(cloud):
    page = GUIDES[cloud]
    first_block = shell_blocks(page)[0]
    assert {"REGION", "REPO"} <= set(page_variables(page)), "the guide's account-specific values"
    assert set(page_variables(page)) == {w.split("=")[0] for w in shlex.split(first_block, comments=True)}, \
        f"{page.name}: its variables are set in its first code block, and nowhere else"


@pytest.mark.parametrize("cloud", sorted(GUIDES))
def test_guide_installs_the_images_it_pushed_and_no_placeholder(cloud):
    page = GUIDES[cloud]
    install = cloud_install(page, CLOUD_VALUES[cloud])
    assert install.namespace == "rosetta-system"
    objects = render_install(install, tests=True)
    text = yaml.safe_dump_all(objects)
    assert not PLACEHOLDER.findall(text), f"{page.name}: `{install.command}` leaves placeholders in: " + \
        ", ".join(sorted({m.group(0) for m in PLACEHOLDER.finditer(text)}))
    operator, trainer = images(objects)
    assert sorted([operator, trainer]) == sorted(pushed_by(page)), \
        f"{page.name}: the helm install names other images than its build_and_push.sh line pushes"


def test_helm_doc_cloud_commands_leave_no_placeholder():
    installs = helm_installs(HELM_DOC)
    assert {p for i in installs for p in i.values_files} == set(CLOUD_VALUES.values())
    for install in installs:
        objects = render_install(install, tests=True)
        assert not PLACEHOLDER.findall(yaml.safe_dump_all(objects)), install.command
        operator, trainer = images(objects)
        assert operator.replace("/rosetta-operator:", "/rosetta-trainer:") == trainer, install.command


@pytest.mark.parametrize("cloud", sorted(CLOUD_VALUES))
def test_the_operator_needs_no_cloud_identity(cloud):
    objects = render_install(cloud_install(GUIDES[cloud], CLOUD_VALUES[cloud]))
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert not account["metadata"].get("annotations"), \
        "the operator calls only the Kubernetes API: no IRSA role, no Workload Identity"


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("cloud, found", [("eks", "ACCOUNT, REGION, REPO"), ("gke", "REGION, PROJECT, REPO")])
def test_cloud_values_alone_are_refused_naming_the_value_to_set(cloud, found):
    with pytest.raises(RenderError) as err:
        render(values_files=[CLOUD_VALUES[cloud]], api_versions=MONITORING_APIS)
    message = str(err.value)
    repository = yaml.safe_load(CLOUD_VALUES[cloud].read_text())["image"]["repository"]
    assert (f'image.repository is "{repository}": {found} are placeholders of values-eks.yaml/values-gke.yaml, '
            "not part of an image name. Set image.repository to the operator image you pushed") in message
    assert "docs/eks.md and docs/gke.md set both images" in message


@pytest.mark.parametrize("cloud", sorted(CLOUD_VALUES))
def test_setting_only_the_operator_image_names_the_trainer_image(cloud):
    # What the guides used to say: the default trainer image kept its placeholders.
    install = cloud_install(GUIDES[cloud], CLOUD_VALUES[cloud])
    values = {"image": {"repository": install.values["image"]["repository"]}}
    with pytest.raises(RenderError, match=r"trainer\.image\.repository is \"[^\"]+\": .* placeholders? .*"
                                          r"Set trainer\.image\.repository to the trainer image you pushed"):
        render(values, values_files=[CLOUD_VALUES[cloud]], api_versions=MONITORING_APIS)


@pytest.mark.parametrize("values, message", [
    ({"image": {"repository": "ghcr.io/My-Org/rosetta-operator"}},
     'image.repository is "ghcr.io/My-Org/rosetta-operator", which is not an image repository a container runtime '
     "accepts: lowercase letters and digits"),
    ({"trainer": {"image": {"repository": "ghcr.io/my-org/rosetta-trainer:0.2.0"}}},
     "without a tag or digest (the tag is a value of its own). Set trainer.image.repository to the trainer image"),
    ({"trainer": {"image": {"repository": "registry.internal/REPO/rosetta-trainer"}}},
     'trainer.image.repository is "registry.internal/REPO/rosetta-trainer": REPO is a placeholder'),
    ({"image": {"tag": "-rc1"}}, 'image.tag has the tag "-rc1", which is not an image tag'),
    ({"trainer": {"image": {"tag": "v 2"}}}, 'trainer.image.tag has the tag "v 2", which is not an image tag'),
    ({"helmTest": {"image": "Python:3.11"}}, 'helmTest.image is "Python", which is not an image repository'),
    ({"helmTest": {"image": "python@sha256:abc"}}, 'helmTest.image has the digest "sha256:abc", which is not one'),
], ids=["uppercase", "tag-in-repository", "placeholder", "tag", "trainer-tag", "helm-test", "digest"])
def test_an_image_a_runtime_would_refuse_is_refused_at_render(values, message):
    with pytest.raises(RenderError) as err:
        render(values)
    assert message in str(err.value)


@pytest.mark.parametrize("values", [
    {"image": {"repository": "localhost:5000/rosetta-operator", "tag": "test"}},
    {"image": {"repository": "127.0.0.1:5000/a/b__c/d-e.f", "tag": "0.1.0_rc.1"}},
    {"trainer": {"image": {"repository": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/rosetta-trainer"}}},
    {"helmTest": {"image": "registry.internal:5000/tools/python:3.11"}},
    {"helmTest": {"image": "python@sha256:" + "0" * 64}},
], ids=["local-registry", "separators", "ecr", "helm-test-port-and-tag", "helm-test-digest"])
def test_valid_references_pass(values):
    assert render(values)


def test_set_parser_reads_what_helm_reads():
    assert parse_set("a.b=1,c=true,d=null,e=0.1.0,f={x,y}") == {
        "a": {"b": 1}, "c": True, "d": None, "e": "0.1.0", "f": ["x", "y"]}
    assert parse_set(r"annotations.eks\.amazonaws\.com/role-arn=arn") == {
        "annotations": {"eks.amazonaws.com/role-arn": "arn"}}
    assert parse_set("tag=1", strings=True) == {"tag": "1"}


# ---------------------------------------------------------------------- NOTES.txt, the OCI chart


@pytest.mark.parametrize("cloud", sorted(GUIDES))
def test_the_guides_notes_start_a_quickstart_on_the_pushed_trainer(cloud):
    """NOTES.txt points at quickstart-cpu.yaml, which has no spec.image: it runs the chart's default
    trainer image, so that must be the one the guide pushed, and no placeholder is left to read."""
    page = GUIDES[cloud]
    install = cloud_install(page, CLOUD_VALUES[cloud])
    values: dict = {}
    for path in install.values_files:
        values = deep_merge(values, load_values(path))
    notes = render_files(deep_merge(values, install.values), namespace=install.namespace,
                         api_versions=MONITORING_APIS)["rosetta/templates/NOTES.txt"]
    assert not PLACEHOLDER.findall(notes), notes
    (trainer,) = [image for image in pushed_by(page) if "/rosetta-trainer:" in image]
    assert f"Trainings without spec.image run {trainer}." in notes
    (namespace,) = install.values["watchNamespaces"]
    assert f"kubectl apply -n {namespace} -f manifests/examples/quickstart-cpu.yaml" in notes
    quickstart = [d for d in yaml.safe_load_all((REPO / "manifests/examples/quickstart-cpu.yaml").read_text())
                  if d and d["kind"] == "TranslationTraining"]
    assert quickstart and not any(d["spec"].get("image") for d in quickstart)


def oci_install() -> tuple[str, str, dict, list[Path]]:
    """helm.md's `helm install rosetta oci://…`: (chart reference, --version, --set values, -f files
    as they are in the pulled chart)."""
    (line,) = [line for block in shell_blocks(HELM_DOC) for line in block.splitlines()
               if line.split()[:2] == ["helm", "install"] and "oci://" in line]
    words = shlex.split(line, comments=True)
    reference = next(w for w in words if w.startswith("oci://"))
    version, values, files = "", {}, []
    for flag, value in zip(words, words[1:]):
        if flag == "--version":
            version = value
        elif flag == "--set":
            values = deep_merge(values, parse_set(value))
        elif flag in ("-f", "--values"):
            files.append(CHART / value)
    return reference, version, values, files


def test_helm_doc_installs_the_chart_from_where_build_and_push_pushes_it():
    reference, version, values, files = oci_install()
    found = re.fullmatch(r"oci://(\d+)\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com/(.+)/charts/rosetta", reference)
    assert found, reference
    account, region, repo = found.groups()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "REGISTRY", "IMAGE_NAME", "TARGETS")}
    run = subprocess.run(["bash", str(REPO / "build_and_push.sh"), "--dry-run"], capture_output=True, text=True,
                         env={**env, "AWS_ACCOUNT_ID": account, "AWS_REGION": region, "REPO_NAME": repo,
                              "TAG": version, "TARGETS": "trainer operator chart"}, timeout=60)
    assert run.returncode == 0, run.stderr
    pushed = [line.split()[-1] for line in run.stdout.splitlines() if line.startswith("docker push ")]
    (chart_push,) = [line for line in run.stdout.splitlines() if line.startswith("helm push ")]
    assert chart_push.endswith(f"/rosetta-{version}.tgz {reference.rsplit('/', 1)[0]}"), chart_push
    # The images named are the ones pushed beside the chart, at its appVersion (the same tag).
    assert sorted(f"{r}:{version}" for r in (values["image"]["repository"],
                                             values["trainer"]["image"]["repository"])) == sorted(pushed)
    assert [f.name for f in files] == ["values-eks.yaml"] and all(f.exists() for f in files)
    objects = render(values, values_files=files, api_versions=MONITORING_APIS, tests=True)
    assert not PLACEHOLDER.findall(yaml.safe_dump_all(objects))
    assert images(objects) == tuple(f"{r}:{version}" for r in (values["image"]["repository"],
                                                                 values["trainer"]["image"]["repository"]))
