"""Columnar corpora: Parquet files (the hub's format for datasets) and directories that Hugging Face
`datasets` wrote with `save_to_disk` (Arrow stream files), read with pyarrow a batch at a time.

A column name may reach into a struct with dots, as the hub's translation datasets nest their text:
`sourceColumn: translation.en`, `targetColumn: translation.de` (WMT, OPUS-100, IWSLT).
"""

from __future__ import annotations

import glob
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator, cast

from rosetta_contract.data_fields import DataSource, DataSpec
from rosetta_trainer.data.examples import (
    DataError,
    Example,
    checked_path,
    file_kind,
    required,
    single_lang,
    target_langs,
)

BATCH_ROWS = 8192


def iter_parquet(src: DataSource, data: DataSpec) -> Iterator[Example]:
    """`path`: one .parquet file, a directory whose .parquet files (any depth, in name order) are
    read one after the other, or a glob of files (`/data/opus-100/de-en/train-*.parquet`: the hub keeps
    a dataset's splits side by side)."""
    import pyarrow.parquet as pq  # pyarrow only when a spec has such a source (data/reader.py)

    if glob.has_magic(required(src.path)):
        files = [Path(f) for f in sorted(glob.glob(os.path.expanduser(required(src.path))))]
        if not files:
            raise DataError(f"{src.path}: no file matches")
    else:
        root = checked_path(required(src.path))
        files = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
        if not files:
            raise DataError(f"{src.path}: a directory with no .parquet file")

    def batches() -> Iterator[tuple[str, Any]]:
        for file in files:
            _regular(file)
            try:
                reader = pq.ParquetFile(file)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
                raise DataError(f"{file}: not a Parquet file ({_first_line(exc)})") from None
            for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=_top_columns(src)):
                yield str(file), batch

    return _examples(src, data, batches())


def iter_saved_dataset(src: DataSource, data: DataSpec) -> Iterator[Example]:
    """`path`: what `Dataset.save_to_disk` wrote (state.json beside data-*.arrow), or what
    `DatasetDict.save_to_disk` wrote (dataset_dict.json, one such directory per split; `split`
    picks one)."""
    import pyarrow as pa

    root = checked_path(required(src.path))
    if (root / "dataset_dict.json").is_file():
        splits = _json(root / "dataset_dict.json").get("splits") or []
        if src.split not in splits:
            raise DataError(f"{src.path}: a DatasetDict with splits {', '.join(splits) or '(none)'}; set split "
                            f"to one of them (not {src.split!r})")
        root = root / src.split
    state = root / "state.json"
    if not state.is_file():
        raise DataError(f"{src.path}: not a directory that datasets' save_to_disk wrote (no state.json"
                        f"{' or dataset_dict.json' if root == checked_path(required(src.path)) else ''})")
    files = [root / entry["filename"] for entry in _json(state).get("_data_files") or []]
    if not files:
        raise DataError(f"{state}: lists no data files")

    def batches() -> Iterator[tuple[str, Any]]:
        for file in files:
            _regular(file)
            try:
                reader = pa.ipc.open_stream(pa.memory_map(str(file)))
            except pa.ArrowInvalid as exc:
                raise DataError(f"{file}: not an Arrow stream ({_first_line(exc)})") from None
            for batch in reader:
                yield str(file), batch

    return _examples(src, data, batches())


# ------------------------------------------------------------------------------ helpers


def _regular(path: Path) -> None:
    """Data are files: not a device, a FIFO or /proc, whose reading could hang or show secrets."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(f"{path}: listed but missing") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or type(exc).__name__}") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{path}: {file_kind(mode)}, not a regular file; data must be files")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: {_first_line(exc)}") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object")
    return value


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _wanted(src: DataSource, fixed: str | None) -> list[str]:
    # fixed is None only where langColumn is set.
    return [src.source_column, src.target_column] + ([] if fixed else [cast(str, src.lang_column)])


def _top_columns(src: DataSource) -> list[str]:
    """The columns to read: the first part of each dotted name."""
    names = [src.source_column, src.target_column] + ([src.lang_column] if src.lang_column else [])
    return list(dict.fromkeys(name.split(".", 1)[0] for name in names))


def _column(batch: Any, name: str, where: str) -> list[Any]:
    """A column (or a struct's field, `a.b.c`) of a record batch as Python values."""
    import pyarrow as pa

    top, *fields = name.split(".")
    schema = batch.schema
    if top not in schema.names:
        raise DataError(f"{where}: no column {top!r} (columns: {', '.join(schema.names[:20])})")
    array = batch.column(schema.get_field_index(top))
    reached = top
    for field in fields:
        if not pa.types.is_struct(array.type):
            raise DataError(f"{where}: column {reached!r} is {array.type}, not a struct with a field {field!r}")
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        if field not in names:
            raise DataError(f"{where}: {reached!r} has no field {field!r} (fields: {', '.join(names[:20])})")
        array = array.field(field)
        reached = f"{reached}.{field}"
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise DataError(f"{where}: column {name!r} is {array.type}, not text")
    values: list[Any] = array.to_pylist()
    return values


def _examples(src: DataSource, data: DataSpec, batches: Iterator[tuple[str, Any]]) -> Iterator[Example]:
    fixed = None if src.lang_column and not src.target_lang else single_lang(src, data, required(src.path))
    n = 0  # examples yielded
    rows_before: dict[str, int] = {}  # per file: rows of its earlier batches
    for where, batch in batches:
        first = rows_before.get(where, 0)
        rows_before[where] = first + batch.num_rows
        columns = [_column(batch, name, where) for name in _wanted(src, fixed)]
        for row, values in enumerate(zip(*columns), first):
            if src.limit is not None and n == src.limit:
                return
            source, target = values[0], values[1]
            if source is None or target is None:
                side = src.source_column if source is None else src.target_column
                raise DataError(f"{where}: row {row}: {side!r} is null, not text")
            lang = fixed or (values[2] or "").strip()
            if lang in target_langs(data):
                yield Example(source, target, lang)
                n += 1
    if not n and not fixed:
        raise DataError(f"{src.path}: no row has a {src.lang_column!r} in targetLangs {data.target_langs}")
