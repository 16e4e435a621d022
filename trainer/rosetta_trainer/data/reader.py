"""Read the corpora named in `spec.data` into `Example`s, one reader per `DataSource.format`.

    pairs      line-aligned source/target files; .gz is read transparently
    tsv, csv   one file (.gz allowed) with a header row; columns sourceColumn/targetColumn/langColumn.
               tsv splits on tabs with no quoting (MT corpora are full of stray quotes); csv uses
               standard CSV quoting, so fields may hold commas, quotes and newlines
    jsonl      one JSON object per line with the fields sourceColumn/targetColumn/langColumn
    mtgeneval  an MT-GenEval directory: geneval-sentences-{feminine,masculine}-{split}.en_XX.{en,XX}
    generated  the built-in demo corpus (rosetta_trainer.data.corpus): translations, or articles and
               their summaries when spec.task is summarization

Relative paths are resolved against the current working directory (for a pod, the container's
workingDir), not against the YAML file.

The target language of each example is the source's `targetLang`, else the row's `langColumn`
value (rows naming a language outside `targetLangs` are skipped), else the single entry of
`targetLangs`. `limit` caps the examples one source yields; a source that covers several
languages (mtgeneval, generated) splits that cap evenly between them.

Errors never quote the data: a spec may name any file the trainer can read (/proc/self/environ,
a credentials file), and the message goes to logs, the pod's termination message and the
training's status. A DataError says where (file, line, byte, column or field count) and what kind
of problem, never the bytes: not a regular file, not UTF-8, a NUL byte, a line over
MAX_LINE_BYTES, not JSON, a missing column or field. Only regular files are read (a FIFO or
/dev/zero is refused before a byte is read), a line at a time, each at most MAX_LINE_BYTES.

Torch-free: the operator and the docs tooling import it.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import os
import stat
import zlib
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path
from typing import Any, Generator, Iterator, Literal, cast

from rosetta_contract.data_fields import DataSource, DataSpec
from rosetta_trainer.data import corpus
from rosetta_trainer.data.columnar import iter_parquet, iter_saved_dataset
from rosetta_trainer.data.examples import (
    DataError,
    Example,
    checked_path,
    file_kind,
    required,
    single_lang,
    target_langs,
)

GENDERS = ("feminine", "masculine")
# The longest line (a sentence pair, a TSV row, a JSON object, a summarization article) read.
MAX_LINE_BYTES = 1 << 20


def read_split(data: DataSpec, split: Literal["train", "validation", "test"]) -> list[Example]:
    """Every example of one split, source after source in the order of the spec."""
    if split not in ("train", "validation", "test"):
        raise ValueError(f"split must be train, validation or test, not {split!r}")
    out: list[Example] = []
    for src in getattr(data, split):
        out.extend(read_source(src, data))
    return out


def read_source(src: DataSource, data: DataSpec) -> list[Example]:
    """The examples of one DataSource, at most `src.limit` of them."""
    return list(iter_source(src, data))


def iter_source(src: DataSource, data: DataSpec) -> Iterator[Example]:
    """read_source one example at a time: the large-corpus formats stream (`rosetta validate` holds
    no whole source); MT-GenEval and the generated corpus are read whole, being small."""
    streamed = _STREAMED.get(src.format)
    examples = streamed(src, data) if streamed else iter(_READERS[src.format](src, data))
    if data.task == "translation":
        return examples
    return (replace(e, task=data.task) for e in examples)


# ------------------------------------------------------------------------ helpers


def _open_regular(path: Path) -> io.BufferedReader:
    """The file, opened for binary reading, or a DataError when it is not a regular file. Opened
    non-blocking and checked on the descriptor, so a FIFO can neither block the open nor be
    swapped in after a check by name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or type(exc).__name__}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DataError(f"{path}: {file_kind(mode)}, not a regular file; data must be files")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _raw_lines(path: Path) -> Generator[str, None, None]:
    """Decoded lines with their terminators; errors name the file and the exact line, never its text."""
    # Binary reading splits on b"\n" only: a stray \r inside a sentence (common in crawled
    # corpora) must not split it and shift every later line of a line-aligned pair. Decoding
    # line by line is also what makes the line number of a bad byte exact.
    f: io.BufferedIOBase
    raw_file = f = _open_regular(path)
    try:
        if path.name.endswith(".gz"):
            f = gzip.GzipFile(fileobj=raw_file, mode="rb")  # closing it leaves raw_file open
        lineno = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise DataError(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES} bytes (1 MiB); "
                                "is this a text corpus?")
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            nul = raw.find(b"\0")
            if nul >= 0:
                raise DataError(f"{path}:{lineno}: a NUL byte at byte {nul}: binary data, not text")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            yield line
    except gzip.BadGzipFile:  # its message quotes the file's first bytes
        raise DataError(f"{path}: not a gzip file (the name ends in .gz)") from None
    except (EOFError, zlib.error):
        raise DataError(f"{path}: corrupt or truncated gzip data") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or type(exc).__name__}") from None
    finally:
        f.close()
        raw_file.close()


