"""scripts/pin_base_images.py: the Dockerfile's base ARGs found, checked and rewritten as text, tags
resolved against a registry on 127.0.0.1 (Bearer token flow included), and what build_and_push.sh
builds from and labels. tests/images/test_images.py resolves against a real registry and builds."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "pin_base_images.py"
_spec = importlib.util.spec_from_file_location("pin_base_images", SCRIPT)
pin = importlib.util.module_from_spec(_spec)
sys.modules["pin_base_images"] = pin  # dataclasses look their module up while the class is made
_spec.loader.exec_module(pin)

DOCKERFILE = (REPO / "Dockerfile").read_text()
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64

SMALL = """\
# a comment that says ARG X=1 is not an ARG
ARG BASE="python:3.11-slim"   # the build stage
ARG RUNTIME=debian:bookworm-slim@{d1}
ARG UNUSED=busybox:1
ARG NODEFAULT
FROM ${{BASE}} AS build
ARG BASE=inside-a-stage
FROM $RUNTIME AS runtime
FROM build AS test
FROM ${{NODEFAULT}} AS other
""".format(d1=D1)


def test_the_base_args_are_the_ones_from_lines_name():
    assert pin.base_args(DOCKERFILE) == {"PYTHON_IMAGE": "python:3.11-slim-bookworm",
                                         "TRAINER_BASE_IMAGE": "python:3.11-slim-bookworm"}
    assert "TORCH" in pin.global_args(DOCKERFILE)  # an ARG, but no base
    assert pin.base_args(SMALL) == {"BASE": "python:3.11-slim", "RUNTIME": f"debian:bookworm-slim@sha256:{'1' * 64}",
                                    "NODEFAULT": None}


@pytest.mark.parametrize("target, arg", [("operator", "PYTHON_IMAGE"), ("wheel", "PYTHON_IMAGE"),
                                         ("trainer", "TRAINER_BASE_IMAGE")])
def test_each_image_target_has_its_base_arg(target, arg):
    assert pin.stage_base_arg(DOCKERFILE, target) == arg


def test_a_stage_on_a_stage_has_the_first_ones_base():
    assert pin.stage_base_arg(SMALL, "test") == "BASE"
    assert pin.stage_base_arg(SMALL, "nowhere") is None


def test_check_names_every_base_without_a_digest():
    assert pin.check(SMALL) == ["BASE=python:3.11-slim: not pinned by digest", "NODEFAULT: no default"]


def test_pinning_the_real_dockerfile_changes_only_its_base_arg_lines():
    pinned = DOCKERFILE
    for name in pin.base_args(DOCKERFILE):
        pinned = pin.set_default(pinned, name, f"python:3.11-slim-bookworm@{D1}")
    assert pin.check(pinned) == []
    changed = [(a, b) for a, b in zip(DOCKERFILE.splitlines(), pinned.splitlines()) if a != b]
    assert changed == [(f"ARG {name}=python:3.11-slim-bookworm", f"ARG {name}=python:3.11-slim-bookworm@{D1}")
                       for name in ("PYTHON_IMAGE", "TRAINER_BASE_IMAGE")]
    assert len(pinned.splitlines()) == len(DOCKERFILE.splitlines())


def test_set_default_keeps_quotes_and_comments_and_leaves_stage_args_alone():
    out = pin.set_default(SMALL, "BASE", f"python:3.11-slim@{D2}")
    assert f'ARG BASE="python:3.11-slim@{D2}"   # the build stage\n' in out
    assert "ARG BASE=inside-a-stage\n" in out
    assert pin.set_default("ARG B=x\r\nFROM $B\r\n", "B", "y") == "ARG B=y\r\nFROM $B\r\n"
    assert pin.set_default("ARG B\nFROM $B\n", "B", "y") == "ARG B=y\nFROM $B\n"
    with pytest.raises(pin.PinError, match="no ARG MISSING"):
        pin.set_default(SMALL, "MISSING", "x")


def test_a_new_digest_replaces_the_old_one():
    assert pin.with_digest("python:3.11", D1) == f"python:3.11@{D1}"
    assert pin.with_digest(f"python:3.11@{D1}", D2) == f"python:3.11@{D2}"
    with pytest.raises(pin.PinError):
        pin.with_digest("python:3.11", "sha256:short")


def test_write_resolves_each_tag_once_and_refreshes_pins(monkeypatch):
    asked = []
    digests = {"python:3.11-slim": D2, "debian:bookworm-slim": D2}
    monkeypatch.setattr(pin, "resolve", lambda ref, timeout=20: asked.append(ref) or digests[ref])
    text = SMALL.replace("ARG NODEFAULT\n", "").replace("FROM ${NODEFAULT} AS other\n", "")
    out, changes = pin.write(text, 5)
    assert f'ARG BASE="python:3.11-slim@{D2}"' in out
    assert f"ARG RUNTIME=debian:bookworm-slim@{D2}\n" in out  # refreshed: the tag was resolved again
    assert "ARG UNUSED=busybox:1\n" in out  # no FROM names it
    assert asked == ["python:3.11-slim", "debian:bookworm-slim"]
    assert changes == [f"BASE=python:3.11-slim@{D2} (was python:3.11-slim)",
                       f"RUNTIME=debian:bookworm-slim@{D2} (was debian:bookworm-slim@{D1})"]
    again, changes = pin.write(out, 5)
    assert again == out and all(c.endswith("(unchanged)") for c in changes)


def test_write_changes_nothing_unless_every_base_resolves(monkeypatch, tmp_path, capsys):
    def resolve(ref, timeout=20):
        if ref.startswith("debian"):
            raise pin.PinError("debian: not reachable")
        return D2

    monkeypatch.setattr(pin, "resolve", resolve)
    dockerfile = tmp_path / "Dockerfile"
    text = "ARG A=python:3.11\nARG B=debian:bookworm\nFROM $A AS a\nFROM $B AS b\n"
    dockerfile.write_text(text)
    assert pin.main(["--write", "--dockerfile", str(dockerfile)]) == 1
    assert dockerfile.read_text() == text
    assert "debian: not reachable" in capsys.readouterr().err


def test_a_digest_without_a_tag_is_kept(monkeypatch):
    monkeypatch.setattr(pin, "resolve", lambda ref, timeout=20: pytest.fail("nothing to resolve"))
    text = f"ARG A=python@{D1}\nFROM $A\n"
    out, changes = pin.write(text, 5)
    assert out == text and "kept" in changes[0]


def test_check_mode_exits_non_zero_naming_the_args(tmp_path, capsys):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(SMALL)
    assert pin.main(["--check", "--dockerfile", str(dockerfile)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == ["Dockerfile: BASE=python:3.11-slim: not pinned by digest",
                                    "Dockerfile: NODEFAULT: no default"]
    assert "--write" in out.err
    dockerfile.write_text(f"ARG A=python:3.11@{D1}\nFROM ${{A}} AS a\n")
    assert pin.main(["--check", "--dockerfile", str(dockerfile)]) == 0


@pytest.mark.parametrize("reference, name, api", [
    ("python:3.11-slim-bookworm", "docker.io/library/python:3.11-slim-bookworm",
     "https://registry-1.docker.io/v2/library/python"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "docker.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
     "https://registry-1.docker.io/v2/nvidia/cuda"),
    ("docker.io/library/python", "docker.io/library/python:latest", "https://registry-1.docker.io/v2/library/python"),
    (f"ghcr.io/org/img:1.0@{D1}", "ghcr.io/org/img:1.0", "https://ghcr.io/v2/org/img"),
    ("127.0.0.1:5000/rosetta-test/python:pin", "127.0.0.1:5000/rosetta-test/python:pin",
     "http://127.0.0.1:5000/v2/rosetta-test/python"),
    ("localhost:5000/base", "localhost:5000/base:latest", "http://localhost:5000/v2/base"),
    ("[::1]:5000/base:t", "[::1]:5000/base:t", "http://[::1]:5000/v2/base"),
    ("registry.internal:5000/ml/base:t", "registry.internal:5000/ml/base:t", "https://registry.internal:5000/v2/ml/base"),
])
def test_references_read_as_docker_reads_them(reference, name, api):
    ref = pin.parse(reference)
    assert (ref.name, ref.api) == (name, api)


@pytest.mark.parametrize("reference", ["${PYTHON_IMAGE}", "Python:3.11", "python:3.11@sha256:xyz", "python: 3", ""])
def test_what_is_no_reference_is_refused(reference):
    with pytest.raises(pin.PinError):
        pin.parse(reference)


# ------------------------------------------------------------------------------ a registry on 127.0.0.1

MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}'
MANIFEST_DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


class FakeRegistry(BaseHTTPRequestHandler):
    """Docker Hub's manners: 401 with a Bearer challenge, an anonymous token from the realm, then the
    manifest; `nodigest` leaves the optional Docker-Content-Digest header out."""

    seen: list[tuple[str, str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: bool) -> None:
        port = self.server.server_address[1]
        self.seen.append((self.command, self.path, self.headers.get("Accept", "")))
        if self.path.startswith("/token?"):
            payload = b'{"token": "anonymous"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if self.headers.get("Authorization") != "Bearer anonymous":
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                                                 f'service="fake",scope="repository:base:pull"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path not in ("/v2/base/manifests/tag", "/v2/base/manifests/nodigest"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        self.send_header("Content-Length", str(len(MANIFEST)))
        if not self.path.endswith("nodigest"):
            self.send_header("Docker-Content-Digest", MANIFEST_DIGEST)
        self.end_headers()
        if body:
            self.wfile.write(MANIFEST)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)


@pytest.fixture
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeRegistry.seen = []
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_resolve_takes_an_anonymous_token_and_asks_for_the_index_first(registry):
    assert pin.resolve(f"{registry}/base:tag@{D1}", timeout=5) == MANIFEST_DIGEST
    assert [(m, p.split("?")[0]) for m, p, _ in FakeRegistry.seen] == [
        ("HEAD", "/v2/base/manifests/tag"), ("GET", "/token"), ("HEAD", "/v2/base/manifests/tag")]
    accept = FakeRegistry.seen[-1][2].split(", ")
    assert accept[:2] == ["application/vnd.oci.image.index.v1+json",
                          "application/vnd.docker.distribution.manifest.list.v2+json"]


def test_without_the_digest_header_the_manifest_is_hashed(registry):
    assert pin.resolve(f"{registry}/base:nodigest", timeout=5) == MANIFEST_DIGEST
    assert [m for m, _, _ in FakeRegistry.seen][-1] == "GET"


def test_an_unknown_tag_and_an_unreachable_registry_say_so(registry):
    with pytest.raises(pin.PinError, match="no such tag"):
        pin.resolve(f"{registry}/base:gone", timeout=5)
    with pytest.raises(pin.PinError, match="not reachable"):
        pin.resolve(f"127.0.0.1:{closed_port()}/base:tag", timeout=5)


def closed_port() -> int:
    """A port nothing listens on (bound once and let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ build_and_push.sh

PINNED = f"python:3.11-slim-bookworm@{D1}"


def copy_of_the_repository(tmp_path: Path, dockerfile: str) -> Path:
    """build_and_push.sh, the script and a Dockerfile in a folder of their own (the script's folder is
    the build context), with a `docker` that only writes down what it was asked."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "build_and_push.sh", root)
    shutil.copy(SCRIPT, root / "scripts")
    (root / "Dockerfile").write_text(dockerfile)
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "docker.log"}\n')
    fake.chmod(0o755)
    return root


def build_and_push(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PROJECT_ID", "AWS_ACCOUNT_ID", "REGISTRY", "TAG", "IMAGE_NAME", "TARGETS", "PLATFORM",
                          "DOCKER", "BUILD_ARGS", "PIN_BASES", "PYTHON")}
    return subprocess.run(["bash", str(root / "build_and_push.sh"), *args], capture_output=True, text=True, timeout=60,
                          env={**clean, "REGISTRY": "127.0.0.1:5000", "TAG": "t", "TARGETS": "operator",
                               "DOCKER": str(root.parent / "docker"), "PYTHON": sys.executable, **env})


def labels(base: str, digest: str) -> str:
    return (f"--label org.opencontainers.image.base.name={base} "
            f"--label org.opencontainers.image.base.digest={digest}")


def test_a_pinned_dockerfile_is_built_as_it_is_and_labelled(tmp_path):
    dockerfile = pin.set_default(pin.set_default(DOCKERFILE, "PYTHON_IMAGE", PINNED), "TRAINER_BASE_IMAGE", PINNED)
    root = copy_of_the_repository(tmp_path, dockerfile)
    out = build_and_push(root, {"TARGETS": "trainer operator"}, "--dry-run")
    assert out.returncode == 0, out.stderr
    base = labels("docker.io/library/python:3.11-slim-bookworm", D1)
    docker = tmp_path / "docker"
    assert out.stdout.splitlines() == [
        f"{docker} build --platform linux/amd64 {base} --target trainer --tag 127.0.0.1:5000/rosetta-trainer:t {root}",
        f"{docker} push 127.0.0.1:5000/rosetta-trainer:t",
        f"{docker} build --platform linux/amd64 {base} --target operator --tag 127.0.0.1:5000/rosetta-operator:t {root}",
        f"{docker} push 127.0.0.1:5000/rosetta-operator:t",
    ]
    # Given by tag over the pin: said, never silent, and refused where pins are required.
    out = build_and_push(root, {"BUILD_ARGS": "PYTHON_IMAGE=python:3.11-slim-bookworm"}, "--dry-run")
    assert out.returncode == 0 and "replaces the Dockerfile's pinned" in out.stderr
    assert "--label" not in out.stdout
    out = build_and_push(root, {"BUILD_ARGS": "PYTHON_IMAGE=127.0.0.1:1/base:t", "PIN_BASES": "require"})
    assert out.returncode != 0 and "replaces the Dockerfile's pinned" in out.stderr
    assert not (tmp_path / "docker.log").exists()


def test_a_base_given_by_tag_is_resolved_built_by_digest_and_labelled(tmp_path, registry):
    root = copy_of_the_repository(tmp_path, DOCKERFILE)
    out = build_and_push(root, {"BUILD_ARGS": f"TORCH=torch==2.13.0 PYTHON_IMAGE={registry}/base:tag"})
    assert out.returncode == 0, out.stderr
    # TRAINER_BASE_IMAGE (Docker Hub here) is no base of the operator image, but it is settled too.
    assert "TRAINER_BASE_IMAGE=python:3.11-slim-bookworm cannot be pinned" in out.stderr
    (build, push) = (tmp_path / "docker.log").read_text().splitlines()
    assert build == (f"build --platform linux/amd64 --build-arg TORCH=torch==2.13.0 "
                     f"--build-arg PYTHON_IMAGE={registry}/base:tag@{MANIFEST_DIGEST} "
                     f"{labels(f'{registry}/base:tag', MANIFEST_DIGEST)} "
                     f"--target operator --tag 127.0.0.1:5000/rosetta-operator:t {root}")
    assert push == "push 127.0.0.1:5000/rosetta-operator:t"


def test_an_unreachable_base_builds_from_its_tag_with_a_warning_or_stops(tmp_path):
    root = copy_of_the_repository(tmp_path, DOCKERFILE)
    args = f"PYTHON_IMAGE=127.0.0.1:{closed_port()}/base:tag"
    out = build_and_push(root, {"BUILD_ARGS": args})
    assert out.returncode == 0 and "WARNING: PYTHON_IMAGE" in out.stderr and "not reachable" in out.stderr
    (build, _) = (tmp_path / "docker.log").read_text().splitlines()
    assert f"--build-arg {args} --target operator" in build and "--label" not in build
    (tmp_path / "docker.log").unlink()
    out = build_and_push(root, {"BUILD_ARGS": args, "PIN_BASES": "require"})
    assert out.returncode != 0 and "cannot be pinned" in out.stderr
    assert not (tmp_path / "docker.log").exists()
    out = build_and_push(root, {"PIN_BASES": "sometimes"})
    assert out.returncode != 0 and "PIN_BASES" in out.stderr
