"""Fixtures of the image tests besides the shared ones (support/images.py, via tests/conftest.py):
`local_registry` serves Debian's docker-registry on 127.0.0.1 for build_and_push.sh.

The registry's storage is kept between sessions in ${ROSETTA_REGISTRY_CACHE:-~/.cache/rosetta/registry}
and served on a port derived from that path, because pushing the multi-GB trainer image into an
empty registry (docker push gzips and uploads every layer) took about four minutes a run. Docker
records which compressed blob it pushed for each layer and to which registry (host:port) and
repository, and skips the layer when the registry answers a HEAD for that blob with 200: with the
same storage on the same port, a push after a source change uploads only the layers that changed.

So that a push is still proven, the tags of earlier sessions are taken away before the registry
starts: a tag the tests read must have been pushed by this session. They are renamed (`test` to
`before-test`) rather than deleted, so that the garbage collection at the end of the session
(`docker-registry garbage-collect --delete-untagged`, with the registry stopped) keeps the layers
of a tag that this session did not push again; a renamed tag that was pushed again is deleted
first, so the storage holds about one image per repository and tag, not one per source change.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from node_registry import port_free, stable_port
from support.images import HERE
from support.servers import server

PREVIOUS = "before-"  # prefix of an earlier session's tag while this session runs


def registry_cache() -> Path:
    return Path(os.environ.get("ROSETTA_REGISTRY_CACHE") or "~/.cache/rosetta/registry").expanduser()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tag_dirs(storage: Path) -> list[Path]:
    """Every tag's folder in Distribution 2.8's filesystem layout (the repository names may nest)."""
    repositories = storage / "data" / "docker" / "registry" / "v2" / "repositories"
    return sorted(p for tags in repositories.glob("**/_manifests/tags") for p in tags.iterdir() if p.is_dir())


def set_aside_tags(storage: Path) -> None:
    """Before serving: every tag of an earlier session renamed to PREVIOUS + tag (one already there
    is replaced). The manifests, blobs and the repositories' layer links stay."""
    for tag in _tag_dirs(storage):
        if tag.name.startswith(PREVIOUS):
            continue
        previous = tag.with_name(PREVIOUS + tag.name)
        shutil.rmtree(previous, ignore_errors=True)
        tag.rename(previous)


def drop_superseded_tags(storage: Path) -> None:
    """After serving: the set-aside tags that this session pushed again are deleted."""
    for tag in _tag_dirs(storage):
        if tag.name.startswith(PREVIOUS) and tag.with_name(tag.name[len(PREVIOUS):]).is_dir():
            shutil.rmtree(tag)


@pytest.fixture(scope="session")
def local_registry(docker_engine, tmp_path_factory) -> Iterator[str]:
    """127.0.0.1:PORT, a docker-registry (Debian's package) with its blobs in registry_cache().

    Falls back to storage in a temp dir and a random port while another session holds the cache
    (an empty registry: a full push, minutes), and to the cache on a random port when the stable
    port is taken: Docker has then pushed nothing to that host:port, and the push may upload every
    layer again (Docker 20.10 still asks the new port for the blob it last pushed anywhere, and
    finds it; other versions need not)."""
    logs = tmp_path_factory.mktemp("registry-logs")
    storage = registry_cache()
    storage.mkdir(parents=True, exist_ok=True)
    lock = (storage / "lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        lock, storage = None, tmp_path_factory.mktemp("registry")
    try:
        port = stable_port(storage, 40000) if lock else _free_port()
        if not port_free(port):
            port = _free_port()  # the cache on a port Docker has not pushed to: maybe a full push
        set_aside_tags(storage)
        script = str(HERE / "local-registry.sh")
        # The first call may install the package.
        with server(["bash", script, str(port), str(storage)], logs / "registry.log",
                    f"http://127.0.0.1:{port}/v2/", "registry", timeout=300):
            yield f"127.0.0.1:{port}"
        drop_superseded_tags(storage)
        with (logs / "garbage-collect.log").open("wb") as out:
            # Only a smaller cache is at stake: a failed collection is left for the next session's.
            subprocess.run(["bash", script, "--garbage-collect", str(storage)], stdout=out,
                           stderr=subprocess.STDOUT, timeout=600, check=False)
    finally:
        if lock:
            lock.close()
