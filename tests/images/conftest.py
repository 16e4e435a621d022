"""Fixtures of the image tests besides the shared ones (support/images.py, via tests/conftest.py):
`local_registry` serves Debian's docker-registry on 127.0.0.1 for build_and_push.sh.
"""

from __future__ import annotations

import socket
from typing import Iterator

import pytest

from support.images import HERE
from support.servers import server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def local_registry(docker_engine, tmp_path_factory) -> Iterator[str]:
    """127.0.0.1:PORT, a docker-registry (Debian's package) with its blobs in a temp dir."""
    storage = tmp_path_factory.mktemp("registry")
    port = _free_port()
    argv = ["bash", str(HERE / "local-registry.sh"), str(port), str(storage)]
    # The first call may install the package.
    with server(argv, storage / "registry.log", f"http://127.0.0.1:{port}/v2/", "registry", timeout=300):
        yield f"127.0.0.1:{port}"
