"""The Dockerfile's images for tests: names, helpers and session fixtures, built from scratch on a
fresh machine and cached after. tests/conftest.py exposes the fixtures to every folder (the image
tests in tests/images and the real-node tests in tests/cluster share one build per session).

`docker_engine` runs docker-engine.sh (docker.io from Debian, dockerd started if not answering);
`test_base` runs debian-base.sh (a Python 3.11 image from debootstrap, reused while current);
`images` builds the Dockerfile's trainer and operator targets on that base (Docker's layer cache in
/var/lib/docker makes a rebuild after a source change take about half a minute, not the cold
minutes; superseded builds on the test base are pruned).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "images"  # the image scripts
DOCKER = os.environ.get("DOCKER", "docker")
BASE_IMAGE = "rosetta-test/python:3.11-bookworm"
TRAINER = "rosetta-trainer:test"
OPERATOR = "rosetta-operator:test"
WHEEL = "rosetta-wheel:test"
BUILD_ARGS = {"PYTHON_IMAGE": BASE_IMAGE, "TRAINER_BASE_IMAGE": BASE_IMAGE}


class Images(NamedTuple):
    trainer: str
    operator: str


def run_logged(cmd: list[str], log: Path, *, env: dict | None = None, timeout: float) -> None:
    """Runs cmd with its output in log; on failure, fails the test with the log's tail."""
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=REPO)
    if proc.returncode:
        tail = log.read_text()[-4000:]
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode} (log {log}):\n{tail}", pytrace=False)


def docker(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        pytest.fail(f"docker {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}", pytrace=False)
    return proc


@pytest.fixture(scope="session")
def image_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("image-logs")


@pytest.fixture(scope="session")
def docker_engine(image_logs) -> str:
    run_logged(["bash", str(HERE / "docker-engine.sh")], image_logs / "docker-engine.log", timeout=600)
    return DOCKER


@pytest.fixture(scope="session")
def test_base(docker_engine, image_logs) -> str:
    run_logged(["bash", str(HERE / "debian-base.sh")], image_logs / "debian-base.log",
               env={**os.environ, "IMAGE": BASE_IMAGE}, timeout=1200)
    return BASE_IMAGE


def build(target: str, tag: str, logs: Path) -> None:
    args = [f"--build-arg={k}={v}" for k, v in BUILD_ARGS.items()]
    run_logged([DOCKER, "build", *args, "--target", target, "--tag", tag, str(REPO)],
               logs / f"build-{target}.log", timeout=3000)


@pytest.fixture(scope="session")
def images(test_base, image_logs) -> Images:
    # Every stage tagged (the classic builder builds the stages before the target anyway), so that
    # what an earlier source tree built is left dangling and pruned, and the current cache is kept.
    build("wheel", WHEEL, image_logs)
    build("operator", OPERATOR, image_logs)
    build("trainer", TRAINER, image_logs)
    # Only images built on the test base (they inherit its label), never anyone else's.
    docker("image", "prune", "--force", "--filter", "label=org.rosetta.recipe")
    return Images(TRAINER, OPERATOR)
