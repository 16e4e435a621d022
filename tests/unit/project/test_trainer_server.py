"""The tests' trainer server (tests/support/trainer_server.py and its client): a command it serves
runs forked from the server with the asker's command line, environment, directory, streams and
signals, and ends as the asker's own process would have; anything it cannot serve starts as usual.

A probe module stands in for the trainer here, with a server that imports nothing heavy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support.forked_trainers import HERE, SERVER_ENV, summary, trainer_process

PROBE = "served_probe"
MODULES_ENV = "ROSETTA_TEST_TRAINER_MODULES"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(environment for an asker, the server's log, the probe's folder) of a running server."""
    folder = tmp_path_factory.mktemp("server")
    (folder / f"{PROBE}.py").write_text(textwrap.dedent("""
        import json, os, signal, sys, time
        if sys.argv[1] == "report":
            print(json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv, "cwd": os.getcwd(), "pid": os.getpid(),
                              "umask": os.umask(0), "env": [os.environ.get("ROSETTA_ANYTHING"), os.environ.get("PROBE_VALUE")], "stdin": sys.stdin.read(),
                              "sigint": repr(signal.getsignal(signal.SIGINT)), "name": __name__}))
            sys.stderr.write("to stderr\\n")
            sys.exit(int(sys.argv[2]))
        if sys.argv[1] == "wait":
            def stop(signum, frame):
                print("stopped by", signal.Signals(signum).name, flush=True)
                sys.exit(0)
            signal.signal(signal.SIGTERM, stop)
            print(os.getpid(), flush=True)
            for _ in range(1200):  # short sleeps: a handler waits for the sleep its signal came before
                time.sleep(0.05)
            sys.exit(3)
        if sys.argv[1] == "die":
            os.kill(os.getpid(), signal.SIGUSR1)
        if sys.argv[1] == "leave-a-child":
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            print(os.getpid(), flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "trainer_client"), str(folder)]),
           MODULES_ENV: PROBE, SERVER_ENV: str(folder / "server.sock"), "PYTHONUNBUFFERED": "1"}
    log = folder / "server.jsonl"
    server = start_server(env, log)
    yield env, log, folder
    server.terminate()
    server.wait(timeout=30)


def start_server(env: dict, log: Path) -> subprocess.Popen:
    """A server on env's socket, once it listens."""
    server = subprocess.Popen([sys.executable, str(HERE / "trainer_server.py"), env[SERVER_ENV], str(log), "json"],
                              env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while not Path(env[SERVER_ENV]).exists():
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return server


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def ask(env: dict, *args: str, sigint=signal.SIG_DFL, **kwargs) -> subprocess.CompletedProcess:
    """The probe run as a test would run a trainer, with SIGINT's action `sigint` whatever this run inherited."""
    return subprocess.run([sys.executable, "-m", PROBE, *args], capture_output=True, text=True, timeout=60,
                          env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint), **kwargs)


def test_a_served_command_runs_forked_as_the_asker_would_have_run(served, tmp_path):
    env, log, _ = served
    before = len(events(log))
    old = os.umask(0o027)
    try:
        result = ask({**env, "ROSETTA_ANYTHING": "x"}, "report", "7", cwd=tmp_path, input="from stdin")
    finally:
        os.umask(old)
    assert result.returncode == 7 and result.stderr == "to stderr\n", result.stderr
    report = json.loads(result.stdout)
    (forked,) = [e for e in events(log)[before:] if e["event"] == "forked"]
    assert report["pid"] == forked["pid"]  # it ran in the server's child
    assert report["argv"][1:] == ["report", "7"] and report["argv"][0].endswith(f"{PROBE}.py")
    assert report["orig_argv"][1:] == ["-m", PROBE, "report", "7"]
    assert (report["cwd"], report["umask"], report["stdin"], report["name"]) == (
        str(tmp_path), 0o027, "from stdin", "__main__")
    assert report["env"] == ["x", None] and "default_int_handler" in report["sigint"]


def test_a_signal_the_asker_inherited_ignored_stays_ignored_in_the_served_command(served):
    """A background job of a shell without job control starts with SIGINT ignored, and Python keeps
    it so (no KeyboardInterrupt); the forked command must too, not get the server's handlers."""
    env, log, _ = served
    before = len(events(log))
    result = ask(env, "report", "0", input="", sigint=signal.SIG_IGN)
    assert result.returncode == 0, result.stderr
    assert [e["event"] for e in events(log)[before:]].count("forked") == 1
    assert json.loads(result.stdout)["sigint"] == repr(signal.SIG_IGN)


def test_an_environment_an_import_may_read_differently_is_declined_and_starts_fresh(served):
    env, log, _ = served
    before = len(events(log))
    result = ask({**env, "PROBE_VALUE": "given"}, "report", "0", input="")
    assert result.returncode == 0 and json.loads(result.stdout)["env"] == [None, "given"]
    assert [(e["event"], e.get("reason")) for e in events(log)[before:]] == [("declined", "PROBE_VALUE differs")]


def test_a_signal_to_the_asker_reaches_the_forked_command_and_its_death_is_the_askers(served):
    env, log, _ = served
    asker = subprocess.Popen([sys.executable, "-m", PROBE, "wait"], stdout=subprocess.PIPE, text=True, env=env)
    forked_pid = int(asker.stdout.readline())
    assert forked_pid != asker.pid
    asker.send_signal(signal.SIGTERM)
    assert asker.wait(timeout=30) == 0
    assert asker.stdout.read() == "stopped by SIGTERM\n"
    assert ask(env, "die").returncode == -signal.SIGUSR1
    # a test's SIGKILL of the trainer itself (support.trainer_processes.rank_pid finds it)
    asker = subprocess.Popen([sys.executable, "-m", PROBE, "wait"], stdout=subprocess.PIPE, text=True, env=env)
    os.kill(int(asker.stdout.readline()), signal.SIGKILL)
    assert asker.wait(timeout=30) == -signal.SIGKILL



def test_a_server_that_dies_under_a_forked_command_ends_the_asker_saying_so(served, tmp_path):
    env, _, _ = served
    env = {**env, SERVER_ENV: str(tmp_path / "own.sock")}
    server = start_server(env, tmp_path / "own.jsonl")
    asker = subprocess.Popen([sys.executable, "-m", PROBE, "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    forked_pid = int(asker.stdout.readline())
    server.kill()
    server.wait(timeout=30)
    assert asker.wait(timeout=30) == 1  # never a trainer of its own after one ran
    assert "[trainer server] gone before the trainer ended" in asker.stderr.read()
    wait_gone(forked_pid, "the forked command outlived its server")

def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while not gone(pid):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_killed_asker_takes_its_forked_command_with_it_and_tests_find_the_forked_one(served):
    env, log, folder = served
    asker = subprocess.Popen([sys.executable, "-m", PROBE, "wait"], stdout=subprocess.PIPE, text=True, env=env)
    forked_pid = int(asker.stdout.readline())
    assert trainer_process(asker.pid, folder=str(folder)) == forked_pid
    asker.kill()
    asker.wait(timeout=30)
    wait_gone(forked_pid, "the forked command outlived its asker")
    assert any(e["event"] == "asker-gone" and e["pid"] == forked_pid for e in events(log))


def test_what_a_forked_command_started_ends_with_it(served):
    """A container's processes end with it: so do a forked command's (its session)."""
    env, _, _ = served
    asker = subprocess.Popen([sys.executable, "-m", PROBE, "leave-a-child"], stdout=subprocess.PIPE, text=True,
                             env=env)
    forked_pid = int(asker.stdout.readline())
    (child,) = Path(f"/proc/{forked_pid}/task/{forked_pid}/children").read_text().split()
    assert asker.wait(timeout=30) == 0
    wait_gone(int(child), "the forked command's child outlived it")


def test_without_a_server_or_for_another_module_the_command_starts_as_usual(served, tmp_path):
    env, log, _ = served
    before = len(events(log))
    gone = ask({**env, SERVER_ENV: str(tmp_path / "none.sock")}, "report", "0", input="")
    assert gone.returncode == 0 and json.loads(gone.stdout)["pid"] != 0
    other = ask({**env, MODULES_ENV: "rosetta_trainer"}, "report", "0", input="")
    switched_off = ask({**env, SERVER_ENV: ""}, "report", "0", input="")
    assert other.returncode == switched_off.returncode == 0
    assert [e for e in events(log)[before:] if e["event"] in ("forked", "declined")] == []  # none of them asked


def test_the_runs_summary_counts_forks_and_why_the_rest_started_fresh(tmp_path):
    (tmp_path / "gw0.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"event": "ready", "seconds": 8.25}, {"event": "forked", "pid": 1}, {"event": "forked", "pid": 2},
        {"event": "declined", "reason": "HF_HOME differs"}, {"event": "ended", "pid": 1, "status": 0}]) + "\n")
    (tmp_path / "gw1.jsonl").write_text(json.dumps({"event": "warm-failed", "module": "deepspeed"}) + "\n"
                                        + json.dumps({"event": "ready", "seconds": 9.0}) + "\n")
    assert summary(tmp_path) == ("trainers forked from a warm server: 2; declined: 1 (HF_HOME differs: 1); "
                                 "servers ready after 8.2, 9.0 s; not imported by the servers: deepspeed")
    assert summary(tmp_path / "none") is None


@pytest.mark.parametrize("env, gpus, reason", [
    ({"OMP_NUM_THREADS": "1", "RANK": "1", "ROSETTA_OUTPUT": "/o", "FAULT_HANG_RANK": "1"}, True, None),
    ({"OMP_NUM_THREADS": "2"}, False, "OMP_NUM_THREADS differs"),  # read when torch loads
    ({"OMP_NUM_THREADS": "1", "HF_HOME": "/h"}, False, "HF_HOME differs"),  # huggingface_hub's constants
    ({}, False, "OMP_NUM_THREADS differs"),
    ({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, False, None),
    ({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, True, "CUDA_VISIBLE_DEVICES differs"),
])
def test_only_variables_read_at_run_time_may_differ_from_the_servers(env, gpus, reason):
    from support.trainer_server import declined_because

    assert declined_because({"OMP_NUM_THREADS": "1"}, env, gpus) == reason
