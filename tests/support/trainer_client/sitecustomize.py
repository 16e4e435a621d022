"""The client half of the tests' trainer server (tests/support/trainer_server.py).

On PYTHONPATH of every process a test starts (tests/support/forked_trainers.py), so Python imports it
at startup, before the main module. In a process started as `python [-u] -m rosetta_trainer ...`
while $ROSETTA_TEST_TRAINER_SERVER names a server's socket, it hands its command, environment,
working directory, signal state and standard streams to the server, which forks the trainer from a
process that imported torch and transformers already, and then stands in for that trainer: it passes
on every signal it gets and ends as the trainer ended (its exit code, or death by its signal), so
torchrun and the tests see one process as before. Everything else (no server, a server that is not
ready yet or declines, any other command) goes on as a plain start, exactly as without this file.

Standard library only, and nothing imported unless the command is a trainer's: every Python process
of the run reads this file.
"""

import os
import sys

SERVER_ENV = "ROSETTA_TEST_TRAINER_SERVER"
# The main modules to ask the server for, comma-separated (its own tests serve a probe module).
MODULES_ENV = "ROSETTA_TEST_TRAINER_MODULES"
# Interpreter options a trainer's command line may carry before `-m` (torchrun adds -u).
ALLOWED_OPTIONS = {"-u", "-B"}


def _trainer_command():
    """(module, arguments) of `python -m MODULE ARGS` for a module the server serves, else None."""
    argv = getattr(sys, "orig_argv", [])
    served = (os.environ.get(MODULES_ENV) or "rosetta_trainer").split(",")
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return (argv[i + 1], argv[i + 2:]) if argv[i + 1:i + 2] and argv[i + 1] in served else None
        if arg not in ALLOWED_OPTIONS:
            return None
    return None


def _stand_in(path, module, args):
    import json
    import signal
    import socket
    import struct

    forwarded = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2]
    request = {
        "argv": list(sys.orig_argv), "module": module, "args": list(args), "env": dict(os.environ), "cwd": os.getcwd(),
        "ignored": [int(s) for s in signal.valid_signals() if signal.getsignal(s) is signal.SIG_IGN],
        "blocked": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
        "umask": _umask(), "path": list(sys.path), "dont_write_bytecode": sys.dont_write_bytecode,
        "unbuffered": "-u" in sys.orig_argv[1:sys.orig_argv.index("-m")] or bool(os.environ.get("PYTHONUNBUFFERED")),
    }
    payload = json.dumps(request).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [struct.pack("!I", len(payload)) + payload], [0, 1, 2])
        line, rest = _first_line(conn)
        reply = json.loads(line)
    except (OSError, ValueError):
        conn.close()
        return  # no server (yet), or one gone: start as usual
    if "pid" not in reply:
        conn.close()
        return  # declined (reply["fallback"] says why): start as usual
    try:
        _follow(reply["pid"], conn, rest, forwarded)
    finally:  # whatever happened: the trainer ran, so this process must never start one of its own
        os._exit(1)


def _first_line(conn, rest=b"", wake=None):
    """(the first newline-ended message, what came after it) from `conn`; OSError if it closes first.

    With `wake` (the read end of a signal wakeup socket) it also wakes for each signal, so that the
    signal's Python handler runs at once instead of after the read."""
    import select

    watched = [conn] if wake is None else [conn, wake]
    while b"\n" not in rest:
        ready, _, _ = select.select(watched, [], [])  # handlers run as it returns
        if wake in ready:
            try:
                wake.recv(4096)
            except BlockingIOError:
                pass
        if conn in ready:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("the server closed the connection")
            rest += chunk
    line, _, rest = rest.partition(b"\n")
    return line, rest


def _follow(trainer, conn, rest, forwarded):
    """Pass each signal on to the forked trainer, then end as it ended.

    A Python handler runs at the interpreter's next check, so one whose signal came just before a
    blocking read would wait for that read to end (the trainer's end, here): the handlers' C half
    also writes to a wakeup socket, which the read of the trainer's end watches beside the server's."""
    import json
    import signal
    import socket

    def pass_on(signum, frame):
        try:
            os.kill(trainer, signum)
        except ProcessLookupError:
            pass

    wake, woken = socket.socketpair()
    wake.setblocking(False)
    woken.setblocking(False)
    signal.set_wakeup_fd(woken.fileno(), warn_on_full_buffer=False)
    for signum in forwarded:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, pass_on)
    try:
        line, _ = _first_line(conn, rest, wake)
    except OSError:
        sys.stderr.write("[trainer server] gone before the trainer ended\n")
        os._exit(1)
    status = json.loads(line)["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:  # SIGKILL's action cannot be set, and is the default
            signal.set_wakeup_fd(-1)
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _umask():
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _main():
    path = os.environ.get(SERVER_ENV)
    if not path:
        return
    command = _trainer_command()
    if command is not None:
        _stand_in(path, *command)


_main()
