"""rosetta_trainer.launch, a trainer pod's first process: the exit code the trainer's failure class
names, signals passed on, and each node's log of each attempt kept (and uploaded) as it runs.
The commands it runs here are tiny Python children, but for one real torchrun."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from rosetta_contract.exits import CUDA_OUT_OF_MEMORY_EXIT, OOM_KILLED_EXIT, TERMINATION_LOG_ENV
from rosetta_contract.failures import (
    ATTEMPT_ENV,
    CLASS_EXITS,
    NODE_RANK_ENV,
    attempt_log_path,
    termination_message,
)
from rosetta_trainer.commands.launch import AttemptLog, Launcher
from support.s3_server import isolate_aws_env, moto_s3
from support.training import TINY, deep_update

LAUNCH = [sys.executable, "-m", "rosetta_trainer.launch"]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def launch(command: list[str], tmp_path: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """The launcher running `command`, with a termination message file and no output dir unless given."""
    environ = {k: v for k, v in os.environ.items() if k not in ("ROSETTA_OUTPUT", "ROSETTA_CONFIG")}
    environ[TERMINATION_LOG_ENV] = str(tmp_path / "termination-log")
    return subprocess.run([*LAUNCH, *command], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**environ, **env}, cwd=tmp_path)


def failing_with(message: str) -> list[str]:
    """A command whose worker leaves `message` and exits 1, as torchrun does whatever its worker said."""
    return python(f"""
        import os, sys
        open(os.environ[{TERMINATION_LOG_ENV!r}], "w").write({message!r})
        sys.exit(1)
    """)


# ------------------------------------------------------------------------------- exit codes


def test_a_worker_killed_at_the_memory_limit_is_oomkilled_with_the_limit_and_the_peak(tmp_path):
    """The kernel kills the largest process (a worker) and the launcher lives on: the cgroup's
    oom_kill count, which grew while the command ran, is the only witness."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (cgroup / "memory.max").write_text(f"{12 * 2**30}\n")
    (cgroup / "memory.peak").write_text(f"{12 * 2**30 - 4096}\n")
    killed = python(f"""
        import sys
        open({str(cgroup / "memory.events")!r}, "w").write("low 0\\nhigh 0\\nmax 9\\noom 2\\noom_kill 2\\n")
        sys.exit(1)  # torchrun's code for a worker that died
    """)
    result = launch(killed, tmp_path, ROSETTA_CGROUP_DIR=str(cgroup))
    assert result.returncode == OOM_KILLED_EXIT, result.stderr.decode()
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("OOMKilled: a process of the container was killed by the kernel at its memory limit "
                              "(limit 12.0 GiB, peak 12.0 GiB)")
    assert "spec.resources.memory" in message
    # The same count before and after: another cause, the command's own code.
    unchanged = python("import sys; sys.exit(1)")
    (tmp_path / "termination-log").unlink()
    assert launch(unchanged, tmp_path, ROSETTA_CGROUP_DIR=str(cgroup)).returncode == 1
    # No cgroup v2 to read: nothing is guessed.
    assert launch(unchanged, tmp_path, ROSETTA_CGROUP_DIR=str(tmp_path / "none")).returncode == 1


@pytest.mark.parametrize("failure_class", sorted(CLASS_EXITS))
def test_a_failure_class_in_the_termination_message_is_the_exit_code(tmp_path, failure_class):
    result = launch(failing_with(termination_message(failure_class, "what happened")), tmp_path)
    assert result.returncode == CLASS_EXITS[failure_class]
    assert f"stopped on {failure_class}: exiting with {CLASS_EXITS[failure_class]}" in result.stderr.decode()


def test_without_a_class_the_commands_own_code_passes_and_a_signal_death_is_128_plus_it(tmp_path):
    # a log tail (FallbackToLogsOnError), not a class: the code is the command's
    assert launch(failing_with("Traceback (most recent call last):"), tmp_path).returncode == 1
    assert launch(python("import sys; sys.exit(7)"), tmp_path).returncode == 7
    assert launch(python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), tmp_path).returncode == 137
    # success is success, whatever an earlier message says
    assert launch(python("import os; open(os.environ['ROSETTA_TERMINATION_LOG'], 'w').write('ConfigError: x')"),
                  tmp_path).returncode == 0
    missing = launch(["no-such-command-here"], tmp_path)  # the message left above is no one's now
    assert missing.returncode == 127 and b"cannot run no-such-command-here" in missing.stderr


