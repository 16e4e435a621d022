"""`python -m rosetta_trainer.launch torchrun ARGS...`: a trainer pod's first process (pod_template.command).

It runs the command (`torchrun` as this interpreter's torch.distributed.run, so no PATH lookup;
anything else as given) and
  - passes SIGTERM, SIGINT and SIGHUP on to it: torchrun forwards them to every worker, whose stop
    checkpoint must fit in the pod's grace period (preemption.py). They are taken synchronously
    (blocked in every thread of the launcher, taken by sigtimedwait), not by a Python handler,
    which runs only when the interpreter's main thread next checks for one;
  - copies its output, as it comes, to its own and to this node's log of this attempt,
    $ROSETTA_OUTPUT/logs/attempt-A/node-R.log (failures.attempt_log_path), which outlives the pod on
    the training's volume. The newest MAX_ATTEMPT_LOG_BYTES are kept: the older half moves to
    node-R.log.1 whenever the file reaches half of it, and a traceback, at the end, is never lost.
    With spec.checkpoint.s3 both files are uploaded at exit, at their path under the checkpoints' prefix;
  - exits with the code of the failure class the trainer wrote to the termination message
    (failures.CLASS_EXITS), since torchrun exits 1 whatever its workers returned; else with the
    command's own code, 128+N for a death by signal N as a shell says.

The log copy never fails the training: a directory that cannot be written costs one warning line.
Imports the standard library and rosetta_contract only: the pod starts before torch loads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, Optional

from rosetta_contract.exits import MAX_TERMINATION_MESSAGE, termination_log
from rosetta_contract.failures import (
    ATTEMPT_ENV,
    CLASS_EXITS,
    MAX_ATTEMPT_LOG_BYTES,
    NODE_RANK_ENV,
    FailureClass,
    attempt_log_path,
    parse_termination_message,
)
from rosetta_contract.termination import write_termination_message
from rosetta_trainer.runtime.cgroup_memory import cgroup_dir, memory_figures, oom_kills, oom_message

OUTPUT_ENV = "ROSETTA_OUTPUT"
CONFIG_ENV = "ROSETTA_CONFIG"
# What the image has on its PATH, as modules of this interpreter.
MODULES = {"torchrun": "torch.distributed.run"}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A terminal sends these to its whole foreground process group, the command included.
FROM_TERMINAL = (signal.SIGINT, signal.SIGHUP)
# What the launcher waits for: a signal to pass on, or a child that ended (the command, or an orphan
# to reap as PID 1).
AWAITED = (*FORWARDED, signal.SIGCHLD)
# After the command exits, how long output may still come: a worker that outlived torchrun holds the pipe.
DRAIN_SECONDS = 10.0
# The longest the launcher waits without looking at the command: SIGCHLD wakes it as soon as a child
# ends, this only bounds a SIGCHLD lost to a disposition the launcher inherited.
WAKE_SECONDS = 0.2
CHUNK = 64 * 1024


def command_argv(argv: list[str]) -> list[str]:
    module = MODULES.get(argv[0])
    return [sys.executable, "-m", module, *argv[1:]] if module else list(argv)


def _int_env(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ.get(name) or 0)
    except ValueError:
        return 0


class AttemptLog:
    """One node's log of one attempt, appended as the output comes (a pod run again in the same
    attempt adds to it). Each of the file and its `.1` holds at most half of `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int = MAX_ATTEMPT_LOG_BYTES):
        self.path, self.rotated, self.half = path, path.with_name(path.name + ".1"), max(1, max_bytes // 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: BinaryIO = open(path, "ab")
        self.size = self.file.tell()

    def write(self, data: bytes) -> None:
        data = data[-2 * self.half:]  # only the end of what outgrows the bound can be kept
        if self.size and self.size + len(data) > self.half:
            self._rotate()
        if len(data) > self.half:
            self._append(data[:-self.half])
            self._rotate()
            data = data[-self.half:]
        self._append(data)

    def _append(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        self.size += len(data)

    def _rotate(self) -> None:
        self.file.close()
        os.replace(self.path, self.rotated)
        self.file = open(self.path, "ab")
        self.size = 0

    def close(self) -> None:
        if self.file.closed:
            return
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
        finally:
            self.file.close()

    def contents(self) -> bytes:
        """Both files, oldest bytes first."""
        return b"".join(p.read_bytes() for p in (self.rotated, self.path) if p.exists())


class Launcher:
    def __init__(self, argv: list[str], environ: Mapping[str, str], out: BinaryIO,
                 max_log_bytes: int = MAX_ATTEMPT_LOG_BYTES):
        self.argv, self.environ, self.out = argv, environ, out
        self.attempt, self.node_rank = _int_env(environ, ATTEMPT_ENV), _int_env(environ, NODE_RANK_ENV)
        self.child: Optional[subprocess.Popen[bytes]] = None
        self._lock = threading.Lock()  # the output's thread and the launcher's own lines
        self.log: Optional[AttemptLog] = None
        self.log = self._open_log(max_log_bytes)
        # The cgroup's count of processes killed at the memory limit, before the command ran.
        self.oom_kills_before = oom_kills(cgroup_dir())

    def say(self, message: str) -> None:
        """A line of the launcher's own, on its stderr and in the attempt log."""
        line = f"[rosetta launch] {message}\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        self._to_log(line.encode())

    def _open_log(self, max_bytes: int) -> Optional[AttemptLog]:
        output = self.environ.get(OUTPUT_ENV)
        if not output:
            return None
        path = Path(output) / attempt_log_path(self.attempt, self.node_rank)
        try:
            return AttemptLog(path, max_bytes)
        except OSError as exc:
            self.say(f"warning: this attempt's log is not kept in {path}: {exc}")
            return None

    def _to_log(self, data: bytes) -> None:
        with self._lock:
            log = self.log
            if log is None:
                return
            try:
                log.write(data)
                return
            except OSError as exc:  # a full disk: go on without the copy
                self.log, failure = None, exc
        self.say(f"warning: this attempt's log stops here ({log.path}): {failure}")

    # ----------------------------------------------------------------- signals

    def _pass_on(self, child: subprocess.Popen[bytes], signum: int) -> None:
        if signum in FROM_TERMINAL and _terminal_signals_our_group():
            return  # the terminal sent it to the command too: a second one would cut its shutdown short
        self.say(f"passing {signal.Signals(signum).name} on to the command (pid {child.pid})")
        child.send_signal(signum)

    # ----------------------------------------------------------------- running

    def _tee(self, fd: int) -> None:
        out: Optional[BinaryIO] = self.out
        while True:
            try:
                chunk = os.read(fd, CHUNK)
            except OSError:
                break
            if not chunk:
                break
            if out is not None:
                try:
                    out.write(chunk)
                    out.flush()
                except (OSError, ValueError):  # nobody reads our output any more: keep the file
                    out = None
            self._to_log(chunk)

    def run(self) -> int:
        # From here on the awaited signals stay pending until _wait takes them; the command and only
        # the command starts with them unblocked (a mask survives exec, and whoever started us may
        # have blocked SIGTERM: the pod's SIGTERM would wait for the grace period's SIGKILL).
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, AWAITED)
        try:
            code = self._run()
        finally:
            while signal.sigtimedwait(FORWARDED, 0) is not None:
                pass  # came after the command ended: there is no one left to pass them to
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if self.child is not None:  # the command ran: a class is the trainer's, not a stale file's
            code = self._classified(code)
        self._close_log()
        return code

    def _run(self) -> int:
        try:
            child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=_unblock_awaited)
        except OSError as exc:
            self.say(f"cannot run {self.argv[0]}: {exc}")
            return 127
        self.child = child
        assert child.stdout is not None
        # Started with the signals blocked, as every thread the launcher starts: none may take them.
        tee = threading.Thread(target=self._tee, args=(child.stdout.fileno(),), daemon=True)
        tee.start()
        code = _wait(child, lambda signum: self._pass_on(child, signum))
        tee.join(DRAIN_SECONDS)
        return code

    def _classified(self, code: int) -> int:
        """The failure class's code when the trainer named one, else the command's."""
        if code == 0:
            return 0
        path = termination_log(self.environ)
        try:
            if path is None:
                raise FileNotFoundError("not in a pod")
            with open(path, encoding="utf-8", errors="replace") as f:
                parsed = parse_termination_message(f.read(MAX_TERMINATION_MESSAGE))
        except OSError:
            parsed = None
        if parsed is None:
            parsed = self._killed_at_memory_limit()
        if parsed is None:
            return code
        failure_class = parsed[0]
        self.say(f"{self.argv[0]} exited with {code}; the trainer stopped on {failure_class}: "
                 f"exiting with {CLASS_EXITS[failure_class]}")
        return CLASS_EXITS[failure_class]

    def _killed_at_memory_limit(self) -> Optional[tuple[str, str]]:
        """(OOMKilled, why) when the kernel killed a process of this container at its memory limit
        while the command ran (a worker, mostly: the largest process), written as the termination
        message as the trainer would have, had it lived to say so."""
        directory = cgroup_dir()
        after = oom_kills(directory)
        if after is None or after <= (self.oom_kills_before or 0):
            return None
        message = oom_message(memory_figures(directory))
        write_termination_message(FailureClass.OOM_KILLED, message)
        return FailureClass.OOM_KILLED, message

    def _close_log(self) -> None:
        with self._lock:
            log, self.log = self.log, None
        if log is None:
            return
        try:
            log.close()
        except OSError as exc:
            self.say(f"warning: this attempt's log may be incomplete ({log.path}): {exc}")
        upload_log(log, self.environ, attempt_log_path(self.attempt, self.node_rank), self.say)


def _unblock_awaited() -> None:
    """In the command's process, between fork and exec (the launcher has one thread then)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, AWAITED)


def _wait(child: subprocess.Popen[bytes], on_signal: Callable[[int], None]) -> int:
    """The child's exit code, 128+N for a death by signal N, handing each forwarded signal that comes
    meanwhile to `on_signal`. As a container's PID 1, also reap the orphans the kernel hands us (a
    worker's own children, once the worker is gone).

    The caller has AWAITED blocked: sigtimedwait takes them from the pending set in this thread, so a
    signal is passed on as soon as it comes, whichever thread the kernel chose and whatever the
    interpreter was doing."""
    ended: Callable[[], Optional[int]] = (lambda: _reap_until(child)) if os.getpid() == 1 else child.poll
    while (code := ended()) is None:
        info = signal.sigtimedwait(AWAITED, WAKE_SECONDS)
        if info is not None and info.si_signo != signal.SIGCHLD:
            on_signal(info.si_signo)
    return 128 - code if code < 0 else code


def _reap_until(child: subprocess.Popen[bytes]) -> Optional[int]:
    """Reap every child that has ended; the command's code once it is among them (or once a poll
    of the signal forwarding reaped it first), None while it runs."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # none left: the command was reaped already
            pid = 0
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
        if pid in (0, child.pid):
            return child.returncode


def _terminal_signals_our_group() -> bool:
    """Whether we run in the foreground of a terminal, whose Ctrl-C (or hangup) reaches our whole
    process group: the command already got the signal."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def upload_log(log: AttemptLog, environ: Mapping[str, str], key: str, say: Callable[[str], None]) -> None:
    """Best effort: the log's files to spec.checkpoint.s3, at their path (`key`, and `key`.1) under the
    checkpoints' prefix. Only then is the training's document read, and boto3 imported."""
    config = environ.get(CONFIG_ENV)
    if not config:
        return
    try:
        from rosetta_contract.spec import load_for_trainer

        s3 = load_for_trainer(config).spec.checkpoint.s3
    except Exception:  # the trainer has said what is wrong with the document
        return
    if s3 is None:
        return
    key = f"{s3.prefix}/{key}" if s3.prefix else key
    try:
        from rosetta_trainer.runtime.s3_client import RetryPolicy, make_client  # boto3: the [s3] extra

        client = make_client(s3, RetryPolicy(http_attempts=2, connect_timeout_s=5, read_timeout_s=30))
        for path, name in ((log.rotated, key + ".1"), (log.path, key)):
            if path.exists():
                client.put_object(Bucket=s3.bucket, Key=name, Body=path.read_bytes(),
                                  ContentType="text/plain; charset=utf-8")
    except Exception as exc:  # the local copy is still there
        say(f"warning: this attempt's log was not uploaded to s3://{s3.bucket}/{key}: {exc}")


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if args else 2
    return Launcher(command_argv(args), os.environ, sys.stdout.buffer).run()


if __name__ == "__main__":
    sys.exit(main())
