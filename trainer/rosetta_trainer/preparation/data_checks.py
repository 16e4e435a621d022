"""Checks on the raw text of `spec.data`, before any tokenizer sees it.

Errors stop the run with a `DataError` naming the file (and line); data.py raises them while it
reads, this module adds the last one:

    line counts      the two files of a `pairs` source differ: both files and their counts
    encoding         bytes that are not UTF-8: file, line, and the byte's offset in that line
    format           a bad row, JSON line or CSV quote: file and line
    nothing left     every training pair was dropped by the filters below

Filters drop training pairs and count them (summary.json "data", `rosetta validate`). A pair is
counted under the first filter that drops it, in this order:

    empty          the source or the target is empty or whitespace only
    length_ratio   translation only: the longer side has more than spec.data.checks.maxLengthRatio
                   times the characters of the shorter (Moses clean-corpus uses 9, in tokens)
    test_overlap   its source, for the same target language, is a validation or test source
    duplicate      the same (source, target, language) as an earlier training pair

Text is compared after trimming surrounding whitespace. Validation and test sets are
benchmarks: they are never altered, only their empty pairs are counted (a warning). Pairs from
`format: generated` are not checked: the demo corpus repeats short sentences by design, and its
seeds give disjoint splits (corpus.py).

A data error does not fix itself, so on a cluster a restart cannot help: `report_data_invalid`
writes it to the Kubernetes termination message, where the operator finds it and sets the
training's DataInvalid condition instead of restarting the gang. Torch-free.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from rosetta_contract.data_fields import REQUIRED_BY_FORMAT, DataSpec
from rosetta_contract.failures import FailureClass
from rosetta_contract.languages import task_prefix
from rosetta_contract.termination import write_termination_message
from rosetta_trainer.data.examples import DataError, Example
from rosetta_trainer.data.reader import iter_source
from rosetta_trainer.preparation.dedup import SeenDigests, first_occurrences, pair_digest

FILTERS = ("empty", "length_ratio", "test_overlap", "duplicate")
EVAL_SPLITS = ("validation", "test")


@dataclass
class SplitReport:
    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    empty: int = 0  # validation/test: empty pairs, kept

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SplitReport":
        return cls(read=d["read"], kept=d["kept"], dropped=Counter(d.get("dropped", {})), empty=d.get("empty", 0))

    def as_dict(self, split: str) -> dict[str, Any]:
        if split in EVAL_SPLITS:
            return {"read": self.read, "kept": self.kept, "empty": self.empty}
        return {"read": self.read, "kept": self.kept, "dropped": {name: self.dropped[name] for name in FILTERS}}


@dataclass
class CheckedData:
    """The examples that passed, and for summary.json what happened to the others."""

    train: list[Example]
    validation: list[Example]
    test: list[Example]
    reports: dict[str, SplitReport]
    # The training split to stream when it was not read here (read_checked(read_train=False)).
    training_text: TrainingText | None = None

    @property
    def report(self) -> dict[str, Any]:
        return {split: report.as_dict(split) for split, report in self.reports.items()}

    @property
    def warnings(self) -> list[str]:
        """What a person should look at although the run goes on."""
        out = []
        overlap = self.reports["train"].dropped["test_overlap"]
        if overlap:
            out.append(f"spec.data.train: dropped {overlap} {_pairs(overlap)} whose source is also a "
                       "validation or test source; check how the splits were made")
        for split in EVAL_SPLITS:
            empty = self.reports[split].empty
            if empty:
                out.append(f"spec.data.{split}: {empty} {_pairs(empty)} with an empty source or target "
                           f"(kept: {split} sets are not altered)")
        return out


def _pairs(n: int) -> str:
    return "pair" if n == 1 else "pairs"


def read_checked(data: DataSpec, keep: bool = True, train_report: dict[str, Any] | None = None, *,
                 read_train: bool = True) -> CheckedData:
    """Every split read and checked. `keep=False` only counts (`rosetta validate` on big corpora):
    the sources stream through (no file is held whole), leaving 8 bytes per distinct training pair
    (16 at the peak of a merge, dedup.py)
    and the validation and test sources. With `train_report` (a start that found its prepared
    training data, shards.find_prepared) the training split is not read: its report is that one
    and `train` is empty. With `read_train=False` it is not read either: `training_text` streams
    it later, for the one process that tokenizes it (shards.prepare_corpus)."""
    reports = {split: SplitReport() for split in ("train", *EVAL_SPLITS)}
    kept: dict[str, list[Example]] = {split: [] for split in reports}
    held_out: set[tuple[str, str]] = set()
    for split in EVAL_SPLITS:
        report = reports[split]
        for src in getattr(data, split):
            for ex in iter_source(src, data):
                report.read += 1
                source = ex.source.strip()
                if src.format != "generated" and (not source or not ex.target.strip()):
                    report.empty += 1
                held_out.add((ex.target_lang, source))
                if keep:
                    kept[split].append(ex)
        report.kept = report.read

    training_text = TrainingText(data, held_out)
    checked = CheckedData(kept["train"], kept["validation"], kept["test"], reports, training_text)
    if train_report is not None:
        reports["train"] = SplitReport.from_dict(train_report)
    elif read_train:
        for ex in training_text:
            if keep:
                kept["train"].append(ex)
        reports["train"] = training_text.report
    return checked


class TrainingText:
    """The training split as a stream of checked examples, read afresh at each iteration, so that
    no process need hold the corpus: iterating reads every source, drops what the filters drop and
    leaves the counts in `report`. Raises DataError, at the end, when no pair is left."""

    def __init__(self, data: DataSpec, held_out: set[tuple[str, str]]):
        self.data, self.held_out = data, held_out
        self.report = SplitReport()

    def __iter__(self) -> Iterator[Example]:
        data, checks = self.data, self.data.checks
        ratio = checks.max_length_ratio if data.task == "translation" else None
        held_out = self.held_out if checks.drop_test_overlap else None
        # Digests in sorted numpy runs (dedup.py): 8 bytes per distinct pair, not a set's ~85.
        report, seen = SplitReport(), SeenDigests() if checks.drop_duplicates else None
        for src in data.train:
            examples = iter_source(src, data)
            if src.format == "generated":
                judged: Iterable[tuple[Example, bool]] = ((ex, True) for ex in _counted(examples, report))
            else:
                passed = _filtered(examples, ratio, held_out, report)
                judged = first_occurrences(passed, _digest, seen) if seen is not None else ((ex, True) for ex in passed)
            for ex, kept in judged:
                if not kept:
                    report.dropped["duplicate"] += 1
                    continue
                report.kept += 1
                yield ex
        self.report = report
        if data.train and not report.kept:
            raise DataError(f"spec.data.train: no training pair is left: {describe_split('train', report)}")

    def pairs(self, use_prefix: bool) -> "TrainingPairs":
        """(model input, target) pairs: the source with its task prefix when the model takes one."""
        return TrainingPairs(self, use_prefix)


class TrainingPairs:
    """TrainingText as the (source, target) strings a tokenizer sees; iterable more than once."""

    def __init__(self, text: TrainingText, use_prefix: bool):
        self.text, self.use_prefix = text, use_prefix

    def __iter__(self) -> Iterator[tuple[str, str]]:
        if not self.use_prefix:
            return ((ex.source, ex.target) for ex in self.text)
        lang = self.text.data.source_lang
        return ((task_prefix(lang, ex.target_lang, ex.task) + ex.source, ex.target) for ex in self.text)

    def report(self) -> dict[str, Any]:
        """The training split's report of the last complete iteration (summary.json "data")."""
        return self.text.report.as_dict("train")