@pytest.mark.slow  # ~10 s: torchrun, and torch in its worker
def test_cuda_out_of_memory_under_torchrun_is_the_pods_exit_80(tmp_path):
    """The real chain: the worker's dispatch names the class, torchrun exits 1, the launcher 80."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import argparse, sys, torch
        from rosetta_contract.command_dispatch import dispatch

        def train(args):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.")

        sys.exit(dispatch(argparse.Namespace(func=train)))
    """))
    result = launch(["torchrun", "--standalone", "--nproc-per-node=1", str(worker)], tmp_path, timeout=300,
                    OMP_NUM_THREADS="1")
    assert result.returncode == CUDA_OUT_OF_MEMORY_EXIT, result.stderr.decode()[-3000:]
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("CudaOutOfMemory: out of GPU memory: lower spec.training.batch.tokens")
    assert message.endswith("CUDA out of memory. Tried to allocate 20.00 GiB.")


# ------------------------------------------------------------------------------- the attempt log


def test_the_output_is_passed_on_unchanged_and_kept_as_this_nodes_log_of_this_attempt(tmp_path):
    result = launch(python("""
        import sys
        print("step 1")
        sys.stderr.write("a warning\\n")
        print("no newline at the end", end="", flush=True)
        print()
        raise ValueError("boom")
    """), tmp_path, ROSETTA_OUTPUT=str(tmp_path / "out"), **{ATTEMPT_ENV: "3", NODE_RANK_ENV: "2"})
    assert result.returncode == 1
    kept = (tmp_path / "out" / "logs" / "attempt-3" / "node-2.log").read_bytes()
    assert kept == result.stdout and result.stderr == b""  # stderr too, in its order, on our stdout
    assert kept.startswith(b"step 1\n") and b"a warning\n" in kept and b"no newline at the end\n" in kept
    assert b"Traceback (most recent call last)" in kept and kept.endswith(b"ValueError: boom\n")
    assert attempt_log_path(3, 2) == "logs/attempt-3/node-2.log"


