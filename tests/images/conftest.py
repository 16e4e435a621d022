"""Fixtures of the image tests besides the shared ones (support/images.py, via tests/conftest.py):
`local_registry` serves Debian's docker-registry on 127.0.0.1 for build_and_push.sh.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from typing import Iterator

import pytest

from support.images import HERE


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
