"""Making a written directory survive a crash before it is renamed into place.

A rename is only as durable as what it renames: checkpoints, prepared shards and S3 downloads
fsync every file and directory of their temporary tree first, then rename, then fsync the parent."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))
