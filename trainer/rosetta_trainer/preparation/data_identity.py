"""What names the training text without reading it: the data spec and each file's size and mtime.

Prepared training data is keyed by a hash of the checked text itself (shards.py), which is exact
but needs every pair read, checked and hashed at every start: a minute or more per rank at tens
of millions of pairs, before the first step, at every restart. A restart, though, almost always
finds the files as the first start left them. So a prepared directory also records the identity
of the files it was made from (`identity`), and a later start whose files have the same identity
maps that directory without reading the training text (shards.find_prepared).

The identity is what decides the checked text besides the bytes of the files: the whole of
spec.data (sources, formats, columns, limits, languages, checks, prefixes), the task, and for
every file of every split (validation and test too: the overlap filter reads them) its resolved
path, size, modification time in nanoseconds and inode. A file rewritten to the same size within
the file system's timestamp resolution would go unnoticed, as it does for make and for Hugging
Face `datasets` caches of local files; any other change (an edit, a copy, a new file matching a
glob) gives a new identity, and that start reads the text and keys it by content again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from rosetta_contract.data_fields import REQUIRED_BY_FORMAT, DataSource, DataSpec

SPLITS = ("train", "validation", "test")


def data_identity(data: DataSpec, *, use_prefix: bool) -> str | None:
    """A hash of spec.data and its files' metadata, or None when a file cannot be looked at
    (then the start reads the text, which names the problem)."""
    h = hashlib.blake2b(digest_size=16)
    spec = data.model_dump(mode="json", by_alias=True)
    h.update(json.dumps({"data": spec, "task": data.task, "prefix": use_prefix}, sort_keys=True).encode())
    try:
        for split in SPLITS:
            for src in getattr(data, split):
                for path in _files(src):
                    st = path.stat()
                    h.update(json.dumps([str(path), st.st_size, st.st_mtime_ns, st.st_ino]).encode())
    except OSError:
        return None
    return h.hexdigest()


def _files(src: DataSource) -> Iterator[Path]:
    """Every file a source reads: its file fields, a directory's files, a glob's matches."""
    for name in REQUIRED_BY_FORMAT[src.format]:
        value = os.path.expanduser(getattr(src, name))
        if glob.has_magic(value):
            matches = sorted(glob.glob(value))
            if not matches:
                raise FileNotFoundError(value)
            paths = [Path(m) for m in matches]
        else:
            paths = [Path(value)]
        for path in paths:
            path = path.resolve(strict=True)
            if path.is_dir():
                yield path
                yield from sorted(p for p in path.rglob("*") if p.is_file())
            else:
                yield path