def _lines(path: Path) -> Generator[str, None, None]:
    return (line.rstrip("\r\n") for line in _raw_lines(path))


def _read_all(path: Path) -> list[str]:
    return list(_lines(path))


def _quotas(limit: int | None, n: int) -> list[int | None]:
    """`limit` shared out between n languages, the remainder going to the first ones."""
    if limit is None:
        return [None] * n
    share, extra = divmod(limit, n)
    return [share + (i < extra) for i in range(n)]


def _source_langs(src: DataSource, data: DataSpec) -> list[str]:
    return [src.target_lang] if src.target_lang is not None else list(target_langs(data))


# ------------------------------------------------------------------------ readers


def _iter_pairs(src: DataSource, data: DataSpec) -> Iterator[Example]:
    source_path, target_path = checked_path(required(src.source)), checked_path(required(src.target))
    lang = single_lang(src, data, required(src.source))
    sources, targets = _lines(source_path), _lines(target_path)
    n = 0  # examples yielded
    try:
        # With a limit only the lines read are checked, so a quick run on the head of a huge
        # corpus does not pay for counting the rest of it.
        for s, t in zip_longest(sources, targets):
            if s is None or t is None:
                n_source = n + (s is not None) + sum(1 for _ in sources)
                n_target = n + (t is not None) + sum(1 for _ in targets)
                raise DataError(
                    f"line counts differ: {src.source} has {n_source} lines, {src.target} has {n_target}"
                )
            if src.limit is not None and n == src.limit:
                break
            yield Example(s, t, lang)
            n += 1
    finally:
        sources.close()
        targets.close()


