"""`rosetta tensorboard NAME`: the run's TensorBoard event files, copied out of rank 0's pod and served
by a local TensorBoard.

Rank 0 writes them to `$ROSETTA_OUTPUT/tensorboard` (spec.metrics.tensorboard); the copy runs
`tar` in its trainer container through the exec API, as `kubectl cp` does, so it needs rank 0 to
be running. Once the pods are gone the files are still on the checkpoint volume, under
`<mountPath>/<name>/tensorboard`.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Optional

from rosetta_operator.kube import Cluster, VerbError
from rosetta_operator.pod_logs import CONTAINER, container_state, rank_pod

FOLDER = "tensorboard"
# ROSETTA_OUTPUT is set in the trainer container by the operator (pod_template.py): the run's own folder.
COPY_COMMAND = ["sh", "-c", f'cd "$ROSETTA_OUTPUT" && tar cf - {FOLDER}']


def _rank0(cluster: Cluster, name: str) -> Mapping[str, Any]:
    training = cluster.existing_training(name)
    metrics = (training.get("spec") or {}).get("metrics") or {}
    if metrics.get("tensorboard") is False:
        raise VerbError(f"{name} writes no event files (spec.metrics.tensorboard: false)")
    status = training.get("status") or {}
    jobset = status.get("jobSetName") or name
    pod = rank_pod(cluster.pods(jobset), jobset, 0)
    if pod is None or container_state(pod) != "running":
        raise VerbError(f"rank 0 of {name} is not running (phase {status.get('phase') or 'unknown'}): its event "
                        f"files are on the checkpoint volume, under <mountPath>/{name}/{FOLDER}")
    return pod


def read_tar(cluster: Cluster, pod: str, timeout: float = 300) -> bytes:
    """`tar cf - tensorboard` run in the pod's trainer container: the archive's bytes."""
    from kubernetes.stream import stream

    resp = stream(cluster.core.connect_get_namespaced_pod_exec, pod, cluster.namespace, container=CONTAINER,
                  command=COPY_COMMAND, stdin=False, stdout=True, stderr=True, tty=False,
                  _preload_content=False, binary=True)
    out, err = io.BytesIO(), io.BytesIO()
    deadline = time.monotonic() + timeout
    try:
        while resp.is_open() and time.monotonic() < deadline:
            resp.update(timeout=1)
            if resp.peek_stdout():
                out.write(resp.read_stdout())
            if resp.peek_stderr():
                err.write(resp.read_stderr())
        timed_out = resp.is_open()
    finally:
        resp.close()
    if timed_out:
        raise VerbError(f"copying the event files out of pod {pod} took over {timeout:.0f} s")
    if resp.returncode:
        text = " ".join(err.getvalue().decode("utf-8", "replace").split())
        raise VerbError(f"no event files copied from pod {pod} (rank 0 writes them from its first logged step): "
                        f"{text or f'exit status {resp.returncode}'}")
    return out.getvalue()


def extract(archive: bytes, dest: Path) -> int:
    """Unpack the `tensorboard/` tree into `dest` (its contents, not the folder); returns the number of
    files. Only plain files and folders inside it are taken: nothing a pod sends can write elsewhere."""
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if not parts or parts[0] != FOLDER or ".." in parts or not (member.isfile() or member.isdir()):
                continue
            target = dest.joinpath(*parts[1:]) if len(parts) > 1 else dest
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            if source is not None:
                target.write_bytes(source.read())
                count += 1
    return count


def copy(cluster: Cluster, name: str, dest: Path) -> tuple[str, int]:
    """(rank 0's pod, files copied)."""
    pod = _rank0(cluster, name)["metadata"]["name"]
    return pod, extract(read_tar(cluster, pod), dest)


def serve(cluster: Cluster, name: str, dest: Path, *, port: int, host: str, refresh: float,
          serve: bool = True) -> int:
    """Copy, then run TensorBoard on the copy; every `refresh` seconds (0: never) copy again while
    rank 0 runs, so the curves keep growing. Returns when TensorBoard exits (Ctrl-C)."""
    pod, count = copy(cluster, name, dest)
    print(f"copied {count} file{'s' * (count != 1)} from pod {pod} into {dest}", file=sys.stderr)
    if not serve:
        return 0
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(dest), "--port", str(port), "--host", host]
    print(f"TensorBoard at http://{host}:{port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    proc = subprocess.Popen(command)
    # Stopped by a signal rather than Ctrl-C (a terminal's kill, a test), TensorBoard must stop too.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if in_main else None
    try:
        next_copy = time.monotonic() + refresh
        while proc.poll() is None:
            time.sleep(0.5)
            if refresh and time.monotonic() >= next_copy:
                next_copy = time.monotonic() + refresh
                try:
                    copy(cluster, name, dest)
                except (VerbError, ApiException, HTTPError):
                    pass  # rank 0 ended, restarts, or the API is away: keep serving what was copied
        return proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def default_dest(name: str, namespace: Optional[str]) -> Path:
    return Path("tensorboard") / (namespace or "default") / name