def test_without_an_output_dir_nothing_is_written(tmp_path):
    result = launch(python("print('hello')"), tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"hello\n", b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no termination message either: nothing failed


def test_an_output_dir_that_cannot_be_written_costs_one_warning_not_the_training(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    result = launch(python("print('trained')"), tmp_path, ROSETTA_OUTPUT=str(blocked / "out"))
    assert (result.returncode, result.stdout) == (0, b"trained\n")
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith("[rosetta launch] warning: this attempt's log is not kept in ")


def test_the_log_keeps_its_newest_bytes_within_the_bound(tmp_path):
    log = AttemptLog(tmp_path / "node-0.log", max_bytes=1000)
    written = b""
    for i in range(400):
        chunk = f"line {i}\n".encode() * (1 + i % 7)
        log.write(chunk)
        written += chunk
        assert (tmp_path / "node-0.log").stat().st_size <= 500
    log.write(b"Traceback (most recent call last):\n  ...\nRuntimeError: the end\n")
    written += b"Traceback (most recent call last):\n  ...\nRuntimeError: the end\n"
    log.close()
    kept = log.contents()
    assert (tmp_path / "node-0.log.1").stat().st_size <= 500
    assert 500 <= len(kept) <= 1000 and written.endswith(kept)  # the newest bytes, in order
    # a chunk larger than the bound keeps its end, whole
    big = AttemptLog(tmp_path / "big.log", max_bytes=100)
    big.write(b"older")
    big.write(bytes(range(200)) + b"the end")
    big.close()
    assert big.contents() == (bytes(range(200)) + b"the end")[-100:]


def test_the_launchers_own_copy_is_bounded_too(tmp_path):
    """In process, with a small bound: a command that writes more than it keeps."""
    out = io.BytesIO()
    environ = {"ROSETTA_OUTPUT": str(tmp_path), TERMINATION_LOG_ENV: str(tmp_path / "termination-log")}
    command = python("for i in range(20000): print(f'line {i}')")
    assert Launcher(command, environ, out, max_log_bytes=8192).run() == 0
    log = tmp_path / attempt_log_path(0, 0)
    kept = log.with_name(log.name + ".1").read_bytes() + log.read_bytes()
    assert out.getvalue() == b"".join(f"line {i}\n".encode() for i in range(20000))
    assert 4096 <= len(kept) <= 8192 and out.getvalue().endswith(kept)


# ------------------------------------------------------------------------------- signals


def thread_states(pid: int) -> str:
    """Every thread of `pid` and of its children: state, wait channel, pending, blocked and caught
    signals; what a failure to stop needs to be understood."""
    lines = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        children = [int(c) for t in tasks for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        for process in [pid, *children]:
            for task in os.listdir(f"/proc/{process}/task"):
                status = Path(f"/proc/{process}/task/{task}/status").read_text().splitlines()
                wanted = [line.replace("\t", " ") for line in status
                          if line.startswith(("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]
                wchan = Path(f"/proc/{process}/task/{task}/wchan").read_text()
                lines.append(f"{process}/{task} wchan={wchan} " + "; ".join(wanted))
    except OSError as exc:
        lines.append(f"(/proc: {exc})")
    return "\n".join(lines)


def stop_by_signal(tmp_path: Path, signum: int) -> None:
    """The launcher runs a command that stops cleanly on `signum`; the launcher gets `signum`."""
    marker = tmp_path / "stopped"
    command = python(f"""
        import signal, sys, time
        def stop(signum, frame):
            open({str(marker)!r}, "w").write(signal.Signals(signum).name)
            sys.exit(0)
        signal.signal({int(signum)}, stop)
        print("ready", flush=True)
        # Short sleeps: a handler runs at the interpreter's next check, so a signal that lands
        # between that check and the start of one long sleep would wait for the whole sleep.
        for _ in range(1200):
            time.sleep(0.05)
        sys.exit(3)
    """)
    stderr = tmp_path / "launcher-stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([*LAUNCH, *command], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=err,
                                start_new_session=True,  # no terminal: the launcher alone gets the signal
                                env={**os.environ, TERMINATION_LOG_ENV: str(tmp_path / "termination-log")})
    try:
        assert proc.stdout.readline() == b"ready\n"
        started = time.monotonic()
        proc.send_signal(signum)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher still ran 30 s after {signal.Signals(signum).name}:\n{thread_states(proc.pid)}"
                        f"\nits stderr: {stderr.read_text()!r}")
        assert code == 0, stderr.read_text()
        assert time.monotonic() - started < 10
        assert marker.read_text() == signal.Signals(signum).name
        assert f"passing {signal.Signals(signum).name} on to the command" in stderr.read_text()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_reaches_the_command_which_stops_cleanly(tmp_path, signum):
    stop_by_signal(tmp_path, signum)


def test_a_signal_mask_the_launcher_inherits_does_not_hold_sigterm_back(tmp_path):
    """Whoever starts the launcher may have SIGTERM blocked (a signal mask survives exec), as
    Python's multiprocessing does around starting its helpers: the pod's SIGTERM must still pass."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        stop_by_signal(tmp_path, signal.SIGTERM)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def test_the_forwarded_signals_wait_for_the_launcher_in_its_threads_and_not_in_the_command(tmp_path):
    """Every thread of the launcher blocks them, so they stay pending until its main thread's wait
    takes them (sigtimedwait, which unblocks them for the wait alone: no Python handler, which runs
    only when the main thread next runs Python); the command starts with them unblocked, whatever
    mask the launcher was given."""
    masks = python("""
        import os, time
        launcher = os.getppid()
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{launcher}/task")) < 2 and time.monotonic() < deadline:  # the output's thread
            time.sleep(0.01)
        time.sleep(0.1)  # the main thread is back in its wait
        tasks = [(os.getpid(), os.getpid())] + [(launcher, int(t)) for t in os.listdir(f"/proc/{launcher}/task")]
        for pid, tid in tasks:
            status = open(f"/proc/{pid}/task/{tid}/status").read()
            blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1]
            wchan = open(f"/proc/{pid}/task/{tid}/wchan").read() or "-"
            who = "command" if pid == os.getpid() else "main" if tid == launcher else "thread"
            print(who, int(blocked, 16), wchan)
    """)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})  # survives exec
    try:
        result = launch(masks, tmp_path)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    assert result.returncode == 0, result.stderr.decode()
    threads = [line.split() for line in result.stdout.decode().splitlines()]
    forwarded = sum(1 << (int(sig) - 1) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    assert sorted({who for who, _, _ in threads}) == ["command", "main", "thread"], threads
    for who, blocked, wchan in threads:
        if who == "command":
            assert int(blocked) & forwarded == 0, threads
        elif who == "thread":
            assert int(blocked) & forwarded == forwarded, threads
        else:
            assert int(blocked) & forwarded == forwarded or wchan.startswith("do_sigtimedwait"), threads


ORPHAN_COMMAND = """
import os, sys, time
if os.fork() == 0:  # an intermediate that leaves its own child an orphan
    if os.fork() == 0:
        open(sys.argv[1], "w").write(str(os.getpid()))
        time.sleep(0.2)
        os._exit(0)
    os._exit(0)
os.wait()
time.sleep(2)
sys.exit(7)
"""


def test_as_pid_1_the_launcher_reaps_orphans_while_it_waits_for_the_command(tmp_path):
    """In a container the launcher is PID 1: a worker's children that outlive it are handed to it,
    and each must be reaped (not left a zombie) while the command runs; the command's code is kept.
    PID 1 is played by a child subreaper, to which the kernel hands orphans the same way."""
    orphan = tmp_path / "orphan.pid"
    probe = python(f"""
        import ctypes, os, subprocess, sys
        from rosetta_trainer.commands import launch
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        os.getpid = lambda: 1
        command = subprocess.Popen([sys.executable, "-c", {ORPHAN_COMMAND!r}, {str(orphan)!r}])
        code = launch._wait(command, lambda signum: None)
        pid = open({str(orphan)!r}).read()
        print(code, "zombie" if os.path.exists(f"/proc/{{pid}}") else "reaped")
    """)
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["7", "reaped"], result.stdout + result.stderr


def test_a_command_killed_by_the_forwarded_sigterm_is_128_plus_15(tmp_path):
    proc = subprocess.Popen([*LAUNCH, *python("import time; print('ready', flush=True); time.sleep(60)")],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------- start-up, S3


def test_the_launcher_imports_neither_torch_nor_anything_heavy():
    code = ("import sys, rosetta_trainer.launch; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pydantic', 'yaml', 'boto3', 'numpy'}))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_with_an_s3_mirror_the_log_is_uploaded_beside_the_checkpoints(tmp_path, monkeypatch):
    import boto3

    isolate_aws_env(monkeypatch, tmp_path)
    with moto_s3() as url:
        bucket = f"logs-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
        config = tmp_path / "training.yaml"
        config.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"checkpoint": {"s3": {
            "uri": f"s3://{bucket}/runs/mt", "endpointUrl": url}}}})))
        result = launch(python("print('step 1'); raise SystemExit(4)"), tmp_path, ROSETTA_CONFIG=str(config),
                        ROSETTA_OUTPUT=str(tmp_path / "out"), **{ATTEMPT_ENV: "1", NODE_RANK_ENV: "0"})
        assert result.returncode == 4 and result.stderr == b""
        local = tmp_path / "out" / attempt_log_path(1, 0)
        local.with_name(local.name + ".1").write_bytes(b"older\n")  # as if it had been rotated
        assert launch(python("print('step 2')"), tmp_path, ROSETTA_CONFIG=str(config), ROSETTA_OUTPUT=str(
            tmp_path / "out"), **{ATTEMPT_ENV: "1", NODE_RANK_ENV: "0"}).returncode == 0
        client = boto3.client("s3", endpoint_url=url)
        uploaded = {key: client.get_object(Bucket=bucket, Key=f"runs/mt/logs/attempt-1/{key}")["Body"].read()
                    for key in ("node-0.log", "node-0.log.1")}
        assert uploaded == {"node-0.log": b"step 1\nstep 2\n", "node-0.log.1": b"older\n"}

    # S3 gone: one warning line, the code unchanged, the local copy kept
    result = launch(python("print('step 1')"), tmp_path, ROSETTA_CONFIG=str(config),
                    ROSETTA_OUTPUT=str(tmp_path / "out"), timeout=120)
    assert result.returncode == 0 and (tmp_path / "out" / attempt_log_path(0, 0)).read_bytes() == b"step 1\n"
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith(f"[rosetta launch] warning: this attempt's log was not uploaded to s3://{bucket}/runs/mt/")