def _counted(examples: Iterable[Example], report: SplitReport) -> Iterator[Example]:
    for ex in examples:
        report.read += 1
        yield ex


def _filtered(examples: Iterable[Example], ratio: float | None, held_out: set[tuple[str, str]] | None,
              report: SplitReport) -> Iterator[Example]:
    """The examples that pass the filters before the duplicate one; the others counted."""
    for ex in _counted(examples, report):
        reason = _rejected(ex, ratio, held_out)
        if reason:
            report.dropped[reason] += 1
        else:
            yield ex


def _rejected(ex: Example, ratio: float | None, held_out: set[tuple[str, str]] | None) -> str | None:
    source, target = ex.source.strip(), ex.target.strip()
    if not source or not target:
        return "empty"
    if ratio is not None and max(len(source), len(target)) > ratio * min(len(source), len(target)):
        return "length_ratio"
    if held_out is not None and (ex.target_lang, source) in held_out:
        return "test_overlap"
    return None


def _digest(ex: Example) -> bytes:
    return pair_digest(ex.target_lang, ex.source.strip(), ex.target.strip())


def describe_split(split: str, report: SplitReport) -> str:
    """`1000 read, 950 kept (dropped: 3 empty, 40 duplicate)`: one line for logs and the CLI."""
    text = f"{report.read} read, {report.kept} kept"
    if split in EVAL_SPLITS:
        return text + (f" ({report.empty} with an empty side, kept)" if report.empty else "")
    dropped = [f"{report.dropped[name]} {name.replace('_', ' ')}" for name in FILTERS if report.dropped[name]]
    return text + (f" (dropped: {', '.join(dropped)})" if dropped else "")


def describe(checked: CheckedData) -> str:
    return "; ".join(f"{split} {describe_split(split, report)}"
                     for split, report in checked.reports.items() if report.read)


# --------------------------------------------------------------------- rosetta validate


def unreachable(data: DataSpec) -> list[str]:
    """`spec.data.train[0].source: /data/train.en` for each file this machine cannot see."""
    missing = []
    for split in ("train", *EVAL_SPLITS):
        for i, src in enumerate(getattr(data, split)):
            for name in REQUIRED_BY_FORMAT[src.format]:  # a format's required fields are its files
                value = getattr(src, name)
                if glob.has_magic(value) and src.format == "parquet":  # a pattern of files
                    if not glob.glob(os.path.expanduser(value)):
                        missing.append(f"spec.data.{split}[{i}].{name}: {value}")
                elif not Path(value).expanduser().exists():
                    missing.append(f"spec.data.{split}[{i}].{name}: {value}")
    return missing


def needs_checking(data: DataSpec) -> bool:
    """False when every source is generated: nothing here would be checked."""
    return any(src.format != "generated" for split in ("train", *EVAL_SPLITS) for src in getattr(data, split))


# ------------------------------------------------------------------- on a cluster


def report_data_invalid(error: DataError) -> None:
    """Leave the error where Kubernetes keeps it after the container exits: the termination
    message, `DataInvalid: <error>` (rosetta_contract.termination says where and when)."""
    write_termination_message(FailureClass.DATA_INVALID, str(error))
