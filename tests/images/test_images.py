"""The Dockerfile's images, built on a Debian base with a Docker engine from Debian (no registry):
the trainer trains a step and runs its entrypoint, the operator imports without torch, both run as
UID 10001, and build_and_push.sh pushes to a local registry that the images are pulled back from.

Marked slow (`make test` runs them, `make test-fast` does not). A cold run builds the base and the
images (several minutes, several GB of PyPI wheels); later runs reuse Docker's layer cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest

from support.images import BASE_IMAGE, BUILD_ARGS, DOCKER, HERE, REPO, docker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

SMOKE = (HERE / "smoke.py").read_text()
OPERATOR_IMPORT = "import sys, rosetta_operator.handlers; assert 'torch' not in sys.modules"


def smoke(image: str) -> str:
    proc = subprocess.run([DOCKER, "run", "--rm", "-i", "--network", "none", "--entrypoint", "python", image, "-"],
                          input=SMOKE, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def constraints() -> dict[str, str]:
    pins = [line.split("#")[0].strip() for line in (REPO / "constraints.txt").read_text().splitlines()]
    return dict(_pin(pin) for pin in pins if pin)


def _canonical(name: str) -> str:
    # pip prints a distribution's name as its metadata spells it (prometheus_client), pins use PEP 503's.
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin(pin: str) -> tuple[str, str]:
    name, version = pin.split("==")
    return _canonical(name), version


def test_docker_engine_script_is_idempotent(docker_engine):
    for _ in range(2):
        out = subprocess.run(["bash", str(HERE / "docker-engine.sh")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    assert docker("info", "--format", "{{.ServerVersion}}").stdout.strip()


def test_debian_base_is_python_3_11_and_reused(test_base):
    out = docker("run", "--rm", "--network", "none", test_base, "python3", "-c",
                 "import sys, venv; print('%d.%d' % sys.version_info[:2])")
    assert out.stdout.strip() == "3.11"  # the production base's minor (python:3.11-slim-bookworm)
    again = subprocess.run(["bash", str(HERE / "debian-base.sh")], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "IMAGE": BASE_IMAGE})
    assert again.returncode == 0 and "is current" in again.stderr, again.stderr


def test_trainer_image_builds_a_t5_and_trains_a_step(images):
    out = smoke(images.trainer)
    assert re.search(r"smoke ok: uid 10001 loss \d+\.\d+", out), out


def test_trainer_image_ships_the_pinned_versions(images):
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "pip", images.trainer,
                 "list", "--format", "json").stdout
    installed = {_canonical(p["name"]): p["version"] for p in json.loads(out)}
    # constraints.txt pins the operator's extra too, which the trainer image does not install.
    operator_only = {"kopf", "kubernetes", "shtab", "jsonpath-ng"}
    for name, version in constraints().items():
        if name in operator_only and name not in installed:
            continue
        assert installed.get(name) == version, f"{name}: {installed.get(name)} in the image, {version} pinned"
    torch = re.search(r"^ARG TORCH=torch==(\S+)", (REPO / "Dockerfile").read_text(), re.M).group(1)
    assert installed["torch"].split("+")[0] == torch
    assert any(name.startswith("nvidia-") for name in installed), "the CUDA runtime wheels are missing"


def test_trainer_entrypoint_is_rosetta(images):
    out = docker("run", "--rm", "--network", "none", images.trainer, "--help")
    assert "usage: rosetta" in out.stdout and "train" in out.stdout


def test_operator_image_has_no_torch(images):
    docker("run", "--rm", "--network", "none", "--entrypoint", "python", images.operator, "-c", OPERATOR_IMPORT)
    missing = docker("run", "--rm", "--network", "none", "--entrypoint", "python", images.operator, "-c",
                     "import torch", check=False)
    assert missing.returncode != 0 and "No module named 'torch'" in missing.stderr
    out = docker("run", "--rm", "--network", "none", images.operator, "--help")
    assert "usage: rosetta operator" in out.stdout


@pytest.mark.parametrize("which", ["trainer", "operator"])
def test_images_run_as_uid_10001(images, which):
    image = getattr(images, which)
    assert docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == "10001:10001"
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "id", image)
    assert out.stdout.startswith("uid=10001(rosetta) gid=10001(rosetta)"), out.stdout


def _registry_json(url: str, accept: str = "") -> dict:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_build_and_push_to_a_local_registry_and_pull_back(images, local_registry, tmp_path):
    """build_and_push.sh with REGISTRY and BUILD_ARGS (the Debian base), then the pushed tags are removed
    and pulled back, and the pulled images pass the same checks.

    The layers stay on this engine under the :test tags (removing them would throw away the build
    cache), so `docker pull` fetches the manifests and finds the layers present: that every layer
    blob is in the registry is checked against the registry's own API instead.

    The registry keeps its blobs between sessions (`local_registry`, tests/images/conftest.py), so
    the push uploads only the layers that changed since the last session (seconds when none did,
    not the minutes of gzipping the trainer's GB into an empty registry); the tags of earlier
    sessions are set aside before it starts, so the tags read here exist only if this push made them."""
    # PIN_BASES=off: the test base exists only in this engine, and a registry must not be asked for it.
    env = {**os.environ, "REGISTRY": local_registry, "TAG": "test", "IMAGE_NAME": "rosetta", "PIN_BASES": "off",
           "BUILD_ARGS": " ".join(f"{k}={v}" for k, v in BUILD_ARGS.items())}
    for name in ("PROJECT_ID", "AWS_ACCOUNT_ID", "TARGETS", "PLATFORM"):
        env.pop(name, None)
    log = tmp_path / "build_and_push.log"
    with log.open("w") as out:
        proc = subprocess.run(["bash", str(REPO / "build_and_push.sh")], env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=3000, cwd=REPO)
    assert proc.returncode == 0, log.read_text()[-4000:]

    pushed = {which: f"{local_registry}/rosetta-{which}:test" for which in ("trainer", "operator")}
    built_ids = {which: docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
                 for which, ref in pushed.items()}
    try:
        for which in pushed:
            manifest = _registry_json(f"http://{local_registry}/v2/rosetta-{which}/manifests/test",
                                      "application/vnd.docker.distribution.manifest.v2+json")
            assert manifest["config"]["digest"] == built_ids[which]
            for layer in manifest["layers"]:
                req = urllib.request.Request(f"http://{local_registry}/v2/rosetta-{which}/blobs/{layer['digest']}",
                                             method="HEAD")
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert int(r.headers["Content-Length"]) == layer["size"], layer
            if which == "operator":  # small enough to read back whole and check every digest
                for layer in manifest["layers"]:
                    url = f"http://{local_registry}/v2/rosetta-operator/blobs/{layer['digest']}"
                    with urllib.request.urlopen(url, timeout=120) as r:
                        assert "sha256:" + hashlib.sha256(r.read()).hexdigest() == layer["digest"]

        docker("rmi", *pushed.values())
        for which, ref in pushed.items():
            docker("image", "inspect", ref, check=False).returncode != 0 or pytest.fail(f"{ref} still here")
            docker("pull", ref, timeout=1200)
            assert docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() == built_ids[which]

        assert "smoke ok: uid 10001" in smoke(pushed["trainer"])
        docker("run", "--rm", "--network", "none", "--entrypoint", "python", pushed["operator"], "-c", OPERATOR_IMPORT)
    finally:
        docker("rmi", *pushed.values(), check=False)


# ----------------------------------------------------------------------------- bases by digest

PIN = REPO / "scripts" / "pin_base_images.py"
BASE_LABELS = ("org.opencontainers.image.base.name", "org.opencontainers.image.base.digest")


def _tag_digest(registry: str, repository: str, tag: str) -> str:
    req = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, "
                  "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers["Docker-Content-Digest"]


def _labels(image: str) -> dict[str, str]:
    return json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)


def test_bases_pinned_by_digest_from_a_local_registry(test_base, local_registry, tmp_path):
    """scripts/pin_base_images.py and build_and_push.sh against a real registry: the bases of a copy
    of the Dockerfile name a tag there (the Debian base, pushed); --check reports them, build_and_push.sh
    builds from the tag's digest and labels it, --write pins that digest; the tag moves to another
    image and --write moves the pin; the moved-to image, gone from this engine, is pulled back by
    digest for the next build."""
    repository = "rosetta-test/python"
    ref = f"{local_registry}/{repository}:pin"
    ctx = tmp_path / "ctx"
    (ctx / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "build_and_push.sh", ctx)
    shutil.copy(PIN, ctx / "scripts")
    # The real Dockerfile's header (its ARG lines), with stages that build in seconds.
    header = (REPO / "Dockerfile").read_text().split("\nFROM ", 1)[0]
    assert header.count("=python:3.11-slim-bookworm\n") == 2
    (ctx / "Dockerfile").write_text(header.replace("=python:3.11-slim-bookworm\n", f"={ref}\n") + """
FROM ${PYTHON_IMAGE} AS operator
RUN python3 -c "import sys; assert sys.version_info[:2] == (3, 11)"
FROM ${TRAINER_BASE_IMAGE} AS trainer
""")
    script = [sys.executable, str(ctx / "scripts" / "pin_base_images.py"), "--dockerfile", str(ctx / "Dockerfile")]
    built = f"{local_registry}/rosetta-pin-operator:test"
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "BUILD_ARGS", "PLATFORM")}
    env.update(REGISTRY=local_registry, TAG="test", IMAGE_NAME="rosetta-pin", TARGETS="operator",
               PIN_BASES="require", PYTHON=sys.executable)

    def build_and_push() -> str:
        proc = subprocess.run(["bash", str(ctx / "build_and_push.sh")], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    first = refreshed = ""
    try:
        docker("tag", test_base, ref)
        docker("push", ref, timeout=600)
        first = _tag_digest(local_registry, repository, "pin")
        assert f"{local_registry}/{repository}@{first}" in json.loads(
            docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout)

        check = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=60)
        assert check.returncode == 1
        assert check.stdout.splitlines() == [f"Dockerfile: {name}={ref}: not pinned by digest"
                                             for name in ("PYTHON_IMAGE", "TRAINER_BASE_IMAGE")]

        # Given by tag: built from the digest the tag names, and labelled with it.
        log = build_and_push()
        assert f"PYTHON_IMAGE={ref} is {first} today: built from {ref}@{first}" in log
        assert [_labels(built).get(k) for k in BASE_LABELS] == [ref, first]
        docker("rmi", built)

        write = subprocess.run([*script, "--write"], capture_output=True, text=True, timeout=60)
        assert write.returncode == 0, write.stderr
        assert f"ARG PYTHON_IMAGE={ref}@{first}\n" in (ctx / "Dockerfile").read_text()
        assert subprocess.run([*script, "--check"], capture_output=True, timeout=60).returncode == 0

        # The base's tag is rebuilt: --write refreshes the pin.
        proc = subprocess.run([DOCKER, "build", "--tag", ref, "-"], input=f"FROM {test_base}\nLABEL org.rosetta.pin-test=2\n",
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        refreshed = docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        docker("push", ref, timeout=600)
        second = _tag_digest(local_registry, repository, "pin")
        assert second != first
        assert subprocess.run([*script, "--write"], capture_output=True, timeout=60).returncode == 0
        text = (ctx / "Dockerfile").read_text()
        assert f"ARG PYTHON_IMAGE={ref}@{second}\n" in text and f"ARG TRAINER_BASE_IMAGE={ref}@{second}\n" in text
        assert first not in text

        # Pinned in the Dockerfile: built as it is, the base pulled by digest (nothing of it is left here).
        docker("rmi", ref)
        docker("rmi", f"{local_registry}/{repository}@{second}", check=False)
        docker("image", "inspect", refreshed, check=False).returncode != 0 or pytest.fail("the new base is still here")
        log = build_and_push()
        assert "today: built from" not in log  # nothing resolved: the pin is used as it is
        labels = _labels(built)
        assert [labels.get(k) for k in BASE_LABELS] == [ref, second] and labels.get("org.rosetta.pin-test") == "2"
    finally:
        # The test base itself stays: only this test's names (and its digest in this registry) go.
        for leftover in (built, ref, refreshed, first and f"{local_registry}/{repository}@{first}"):
            if leftover:
                docker("rmi", leftover, check=False)
