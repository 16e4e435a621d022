"""The tests' trainer server: forks each trainer a test starts from a process that imported torch,
transformers and the trainer's modules once, instead of paying those imports (6-9 CPU-seconds, most
of a tiny training's) in every rank of every test.

    python tests/support/trainer_server.py SOCKET LOG [MODULE ...]   # MODULEs to import (default: WARM_MODULES)

tests/support/forked_trainers.py starts one per pytest worker; tests/support/trainer_client/ is the
other half, the process that asked (it stands in for the trainer towards torchrun and the test).
A forked trainer gets the asker's command line, environment, working directory, umask, sys.path,
standard streams, signal mask and ignored signals, in a session of its own; it runs
the asked-for main module (`rosetta_trainer`) as `python -m` would, and exits through the interpreter's own
shutdown (atexit, threads).

The server declines (the asker then starts as usual) when the asker's environment differs from its
own in a variable that may be read while modules are imported (OMP_NUM_THREADS, HF_HOME, TORCH*...):
only the variables of RUNTIME_NAMES and RUNTIME_PREFIXES, which the trainer reads when it runs, may
differ. It SIGKILLs a forked trainer's session the moment its asker is gone (a test's SIGKILL of a
rank, of a gang's process group), and every forked trainer dies with the server.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any, Optional

# Read by the trainer when it runs, never by an import: the only variables in which a forked
# trainer's environment may differ from the server's.
RUNTIME_PREFIXES = ("ROSETTA_", "TORCHELASTIC_", "AWS_", "WANDB_", "MLFLOW_", "PYTEST_", "KUBE",
                    "FAULT_")  # the trainer's fault hooks (runtime/fault_hooks.py)
RUNTIME_NAMES = {
    # torchrun's, per worker
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    # set up for the forked trainer by the server itself (its streams), or read at run time only
    "PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES",
    # inductor's cache_dir() reads it at each use, and sets it in os.environ of the process that
    # compiled first (a pytest worker, from then on every trainer it starts)
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
    # torch.cuda.is_available() reads it at each call; DeepSpeed's import sets it in os.environ
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    # an address inductor sets in os.environ just before a compiled C++ wrapper reads it
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
}
# Which GPUs a process may see: read when CUDA is first asked, which no import of the server does.
# On a machine without one, no value can make a difference.
GPU_NAMES = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
WARM_MODULES = [
    "torch", "torch.distributed", "torch.nn.functional", "numpy", "sacrebleu", "tokenizers", "safetensors.torch",
    "transformers", "transformers.models.t5.modeling_t5", "transformers.models.marian.modeling_marian",
    "transformers.modeling_utils", "transformers.generation.utils", "transformers.tokenization_utils_fast",
    "rosetta_contract.spec", "rosetta_trainer.commands.cli", "rosetta_trainer.commands.train",
    "rosetta_trainer.engine.loop", "rosetta_trainer.models.models", "rosetta_trainer.checkpoints.checkpoint",
    "rosetta_trainer.preparation.prepare_data", "rosetta_trainer.preparation.data_checks",
    "rosetta_trainer.telemetry.telemetry", "rosetta_trainer.runtime.distributed",
    "rosetta_trainer.engine.deepspeed_backend", "rosetta_trainer.checkpoints.deepspeed_checkpoints",
    "rosetta_trainer.runtime.cpu_allocator",
    "rosetta_trainer.runtime.deepspeed_import:import_deepspeed",  # the ZeRO ranks' DeepSpeed, the trainer's way
]
PR_SET_PDEATHSIG = 1
ACCEPT_TIMEOUT = 10.0


def declined_because(base: dict[str, str], env: dict[str, str], gpus: bool = True) -> Optional[str]:
    """Why a trainer with environment `env` cannot be forked from a server started with `base`
    (`gpus`: whether this machine has any)."""
    for name in sorted(set(base) | set(env)):
        if base.get(name) == env.get(name) or name in RUNTIME_NAMES or name.startswith(RUNTIME_PREFIXES):
            continue
        if name in GPU_NAMES and not gpus:
            continue
        return f"{name} differs"
    return None


class Server:
    def __init__(self, path: str, log_path: str):
        self.base_env = dict(os.environ)  # before any import could set a variable
        self.log = open(log_path, "a", buffering=1)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.path = path
        self.pid = os.getpid()
        self.selector = selectors.DefaultSelector()
        self.running: dict[int, socket.socket] = {}  # forked trainer -> its asker's connection
        self.askers: dict[socket.socket, int] = {}
        self.gpus = bool(glob.glob("/dev/nvidia[0-9]*"))

    def warm(self, modules: list[str]) -> None:
        started = time.monotonic()
        for name in modules:  # MODULE, or MODULE:FUNCTION to call once imported
            module, _, function = name.partition(":")
            try:
                imported = importlib.import_module(module)
                if function:
                    getattr(imported, function)()
            except Exception as exc:  # one module missing costs its import in each trainer, not the server
                self.note(event="warm-failed", module=name, error=repr(exc))
        threads = len(os.listdir("/proc/self/task"))
        self.note(event="ready", seconds=round(time.monotonic() - started, 2), threads=threads,
                  modules=len(sys.modules))
        if threads != 1:
            raise SystemExit(f"trainer server: {threads} threads after the imports; forking would copy one")

    def note(self, **fields: Any) -> None:
        self.log.write(json.dumps({"time": round(time.time(), 3), **fields}) + "\n")

    def listen(self) -> None:
        staging = f"{self.path}.{os.getpid()}"
        self.listener.bind(staging)
        self.listener.listen(64)
        os.rename(staging, self.path)  # askers see the socket only once it accepts
        self.selector.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> tuple[dict[str, Any], list[int]]:
        """Serves until a fork: returns (request, descriptors) in the forked trainer only."""
        while True:
            for key, _ in self.selector.select(timeout=0.05):
                try:
                    if key.fileobj is self.listener:
                        forked = self.accept()
                        if forked is not None:
                            return forked
                    else:
                        self.asker_readable(key.fileobj)  # type: ignore[arg-type]
                except Exception as exc:  # one request gone wrong must not end the others' trainers
                    if os.getpid() != self.pid:
                        raise  # in a forked trainer: its own failure, to its own stderr
                    self.note(event="error", error=repr(exc))
            self.reap()

    def accept(self) -> Optional[tuple[dict[str, Any], list[int]]]:
        conn, _ = self.listener.accept()
        conn.settimeout(ACCEPT_TIMEOUT)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            (size,) = struct.unpack("!I", data[:4])
            while len(data) - 4 < size:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    raise OSError("the asker left mid-request")
                data += chunk
            request = json.loads(data[4:4 + size])
        except (OSError, ValueError, struct.error) as exc:
            self.note(event="bad-request", error=repr(exc))
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        asker = _asker(conn)
        reason = declined_because(self.base_env, request["env"], self.gpus) or (None if len(fds) == 3 else "no standard streams")
        if reason:
            self.note(event="declined", reason=reason, module=request["module"], args=request["args"][:1],
                      cwd=request["cwd"], **asker)
            self._send(conn, {"fallback": reason})
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.close_in_child()
            conn.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        self.note(event="forked", pid=pid, module=request["module"], args=request["args"][:1], cwd=request["cwd"],
                  **asker)
        self._send(conn, {"pid": pid})
        conn.setblocking(False)
        self.running[pid] = conn
        self.askers[conn] = pid
        self.selector.register(conn, selectors.EVENT_READ)
        return None

    def asker_readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # askers send nothing after their request
        pid = self.askers.pop(conn)
        self.selector.unregister(conn)
        conn.close()
        if self.running.pop(pid, None) is not None:
            self.note(event="asker-gone", pid=pid)
            try:
                os.killpg(pid, signal.SIGKILL)  # the trainer and whatever it started
            except ProcessLookupError:
                pass

    def reap(self) -> None:
        while True:
            try:  # looked at, not reaped: the session's id stays the dead trainer's while we kill what is left in it
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            try:
                os.killpg(pid, signal.SIGKILL)  # what it started (data-loader workers), as a container's end would
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            conn = self.running.pop(pid, None)
            self.note(event="ended", pid=pid, status=status)
            if conn is None:
                continue
            self.askers.pop(conn, None)
            self.selector.unregister(conn)
            conn.setblocking(True)
            try:
                self._send(conn, {"status": status})
            except OSError:
                pass
            conn.close()

    @staticmethod
    def _send(conn: socket.socket, message: dict[str, Any]) -> None:
        conn.sendall(json.dumps(message).encode() + b"\n")

    def close_in_child(self) -> None:
        self.selector.close()
        self.listener.close()
        for conn in self.askers:
            conn.close()
        self.log.close()


def _asker(conn: socket.socket) -> dict[str, int]:
    """The asking process, by its pid and start time (a pid alone may be a later process's)."""
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return {"asker": pid, "asker_start": process_start(pid)}


def process_start(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field); -1 once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the process the asker would have been, up to its main module."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    for signum in signal.valid_signals():
        if signal.getsignal(signum) not in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # as Python's own startup sets them
        signal.signal(signum, signal.SIG_IGN)
    for signum in request["ignored"]:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    _reopen_standard_streams(unbuffered=request["unbuffered"])
    sys.path[:] = request["path"]
    sys.dont_write_bytecode = request["dont_write_bytecode"]
    sys.orig_argv = request["argv"]
    sys.argv = ["-m", *request["args"]]
    # atexit keeps what the imports registered (logging's shutdown, weakref's finalizers), as a fresh
    # trainer's would after the same imports; the server registers nothing of its own.


def _reopen_standard_streams(unbuffered: bool) -> None:
    """New stream objects over the asker's descriptors, buffered as Python would have made them."""
    old_out, old_err, old_in = sys.stdout, sys.stderr, sys.stdin
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding=old_in.encoding, errors=old_in.errors)
    for fd, name, old in ((1, "stdout", old_out), (2, "stderr", old_err)):
        raw = io.FileIO(fd, "w", closefd=False)
        interactive = raw.isatty()
        binary = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors, write_through=unbuffered,
                                  line_buffering=interactive or fd == 2)  # stderr: always line-buffered
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def main(path: str, log_path: str, modules: list[str]) -> None:
    server = Server(path, log_path)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the pytest worker's end is ours
    if os.getppid() == 1:
        raise SystemExit("trainer server: the pytest worker that started it is gone")
    server.warm(modules)
    server.listen()
    request, fds = server.serve()
    become(request, fds)
    import runpy

    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or WARM_MODULES)