def _iter_table(src: DataSource, data: DataSpec) -> Iterator[Example]:
    path = checked_path(required(src.path))
    if src.format == "tsv":
        dialect: dict[str, Any] = dict(delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        dialect = dict(delimiter=",", quotechar='"', doublequote=True, strict=True)
    lines = _raw_lines(path)
    reader = csv.reader(lines, **dialect)
    n = 0  # examples yielded
    try:
        header = [name.strip() for name in next(reader, [])]
        if not header:
            raise DataError(f"{src.path}: empty file, expected a header row")
        wanted = [src.source_column, src.target_column] + ([src.lang_column] if src.lang_column else [])
        missing = [name for name in wanted if name not in header]
        if missing:
            # The spec's names only: the header row is the file's text.
            raise DataError(
                f"{src.path}:1: no column {', '.join(map(repr, missing))} in the header row "
                f"({len(header)} column{'s' * (len(header) != 1)})"
            )
        s_i, t_i = header.index(src.source_column), header.index(src.target_column)
        l_i = header.index(src.lang_column) if src.lang_column and not src.target_lang else None
        fixed = None if l_i is not None else single_lang(src, data, required(src.path))
        for row in reader:
            if src.limit is not None and n == src.limit:
                break
            if not row or row == [""]:
                continue  # a blank line, typically the last one
            if len(row) != len(header):
                raise DataError(f"{src.path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}")
            lang = fixed or row[cast(int, l_i)].strip()  # l_i is set where fixed is not
            if lang in target_langs(data):
                yield Example(row[s_i], row[t_i], lang)
                n += 1
    except csv.Error as exc:
        raise DataError(f"{src.path}:{reader.line_num}: {exc}") from None
    finally:
        lines.close()
    if not n and fixed is None:
        raise DataError(f"{src.path}: no row has a {src.lang_column!r} in targetLangs {data.target_langs}")


def _iter_jsonl(src: DataSource, data: DataSpec) -> Iterator[Example]:
    path = checked_path(required(src.path))
    fixed = None if src.lang_column and not src.target_lang else single_lang(src, data, required(src.path))
    fields = [src.source_column, src.target_column] + ([] if fixed else [src.lang_column])
    n = 0  # examples yielded
    for lineno, line in enumerate(_lines(path), 1):
        if src.limit is not None and n == src.limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{src.path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise DataError(f"{src.path}:{lineno}: invalid JSON: nested too deeply") from None
        except ValueError:  # an integer over Python's digit limit
            raise DataError(f"{src.path}:{lineno}: invalid JSON: a number with too many digits") from None
        if not isinstance(obj, dict):
            raise DataError(f"{src.path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        for name in fields:
            if name not in obj:
                # The spec's name only: the object's keys are the file's text.
                raise DataError(f"{src.path}:{lineno}: no field {name!r} in the object ({len(obj)} "
                                f"field{'s' * (len(obj) != 1)})")
            if not isinstance(obj[name], str):
                raise DataError(f"{src.path}:{lineno}: field {name!r} is {type(obj[name]).__name__}, not a string")
        lang = fixed or obj[src.lang_column].strip()
        if lang in target_langs(data):
            yield Example(obj[src.source_column], obj[src.target_column], lang)
            n += 1
    if not n and not fixed:
        raise DataError(f"{src.path}: no line has a {src.lang_column!r} in targetLangs {data.target_langs}")


def _mtgeneval_files(root: Path, split: str, lang: str) -> dict[tuple[str, str], Path]:
    return {
        (gender, side): root / f"geneval-sentences-{gender}-{split}.en_{lang}.{'en' if side == 'source' else lang}"
        for gender in GENDERS
        for side in ("source", "target")
    }


def _read_mtgeneval(src: DataSource, data: DataSpec) -> list[Example]:
    root = checked_path(required(src.path))
    if not root.is_dir():
        raise DataError(f"{src.path}: mtgeneval needs the MT-GenEval directory, not a file")
    if data.source_lang != "en":
        raise DataError(f"{src.path}: MT-GenEval translates from English, but sourceLang is '{data.source_lang}'")
    langs = _source_langs(src, data)
    present = [lang for lang in langs if any(p.exists() for p in _mtgeneval_files(root, src.split, lang).values())]
    if not present:
        pattern = f"geneval-sentences-{{feminine,masculine}}-{src.split}.en_XX.{{en,XX}}"
        raise DataError(f"{src.path}: no {pattern} files for any of {', '.join(langs)}")
    # The limit is shared out in whole (feminine, masculine) pairs; only a limit of 1 splits one.
    pair_limit = None if src.limit is None else max(src.limit // 2, 1)
    out: list[Example] = []
    for lang, quota in zip(present, _quotas(pair_limit, len(present))):
        files = _mtgeneval_files(root, src.split, lang)
        absent = [str(p) for p in files.values() if not p.exists()]
        if absent:
            raise DataError(f"MT-GenEval {src.split} for '{lang}' is incomplete: missing {', '.join(absent)}")
        text = {key: _read_all(path) for key, path in files.items()}
        counts = {len(lines) for lines in text.values()}
        if len(counts) != 1:
            listing = ", ".join(f"{files[key].name} has {len(lines)}" for key, lines in text.items())
            raise DataError(f"MT-GenEval line counts differ for '{lang}': {listing}")
        per_lang: list[Example] = []
        for i in range(counts.pop()):
            # Both genders of a line sit next to each other, so a limit keeps pairs whole.
            for gender, other in (GENDERS, GENDERS[::-1]):
                per_lang.append(Example(
                    source=text[gender, "source"][i], target=text[gender, "target"][i], target_lang=lang,
                    gender=gender, counterfactual=text[other, "target"][i], pair_id=i,
                ))
        out.extend(per_lang if quota is None else per_lang[:2 * quota])
    return out if src.limit is None else out[:src.limit]


def _read_generated(src: DataSource, data: DataSpec) -> list[Example]:
    if data.task == "summarization":
        return _read_generated_articles(src, data)
    supported = ", ".join(corpus.SUPPORTED_LANGS)
    if data.source_lang != corpus.SOURCE_LANG:
        raise DataError(f"the generated corpus translates from '{corpus.SOURCE_LANG}', "
                        f"but sourceLang is '{data.source_lang}'")
    langs = [lang for lang in _source_langs(src, data) if lang in corpus.SUPPORTED_LANGS]
    if not langs:
        wanted = ", ".join(_source_langs(src, data))
        raise DataError(f"the generated corpus has none of {wanted}; it supports {supported}")
    out: list[Example] = []
    for lang, quota in zip(langs, _quotas(src.limit, len(langs))):
        size = src.size if quota is None else min(src.size, quota)
        out.extend(Example(s, t, lang) for s, t in corpus.generate_pairs(lang, size, src.seed))
    return out


def _read_generated_articles(src: DataSource, data: DataSpec) -> list[Example]:
    lang = corpus.SOURCE_LANG
    if data.source_lang != lang or _source_langs(src, data) != [lang]:
        raise DataError(f"the generated summarization corpus is English articles with English summaries "
                        f"(sourceLang: {lang}, targetLangs: [{lang}]), but sourceLang is '{data.source_lang}' "
                        f"and the summaries would be in {', '.join(_source_langs(src, data))}")
    size = src.size if src.limit is None else min(src.size, src.limit)
    return [Example(article, summary, lang) for article, summary in corpus.generate_articles(size, src.seed)]


def _iter_parquet(src: DataSource, data: DataSpec) -> Iterator[Example]:
    return iter_parquet(src, data)


def _iter_saved_dataset(src: DataSource, data: DataSpec) -> Iterator[Example]:
    return iter_saved_dataset(src, data)


_STREAMED = {
    "pairs": _iter_pairs,
    "parquet": _iter_parquet,
    "arrow": _iter_saved_dataset,
    "tsv": _iter_table,
    "csv": _iter_table,
    "jsonl": _iter_jsonl,
}
_READERS = {
    "mtgeneval": _read_mtgeneval,
    "generated": _read_generated,
}
