"""Trainer processes for the fault and training tests: start one (alone, under torchrun, or as two
'nodes'), find a rank's process, and read the metrics an attempt wrote itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from support.forked_trainers import trainer_process


def start_training(cfg: Path, output: Path, ranks: int, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`rosetta train` as one process, or under `torchrun --standalone` with `ranks` workers;
    in a new session, so that the whole gang can be killed by its process group."""
    trainer = ["-m", "rosetta_trainer", "train", "-f", str(cfg), "--output", str(output), "--no-progress"]
    launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    with open(log, "w") as fh:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, *launcher, *trainer], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env})


def two_node_training(cfg: Path, outputs: list[Path], *extra: str, timeout: float = 900) -> list[tuple[int, str]]:
    """`rosetta train` on two 'nodes' of this machine: two torchrun launchers of one worker each,
    node ranks 0 and 1 (what each pod of a 2-node JobSet runs), node R writing to outputs[R].
    Returns each node's (exit status, output); the output is also in <output>.log beside each."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = [out.parent / f"{out.name}.log" for out in outputs]
    nodes = []
    for rank, (out, log) in enumerate(zip(outputs, logs)):
        with open(log, "w") as fh:  # a file, not a pipe: a node that is not read never blocks
            nodes.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
                 "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
                 "-m", "rosetta_trainer", "train", "-f", str(cfg), "--output", str(out), "--no-progress", *extra],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}))
    codes = [node.wait(timeout=timeout) for node in nodes]
    return [(code, log.read_text()) for code, log in zip(codes, logs)]


def _children(pid: int) -> list[tuple[int, list[bytes]]]:
    """(pid, environ) of each child of `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out.append((int(entry.name), (entry / "environ").read_bytes().split(b"\0")))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours
    return out


def kill_gang(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and each worker's: torchrun starts every worker in a
    session of its own, so killing the launcher's group alone would leave the workers running."""
    for pgid in [pid for pid, _ in _children(proc.pid)] + [proc.pid]:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def rank_pid(proc: subprocess.Popen, ranks: int, rank: int, timeout: float = 300) -> int:
    """The process of `rank`: the trainer itself, or the torchrun worker whose env says RANK=rank
    (the trainer forked for it, where a warm server forked it: support.forked_trainers)."""
    if ranks == 1:
        return trainer_process(proc.pid, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, environ in _children(proc.pid):
            if f"RANK={rank}".encode() in environ:
                return trainer_process(pid, timeout)
        assert proc.poll() is None, "torchrun ended before its workers could be found"
        time.sleep(0.05)
    raise AssertionError(f"no worker with RANK={rank} under torchrun {proc.pid} after {timeout} s")


def has_exited(pid: int) -> bool:
    """Gone, or a zombie its launcher has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lines_of(path: Path) -> set[str]:
    return set(path.read_text().splitlines()) if path.exists() else set()


def new_records(path: Path, stale: set[str]) -> list[dict]:
    """Records this attempt logged: the lines that were not in the file when it started (a resumed
    run first drops the killed attempt's records past its checkpoint, then logs those steps again,
    with other timings)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        if line in stale:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # being written
    return out
