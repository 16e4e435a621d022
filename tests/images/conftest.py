"""Fixtures for the image tests: everything from scratch on a fresh machine, cached after.

`docker_engine` runs docker-engine.sh (docker.io from Debian, dockerd started if not answering);
`test_base` runs debian-base.sh (a Python 3.11 image from debootstrap, reused while current);
`images` builds the Dockerfile's trainer and operator targets on that base (Docker's layer cache in
/var/lib/docker makes a rebuild after a source change take about half a minute, not the cold
minutes; superseded builds on the test base are pruned);
`local_registry` serves Debian's docker-registry on 127.0.0.1 for build_and_push.sh.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from images_support import (BASE_IMAGE, BUILD_ARGS, DOCKER, HERE, OPERATOR, REPO, TRAINER, WHEEL, Images, docker,
                            run_logged)


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("image-logs")


@pytest.fixture(scope="session")
def docker_engine(logs) -> str:
    run_logged(["bash", str(HERE / "docker-engine.sh")], logs / "docker-engine.log", timeout=600)
    return DOCKER


@pytest.fixture(scope="session")
def test_base(docker_engine, logs) -> str:
    run_logged(["bash", str(HERE / "debian-base.sh")], logs / "debian-base.log",
               env={**os.environ, "IMAGE": BASE_IMAGE}, timeout=1200)
    return BASE_IMAGE


def build(target: str, tag: str, logs: Path) -> None:
    args = [f"--build-arg={k}={v}" for k, v in BUILD_ARGS.items()]
    run_logged([DOCKER, "build", *args, "--target", target, "--tag", tag, str(REPO)],
               logs / f"build-{target}.log", timeout=3000)


@pytest.fixture(scope="session")
def images(test_base, logs) -> Images:
    # Every stage tagged (the classic builder builds the stages before the target anyway), so that
    # what an earlier source tree built is left dangling and pruned, and the current cache is kept.
    build("wheel", WHEEL, logs)
    build("operator", OPERATOR, logs)
    build("trainer", TRAINER, logs)
    # Only images built on the test base (they inherit its label), never anyone else's.
    docker("image", "prune", "--force", "--filter", "label=org.rosetta.recipe")
    return Images(TRAINER, OPERATOR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def local_registry(docker_engine, tmp_path_factory) -> Iterator[str]:
    """127.0.0.1:PORT, a docker-registry (Debian's package) with its blobs in a temp dir."""
    storage = tmp_path_factory.mktemp("registry")
    port = _free_port()
    log = (storage / "registry.log").open("w")
    proc = subprocess.Popen(["bash", str(HERE / "local-registry.sh"), str(port), str(storage)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # the first call may install the package
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"registry did not answer: {(storage / 'registry.log').read_text()[-2000:]}",
                            pytrace=False)
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
