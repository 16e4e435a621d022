"""Every trainer a test starts is forked from a warm process (a plugin that tests/conftest.py names).

A trainer's start is mostly imports: torch, transformers and the trainer's modules take 6-9
CPU-seconds of a tiny training's 8-12, and the suite starts over a hundred trainer ranks. Each pytest
worker starts a trainer server (tests/support/trainer_server.py) while it collects, and puts the
client (tests/support/trainer_client/sitecustomize.py) on PYTHONPATH of every process the tests
start: a process started as `python -m rosetta_trainer ...` (by a test, torchrun, `rosetta run` or
the launcher) then asks the server to fork the trainer, and stands in for it (signals passed on, the
same exit). The trainer runs the same code from its main module on; what differs is only that its
modules were imported before it started.

A test whose subject is a fresh process (its memory, its imports, its process tree, or a SIGKILL
that must land at a point of the trainer's own choosing) says so with `@pytest.mark.fresh_trainers`,
or passes FRESH in the environment it gives the trainer; the server also declines any environment
that differs from its own in a variable an import may read. Every run ends with a line saying how
many trainers were forked and why the others started fresh.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from support.trainer_server import process_start

HERE = Path(__file__).resolve().parent
SERVER_ENV = "ROSETTA_TEST_TRAINER_SERVER"
DIR_ENV = "ROSETTA_TEST_TRAINER_SERVER_DIR"
# In a trainer's environment: start it fresh, as without the server.
FRESH = {SERVER_ENV: ""}

_server: subprocess.Popen | None = None
_made_folder: str | None = None


def _worker_name(config: pytest.Config) -> str | None:
    """This process's name when it runs tests: gwN under xdist, "main" without it; None for xdist's controller."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return workerinput["workerid"]
    return None if getattr(config.option, "numprocesses", None) else "main"


def pytest_configure(config: pytest.Config) -> None:
    global _server, _made_folder
    config.addinivalue_line("markers", "fresh_trainers: the test's trainers start as fresh processes, "
                                       "not forked from the warm trainer server (tests/support/forked_trainers.py)")
    if os.environ.get(SERVER_ENV) == "" or config.getoption("collectonly"):
        return  # switched off for the run
    if DIR_ENV not in os.environ:  # the controller (or a run without xdist) makes the folder the workers share
        os.environ[DIR_ENV] = _made_folder = tempfile.mkdtemp(prefix="rosetta-trainers-")
    worker = _worker_name(config)
    if worker is None:
        return
    folder = Path(os.environ[DIR_ENV])
    socket_path = folder / f"{worker}.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE / "trainer_client"),
                                                                     os.environ.get("PYTHONPATH")]))}
    env[SERVER_ENV] = str(socket_path)
    os.environ.update(PYTHONPATH=env["PYTHONPATH"], **{SERVER_ENV: env[SERVER_ENV]})
    with open(folder / f"{worker}.out", "wb") as out:
        _server = subprocess.Popen([sys.executable, str(HERE / "trainer_server.py"), str(socket_path),
                                    str(folder / f"{worker}.jsonl")], stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _server, _made_folder
    if _server is not None:
        _server.terminate()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()
        _server = None
    if _made_folder is not None:  # after the workers: xdist's controller unconfigures last
        shutil.rmtree(_made_folder, ignore_errors=True)
        _made_folder = None


@pytest.fixture(autouse=True)
def _fresh_trainers_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("fresh_trainers") is not None:
        monkeypatch.setenv(SERVER_ENV, "")
    yield


def _events(folder: Path) -> list[dict]:
    events = []
    for log in sorted(folder.glob("*.jsonl")):
        events += [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
    return events


def trainer_process(pid: int, timeout: float = 60, folder: str | None = None) -> int:
    """The process that runs the trainer started as `pid`: the forked one where `pid` stands in for
    it (a test that signals or kills a rank must reach the trainer itself), else `pid`."""
    folder = folder or os.environ.get(DIR_ENV)
    if not folder:
        return pid
    started = process_start(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [e for e in _events(Path(folder)) if (e.get("asker"), e.get("asker_start")) == (pid, started)]
        if mine:
            return mine[-1]["pid"] if mine[-1]["event"] == "forked" else pid
        if started < 0 or _loaded_torch(pid):
            return pid  # gone, or started as usual (no server yet)
        time.sleep(0.02)
    return pid


def _loaded_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def summary(folder: Path) -> str | None:
    """One line: trainers forked, and why the others started fresh."""
    events = _events(folder)
    if not events:
        return None
    forked = sum(e["event"] == "forked" for e in events)
    declined = collections.Counter(e["reason"] for e in events if e["event"] == "declined")
    ready = [e["seconds"] for e in events if e["event"] == "ready"]
    why = ", ".join(f"{reason}: {n}" for reason, n in declined.most_common(6))
    cold = sorted({e["module"] for e in events if e["event"] == "warm-failed"})  # each trainer imports these itself
    return (f"trainers forked from a warm server: {forked}; declined: {sum(declined.values())}"
            + (f" ({why})" if why else "") + f"; servers ready after {', '.join(f'{s:.1f}' for s in ready)} s"
            + (f"; not imported by the servers: {', '.join(cold)}" if cold else ""))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    folder = os.environ.get(DIR_ENV)
    if not folder or _worker_name(config) not in (None, "main"):
        return
    line = summary(Path(folder))
    if line:
        terminalreporter.write_sep("=", "trainer server")
        terminalreporter.write_line(line)
