"""Names and helpers shared by tests/images' conftest.py and tests (a module name of its own:
pytest's `conftest` modules cannot be imported by name)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
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
