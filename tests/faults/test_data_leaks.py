"""Data errors say where and what, never the data: a spec may point a data path at any file.

The trainer runs with the pod's environment and files; a data path at /proc/self/environ or at a
credentials file must not turn an error message into a way to read them. The message goes to
stderr, the termination message (/dev/termination-log), and from there into the training's status
and a Warning event. Each test plants a secret (in the environment, or in a file the spec names),
triggers one kind of data error through the real command, and looks for the secret in everything
that comes out. Files that are not regular (a FIFO, /dev/zero) are refused before a byte is read.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rosetta_contract.exits import DATA_INVALID_EXIT, TERMINATION_LOG_ENV, TERMINATION_PREFIX
from rosetta_operator.status import data_invalid_message
from rosetta_trainer.data.reader import MAX_LINE_BYTES
from support.training import TINY, deep_update

SECRET = "hunter2-4f1c9e7a-SECRET-VALUE"
ROSETTA = Path(sys.executable).with_name("rosetta")


def spec_file(tmp_path: Path, source: dict) -> Path:
    doc = deep_update(TINY, {"spec": {"data": {"train": [source], "validation": []}}})
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _limits() -> None:
    # If reading is ever unbounded again (/dev/zero has no newline), fail with MemoryError, not the machine.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run(args: list[str], tmp_path: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess, str]:
    """`rosetta ARGS` with the secret in its environment; (result, termination message)."""
    log = tmp_path / "termination-log"
    env = {**os.environ, "ROSETTA_TEST_SECRET": SECRET, TERMINATION_LOG_ENV: str(log), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([str(ROSETTA), *args], capture_output=True, text=True, env=env, timeout=timeout,
                            preexec_fn=_limits, cwd=tmp_path)
    return result, log.read_text() if log.exists() else ""


def assert_no_secret(*outputs: str) -> None:
    for text in outputs:
        assert SECRET not in text
        assert "hunter2" not in text and "SECRET-VALUE" not in text  # nor a piece of it


@pytest.fixture(autouse=True)
def _installed():
    if not ROSETTA.exists():
        pytest.skip("the rosetta console script is not installed")


def file_with_secret(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


# (name, data source builder, expected error with {path} for the file the spec names)
CASES = {
    "environ as pairs": (
        lambda tmp: {"format": "pairs", "source": "/proc/self/environ", "target": "/proc/self/environ"},
        "/proc/self/environ:1: a NUL byte at byte {nul}: binary data, not text"),
    "environ as tsv": (
        lambda tmp: {"format": "tsv", "path": "/proc/self/environ"},
        "/proc/self/environ:1: a NUL byte at byte {nul}: binary data, not text"),
    "environ as jsonl": (
        lambda tmp: {"format": "jsonl", "path": "/proc/self/environ"},
        "/proc/self/environ:1: a NUL byte at byte {nul}: binary data, not text"),
    "secret as a tsv header": (
        lambda tmp: {"format": "tsv", "path": file_with_secret(tmp, "t.tsv", f"{SECRET}\tother\na\tb\n".encode())},
        "{path}:1: no column 'source', 'target' in the header row (2 columns)"),
    "secret as a csv header": (
        lambda tmp: {"format": "csv", "path": file_with_secret(tmp, "t.csv", f"{SECRET},x\n".encode())},
        "{path}:1: no column 'source', 'target' in the header row (2 columns)"),
    "secret as a jsonl key": (
        lambda tmp: {"format": "jsonl", "path": file_with_secret(
            tmp, "t.jsonl", (json.dumps({SECRET: 1, "target": "x"}) + "\n").encode())},
        "{path}:1: no field 'source' in the object (2 fields)"),
    "secret in a line that is not JSON": (
        lambda tmp: {"format": "jsonl", "path": file_with_secret(tmp, "t.jsonl", f"{SECRET}\n".encode())},
        "{path}:1: invalid JSON: Expecting value (column 1)"),
    "secret before a byte that is not UTF-8": (
        lambda tmp: {"format": "tsv", "path": file_with_secret(tmp, "t.tsv", f"source\ttarget\n{SECRET}\t\xff\n"
                                                                .encode("latin-1"))},
        "{path}:2: not UTF-8 text (invalid start byte at byte 30)"),
    "secret in a .gz that is not gzip": (
        lambda tmp: {"format": "tsv", "path": file_with_secret(tmp, "t.tsv.gz", f"{SECRET}\n".encode())},
        "{path}: not a gzip file (the name ends in .gz)"),
    "secret in a line over 1 MiB": (
        lambda tmp: {"format": "pairs", "source": file_with_secret(tmp, "a.en", (SECRET * 40000).encode()),
                     "target": file_with_secret(tmp, "a.de", b"x\n")},
        f"{{path}}:1: line longer than {MAX_LINE_BYTES} bytes (1 MiB); is this a text corpus?"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_data_error_names_where_and_what_and_never_the_data(case, tmp_path):
    build, expected = case
    source = build(tmp_path)
    named = source.get("path") or source["source"]
    if "{nul}" in expected:  # where the first NUL is: after the first variable of the child's environment
        expected = expected.replace("{nul}", r"\d+")
    result, termination = run(["validate", "-f", str(spec_file(tmp_path, source))], tmp_path)
    assert result.returncode == DATA_INVALID_EXIT, result.stderr[-2000:]
    assert_no_secret(result.stdout, result.stderr, termination)
    assert "Traceback" not in result.stderr
    message = expected.format(path=named) if "{path}" in expected else expected
    if r"\d+" in message:
        assert re.fullmatch(f"error: {message}\n", result.stderr), result.stderr
        assert re.fullmatch(TERMINATION_PREFIX + message, termination), termination
    else:
        assert result.stderr == f"error: {message}\n"
        assert termination == TERMINATION_PREFIX + message


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_only_regular_files_are_read(kind, tmp_path):
    if kind == "fifo":
        path = tmp_path / "train.tsv"
        os.mkfifo(path)  # nobody ever writes: an open for reading without O_NONBLOCK would wait forever
        what = "a FIFO"
    elif kind == "directory":
        path = tmp_path / "train.tsv"
        path.mkdir()
        what = "a directory"
    else:
        path = Path(kind)
        what = "a character device"
    result, termination = run(["validate", "-f", str(spec_file(tmp_path, {"format": "tsv", "path": str(path)}))],
                              tmp_path, timeout=60)
    message = f"{path}: {what}, not a regular file; data must be files"
    assert (result.returncode, result.stderr) == (DATA_INVALID_EXIT, f"error: {message}\n")
    assert termination == TERMINATION_PREFIX + message


def test_the_operator_passes_on_one_line_of_the_message_only():
    pod = {"metadata": {"name": "mt-node-0-0-abcde"}, "status": {"containerStatuses": [{"state": {"terminated": {
        "message": TERMINATION_PREFIX + "train.tsv:3: not UTF-8 text\n\x1b[31mextra\tlines\x00"}}}]}}
    assert data_invalid_message([pod]) == "pod mt-node-0-0-abcde: train.tsv:3: not UTF-8 text [31mextra lines"


@pytest.mark.slow  # ~20 s: torch and transformers load before the data is read
def test_train_leaves_no_secret_in_its_output_termination_message_or_run_directory(tmp_path):
    """What a pod leaves: stdout/stderr (its log), the termination message, the run directory."""
    source = {"format": "tsv", "path": file_with_secret(tmp_path, "t.tsv", f"{SECRET}\tx\na\tb\n".encode())}
    out = tmp_path / "run"
    result, termination = run(["train", "--no-progress", "-f", str(spec_file(tmp_path, source)), "-o", str(out)],
                              tmp_path, timeout=300)
    message = f"{source['path']}:1: no column 'source', 'target' in the header row (2 columns)"
    assert result.returncode == DATA_INVALID_EXIT, result.stderr[-3000:]
    assert f"error: {message}\n" in result.stderr and "Traceback" not in result.stderr
    assert termination == TERMINATION_PREFIX + message
    written = [p.read_bytes().decode("utf-8", "replace") for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert_no_secret(result.stdout, result.stderr, termination, *written)
    # The environment of the process is no data source either.
    env_source = {"format": "pairs", "source": "/proc/self/environ", "target": "/proc/self/environ"}
    result, termination = run(["train", "--no-progress", "-f", str(spec_file(tmp_path, env_source)),
                               "-o", str(out)], tmp_path, timeout=300)
    assert result.returncode == DATA_INVALID_EXIT, result.stderr[-3000:]
    written = [p.read_bytes().decode("utf-8", "replace") for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert_no_secret(result.stdout, result.stderr, termination, *written)
    assert not (out / "summary.json").exists() or SECRET not in (out / "summary.json").read_text()


def test_a_gzip_corpus_still_reads(tmp_path):
    # The regular-file check opens the descriptor itself: .gz corpora go through the same path.
    path = tmp_path / "t.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("source\ttarget\nHello.\tHallo.\nBye.\tTschüss.\n")
    result, termination = run(["validate", "-f", str(spec_file(tmp_path, {"format": "tsv", "path": str(path)}))],
                              tmp_path)
    assert result.returncode == 0, result.stderr
    assert "data: train: 2 read, 2 kept" in result.stdout and termination == ""
