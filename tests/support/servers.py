"""Helper servers the tests start as processes (a registry, Prometheus): wait for them, stop them."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from control_plane import answers


@contextlib.contextmanager
def server(argv: list[str], log: Path, ready_url: str, what: str, timeout: float = 60) -> Iterator[None]:
    """Run argv (output in `log`) until the block ends; inside it, `ready_url` has answered 200.
    Fails the test with the log's tail if the server exits or does not answer within `timeout`."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not answers(ready_url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{what} did not answer at {ready_url}:\n{log.read_text(errors='replace')[-3000:]}",
                                pytrace=False)
                time.sleep(0.5)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
