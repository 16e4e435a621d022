"""Bad training data, caught before tokenization: an error naming file and line, or a counted filter.

One test per check on small files written here, then the same checks through `rosetta validate`,
through `rosetta train` as a pod runs it (exit code, termination message), and in a real tiny
training whose summary.json reports what was dropped.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rosetta_cli.main import main
from rosetta_contract.data_fields import DataSpec
from rosetta_contract.exits import DATA_INVALID_EXIT, TERMINATION_PREFIX
from rosetta_trainer.data.corpus import generate_pairs
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.preparation.data_checks import read_checked
from support.training import TINY, deep_update


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def pairs(tmp_path: Path, name: str, rows: list[tuple[str, str]]) -> dict:
    return {"format": "pairs", "source": write_lines(tmp_path / f"{name}.en", [s for s, _ in rows]),
            "target": write_lines(tmp_path / f"{name}.de", [t for _, t in rows])}


def data_spec(train: list[dict], test: list[dict] = (), **checks) -> DataSpec:
    return DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "train": train,
                                    "test": list(test), "checks": checks})


GOOD = [("The cat sleeps.", "Die Katze schläft."), ("We buy bread.", "Wir kaufen Brot."),
        ("It is cold today.", "Heute ist es kalt.")]


# ---------------------------------------------------------------------------- errors


def test_line_counts_that_differ_name_both_files_and_counts(tmp_path):
    src = write_lines(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(DataError) as err:
        read_checked(data_spec([{"format": "pairs", "source": src, "target": tgt}]))
    assert str(err.value) == f"line counts differ: {src} has 3 lines, {tgt} has 2"


@pytest.mark.parametrize("fmt", ["pairs", "tsv"])
def test_invalid_utf8_names_file_line_and_byte(tmp_path, fmt):
    good = [s.encode() + b"\t" + t.encode() for s, t in GOOD]
    if fmt == "pairs":
        bad = tmp_path / "train.de"
        bad.write_bytes(b"Die Katze schl\xc3\xa4ft.\nWir kaufen Brot.\nHeute \xff kalt.\n")
        source = {"format": "pairs", "source": write_lines(tmp_path / "train.en", [s for s, _ in GOOD]),
                  "target": str(bad)}
        where = f"{bad}:3: not UTF-8 text (invalid start byte at byte 6)"
    else:
        bad = tmp_path / "train.tsv"
        bad.write_bytes(b"source\ttarget\n" + good[0] + b"\n" + good[1] + b"\nIt is \xe9\tkalt\n")
        source = {"format": "tsv", "path": str(bad)}
        where = f"{bad}:4: not UTF-8 text (invalid continuation byte at byte 6)"
    with pytest.raises(DataError) as err:
        read_checked(data_spec([source]))
    assert str(err.value) == where


def test_a_corpus_with_nothing_left_is_an_error(tmp_path):
    with pytest.raises(DataError) as err:
        read_checked(data_spec([pairs(tmp_path, "train", [("", "a"), ("  ", "b"), ("x", "y" * 50)])]))
    assert str(err.value) == ("spec.data.train: no training pair is left: "
                              "3 read, 0 kept (dropped: 2 empty, 1 length ratio)")


# --------------------------------------------------------------------------- filters


def test_empty_and_whitespace_only_pairs_are_dropped_and_counted(tmp_path):
    rows = [GOOD[0], ("", "Leer."), ("   ", "Leer."), ("Empty.", "\t"), ("Empty.", "\u3000"), GOOD[1]]
    test = [("Nothing.", ""), GOOD[2]]
    checked = read_checked(data_spec([pairs(tmp_path, "train", rows)], [pairs(tmp_path, "test", test)]))
    assert [(e.source, e.target) for e in checked.train] == GOOD[:2]
    assert checked.report["train"] == {"read": 6, "kept": 2, "dropped": {
        "empty": 4, "length_ratio": 0, "test_overlap": 0, "duplicate": 0}}
    # The test set is a benchmark: counted and warned about, never altered.
    assert len(checked.test) == 2
    assert checked.report["test"] == {"read": 2, "kept": 2, "empty": 1}
    assert checked.warnings == [
        "spec.data.test: 1 pair with an empty source or target (kept: test sets are not altered)"]


def test_extreme_length_ratio_is_dropped_at_the_configured_threshold(tmp_path):
    rows = [GOOD[0], ("Yes.", "Ja, das ist vollkommen richtig und so weiter."),  # 4 vs 44 chars: 11x
            ("Hello.", "Guten Tag allerseits."),                              # 6 vs 21 chars: 3.5x
            ("A very long English sentence that was misaligned.", "Ja.")]    # 50 vs 3
    source = pairs(tmp_path, "train", rows)
    checked = read_checked(data_spec([source]))
    assert [e.source for e in checked.train] == ["The cat sleeps.", "Hello."]
    assert checked.report["train"]["dropped"]["length_ratio"] == 2
    assert read_checked(data_spec([source], maxLengthRatio=3)).report["train"]["kept"] == 1
    assert read_checked(data_spec([source], maxLengthRatio=None)).report["train"]["kept"] == 4


def test_duplicate_pairs_are_dropped_keeping_the_first(tmp_path):
    rows = [GOOD[0], GOOD[1], GOOD[0], (" The cat sleeps. ", "Die Katze schläft."), GOOD[2],
            ("The cat sleeps.", "Die Katze schläft!")]  # another translation: not a duplicate
    source = pairs(tmp_path, "train", rows)
    checked = read_checked(data_spec([source]))
    assert [(e.source, e.target) for e in checked.train] == [*GOOD, ("The cat sleeps.", "Die Katze schläft!")]
    assert checked.report["train"]["dropped"]["duplicate"] == 2
    assert read_checked(data_spec([source], dropDuplicates=False)).report["train"]["kept"] == 6


def test_train_pairs_with_a_test_source_are_dropped_with_a_warning(tmp_path):
    test = [("The cat sleeps.", "Die Katze schläft."), ("It is cold today.", "Es ist heute kalt.")]
    rows = [*GOOD, ("It is cold today.", "Heute ist es kühl."), ("We buy bread.", "Brot kaufen wir.")]
    train, test = pairs(tmp_path, "train", rows), pairs(tmp_path, "test", test)
    checked = read_checked(data_spec([train], [test]))
    # Matched on the source: a train pair with another translation of a test sentence still leaks it.
    assert [e.source for e in checked.train] == ["We buy bread.", "We buy bread."]
    assert checked.report["train"]["dropped"]["test_overlap"] == 3
    assert checked.warnings == ["spec.data.train: dropped 3 pairs whose source is also a validation or test "
                                "source; check how the splits were made"]
    assert read_checked(data_spec([train], [test], dropTestOverlap=False)).report["train"]["kept"] == 5


def test_each_pair_counts_under_the_first_filter_that_drops_it(tmp_path):
    rows = [GOOD[0], GOOD[0], ("", ""), GOOD[2], GOOD[2], ("Hi.", "H" * 40), ("Hi.", "H" * 40)]
    checked = read_checked(data_spec([pairs(tmp_path, "train", rows)], [pairs(tmp_path, "test", [GOOD[2]])]))
    assert checked.report["train"] == {"read": 7, "kept": 1, "dropped": {
        "empty": 1, "length_ratio": 2, "test_overlap": 2, "duplicate": 1}}


def test_the_generated_demo_corpus_is_not_filtered():
    generated = generate_pairs("de", 800, 1)
    assert len(set(generated)) < 800  # it repeats its date sentences by design
    checked = read_checked(data_spec([{"format": "generated", "size": 800, "seed": 1}]))
    assert checked.report["train"]["kept"] == len(checked.train) == 800


# ------------------------------------------------------------------------ the CLIs


def document(tmp_path: Path, data: dict, name: str = "training.yaml") -> str:
    doc = deep_update(TINY, {"spec": {"data": data}})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_reports_the_checks_when_the_files_are_here(tmp_path, capsys):
    rows = [*GOOD, GOOD[0], ("", "Leer.")]
    path = document(tmp_path, {"train": [pairs(tmp_path, "train", rows)],
                               "validation": [pairs(tmp_path, "valid", [GOOD[1]])]})
    assert main(["validate", "-f", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: tiny: 1 node x 1 CPU process per node")
    assert out[1:] == [
        "data: train: 5 read, 2 kept (dropped: 1 empty, 1 test overlap, 1 duplicate)",
        "data: validation: 1 read, 1 kept",
        "warning: spec.data.train: dropped 1 pair whose source is also a validation or test source; "
        "check how the splits were made",
    ]
    assert main(["validate", "-f", path, "--skip-data"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_validate_says_why_it_did_not_check_files_that_only_the_pod_has(tmp_path, capsys):
    path = document(tmp_path, {"train": [{"format": "pairs", "source": "/data/wmt/train.en",
                                          "target": "/data/wmt/train.de"}]})
    assert main(["validate", "-f", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("data: not checked: spec.data.train[0].source: /data/wmt/train.en is not on this "
                      "machine (and 1 more); the trainer checks it in the pod before training")


def test_validate_exits_with_the_data_error_and_no_traceback(tmp_path):
    bad = tmp_path / "train.de"
    bad.write_bytes(b"Die Katze.\n\xc3(\nHeute.\n")
    source = {"format": "pairs", "source": write_lines(tmp_path / "train.en", ["a", "b", "c"]), "target": str(bad)}
    rosetta = Path(sys.executable).with_name("rosetta")
    result = subprocess.run([str(rosetta), "validate", "-f", document(tmp_path, {"train": [source]})],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == DATA_INVALID_EXIT, result.stderr
    assert result.stdout == ""
    assert result.stderr == f"error: {bad}:2: not UTF-8 text (invalid continuation byte at byte 0)\n"


@pytest.mark.slow  # ~20 s: torch and transformers load before the data is read
def test_train_in_a_pod_leaves_the_error_in_the_termination_message(tmp_path):
    """What the kubelet keeps of a failed trainer: exit code 65 and one line for the operator."""
    source = {"format": "pairs", "source": write_lines(tmp_path / "train.en", ["a", "b", "c"]),
              "target": write_lines(tmp_path / "train.de", ["x", "y"])}
    message_file = tmp_path / "termination-log"
    env = {**os.environ, "ROSETTA_TERMINATION_LOG": str(message_file), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-m", "rosetta_trainer", "train", "--no-progress",
                             "-f", document(tmp_path, {"train": [source]}), "-o", str(tmp_path / "run")],
                            capture_output=True, text=True, env=env, timeout=300)
    error = f"line counts differ: {source['source']} has 3 lines, {source['target']} has 2"
    assert result.returncode == DATA_INVALID_EXIT, result.stderr[-3000:]
    assert f"error: {error}\n" in result.stderr and "Traceback" not in result.stderr
    assert message_file.read_text() == TERMINATION_PREFIX + error


# --------------------------------------------------------------------- a real training


@pytest.mark.slow
def test_a_training_on_a_dirty_corpus_reports_what_it_dropped(tmp_path):
    from rosetta_trainer.commands.train import train_from_file

    clean = list(dict.fromkeys(generate_pairs("de", 400, 1)))
    validation = generate_pairs("de", 24, 2)
    dirty = [*clean[:100], ("", "Leer."), ("   ", "\t"), clean[0], clean[1], clean[2],
             ("Yes.", "Ja, das ist vollkommen richtig und so weiter, sagte er."), *validation[:4],
             *clean[100:]]
    doc = copy.deepcopy(TINY)
    doc["spec"]["data"]["train"] = [pairs(tmp_path, "train", dirty)]
    doc["spec"]["training"]["maxSteps"] = 6
    doc["spec"]["checkpoint"]["interval"] = 6
    doc["spec"]["evaluation"].update(interval=6, maxSamples=8)
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(doc))

    summary = train_from_file(str(path), str(tmp_path / "run"), progress=False)

    expected = {"train": {"read": len(dirty), "kept": len(clean), "dropped": {
                    "empty": 2, "length_ratio": 1, "test_overlap": 4, "duplicate": 3}},
                "validation": {"read": 24, "kept": 24, "empty": 0},
                "test": {"read": 0, "kept": 0, "empty": 0}}
    assert summary["steps"] == 6
    assert summary["data"] == expected
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data"] == expected


@pytest.mark.slow  # ~3-4 s each: a fresh process's peak memory
@pytest.mark.parametrize("fmt", ["jsonl", "pairs"])
def test_counting_streams_each_source_without_holding_it(tmp_path, fmt):
    """`rosetta validate` (read_checked(keep=False)) on a corpus larger than what it may hold: its
    peak Python memory stays far below the text's size (without the duplicate check, whose digests
    are the one thing that grows with the corpus)."""
    import tracemalloc

    pairs = [(f"{s} number {i}", f"{t} Nummer {i}") for i, (s, t) in enumerate(generate_pairs("de", 2000, seed=4) * 50)]
    if fmt == "jsonl":
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in pairs))
        sources = [{"format": "jsonl", "path": str(path)}]
        size = path.stat().st_size
    else:
        (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs))
        (tmp_path / "train.de").write_text("".join(t + "\n" for _, t in pairs))
        sources = [{"format": "pairs", "source": str(tmp_path / "train.en"), "target": str(tmp_path / "train.de")}]
        size = sum((tmp_path / f"train.{x}").stat().st_size for x in ("en", "de"))
    data = DataSpec.model_validate({"sourceLang": "en", "targetLangs": ["de"], "train": sources,
                                    "checks": {"dropDuplicates": False}})
    tracemalloc.start()
    try:
        checked = read_checked(data, keep=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert checked.reports["train"].read == len(pairs) == 100_000
    assert size > 5_000_000 and peak < size / 5, (peak, size)
