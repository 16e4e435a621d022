"""The real node's own image registry: images go from the Docker engine into the node's containerd
through a registry on 127.0.0.1 (Debian's docker-registry, tests/images/local-registry.sh) instead
of `docker save | ctr images import`.

A save streams the whole image whatever changed in it: after a source change the trainer differs
from its last build in a few MB of its last layers, yet copying its 6.4 GB took five minutes of the
node tests (measured). Through a registry whose storage is kept between runs in the node cache,
`docker push` uploads only the layers the registry lacks, and containerd's pull fetches and unpacks
only from the first layer it has no snapshot of (its unpacker fetches lazily). The first push on a
machine gzips every layer: minutes, once per machine.

Docker remembers which blobs it pushed to which host:port, so the port is derived from the storage's
path, the same from one run to the next. Before serving, the storage is garbage-collected: the
blobs only superseded builds referenced (their tag has moved on) go.
"""

from __future__ import annotations

import socket
import subprocess
import zlib
from pathlib import Path

from control_plane import ControlPlane, ControlPlaneError, answers, free_port, wait_until

SCRIPT = Path(__file__).resolve().parents[1] / "images" / "local-registry.sh"
PROCESS = "node-registry"


def stable_port(storage: Path, base: int = 50000) -> int:
    """A port in base..base+9999 that depends only on the storage's path (tests/images' registry
    uses 40000-49999 the same way)."""
    return base + zlib.crc32(str(storage.resolve()).encode()) % 10000


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the registry binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start(cp: ControlPlane, storage: Path, timeout: float = 300) -> str:
    """Garbage-collect `storage`, serve it (a process of `cp`, stopped with it) and return
    127.0.0.1:PORT. The first call on a machine may install the package (apt)."""
    storage.mkdir(parents=True, exist_ok=True)
    if (storage / "data").exists():
        # Only a smaller store is at stake: a failed collection is left to the next run's.
        subprocess.run(["bash", str(SCRIPT), "--garbage-collect", str(storage)], capture_output=True,
                       timeout=600, check=False)
    port = stable_port(storage)
    if not port_free(port):
        port = free_port()  # Docker may then upload every layer again
    cp.spawn(PROCESS, ["bash", str(SCRIPT), str(port), str(storage)])

    def ready() -> bool:
        cp.check_alive(PROCESS)
        return answers(f"http://127.0.0.1:{port}/v2/")

    try:
        wait_until(ready, f"the node's registry not answering on 127.0.0.1:{port}", timeout)
    except ControlPlaneError:
        cp.stop_process(PROCESS)
        raise
    return f"127.0.0.1:{port}"


def remote_name(address: str, qualified: str) -> str:
    """`docker.io/library/rosetta-trainer:test` → `127.0.0.1:PORT/library/rosetta-trainer:test`."""
    return f"{address}/{qualified.split('/', 1)[1]}"


def push(ref: str, remote: str, docker: str = "docker") -> None:
    """Docker's `ref` into the registry as `remote`; the extra tag is removed again."""
    def run(*argv: str, timeout: float = 60) -> None:
        proc = subprocess.run([docker, *argv], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ControlPlaneError(f"docker {' '.join(argv)}: {proc.stderr.strip()[-2000:]}")

    run("tag", ref, remote)
    try:
        run("push", remote, timeout=1800)
    finally:
        subprocess.run([docker, "image", "rm", remote], capture_output=True, timeout=120, check=False)
