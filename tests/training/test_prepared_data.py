"""Training from prepared (memory-mapped) data is the training from in-memory ids, resumed exactly,
and `rosetta prepare` saves a later training the tokenizing."""

import logging
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rosetta_cli.main import main
from rosetta_contract.exits import TERMINATION_LOG_ENV
from rosetta_trainer.checkpoints.checkpoint import latest_checkpoint
from rosetta_trainer.commands.train import train_from_file
from rosetta_trainer.data.batching import encode
from rosetta_trainer.preparation import prepare_data, shards
from support.training import TINY, deep_update, read_jsonl

pytestmark = pytest.mark.slow


def in_memory(root, tokenizer, pairs, max_source, max_target, world, **_):
    """What the trainer did before shards.py: every rank's ids as Python lists."""
    text = list(pairs)
    return encode(tokenizer, [s for s, _ in text], [t for _, t in text], max_source, max_target), pairs.report()


def weights(out):
    return load_file(str(latest_checkpoint(out / "checkpoints") / "model" / "model.safetensors"))


def test_prepare_then_train_maps_and_matches_the_in_memory_run(write_config, tmp_path, monkeypatch, caplog, capsys):
    n = 10
    cfg = str(write_config())
    with monkeypatch.context() as m:
        m.setattr(prepare_data, "prepare_corpus", in_memory)  # where the first start calls it
        straight = tmp_path / "in-memory"
        train_from_file(cfg, str(straight), overrides=[f"spec.training.maxSteps={2 * n}"], progress=False)
    assert not (straight / shards.PREPARED_DIR).exists()

    out = tmp_path / "prepared"
    assert main(["prepare", "-f", cfg, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"prepared: {out / shards.PREPARED_DIR}" in printed and "pairs: 800" in printed

    caplog.set_level(logging.INFO, logger="rosetta_trainer")
    # Only the training's own lines: whether `prepare`'s were captured above depends on the logging
    # set-up earlier tests in the session left behind.
    caplog.clear()
    first = train_from_file(cfg, str(out), overrides=[f"spec.training.maxSteps={n}"], progress=False)
    assert first["steps"] == n
    # The tokenizer `prepare` trained, and the ids it wrote: the training read no training text.
    assert f"tokenizer: reusing {out / 'tokenizer'}" in caplog.text
    assert "training data: mapped prepared 800 pairs" in caplog.text and "the training text was not read" in caplog.text
    assert "tokenized and wrote" not in caplog.text
    second = train_from_file(cfg, str(out), overrides=[f"spec.training.maxSteps={2 * n}"], progress=False)
    assert second["resumed_from_step"] == n
    assert len(list((out / shards.PREPARED_DIR).iterdir())) == 1  # the resumed run mapped the same directory

    a = {r["step"]: r["loss"] for r in read_jsonl(straight / "metrics.jsonl")}
    b = {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl")}
    assert sorted(b) == list(range(1, 2 * n + 1))
    assert [b[s] for s in sorted(b)] == [a[s] for s in sorted(b)]  # bitwise: the same batches, same order
    wa, wb = weights(straight), weights(out)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_training_without_prepare_writes_the_data_once(write_config, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rosetta_trainer.preparation.shards")
    out = tmp_path / "run"
    train_from_file(str(write_config()), str(out), overrides=["spec.training.maxSteps=4"], progress=False)
    assert "training data: tokenized and wrote 800 pairs" in caplog.text
    caplog.clear()
    train_from_file(str(write_config()), str(out), overrides=["spec.training.maxSteps=6"], progress=False)
    assert "training data: mapped prepared 800 pairs" in caplog.text


def test_a_restart_with_unchanged_files_maps_its_data_without_reading_the_training_text(
        write_config, tmp_path, monkeypatch, caplog):
    from rosetta_trainer.data.corpus import generate_pairs
    from rosetta_trainer.preparation import data_checks

    corpus = tmp_path / "train.tsv"
    corpus.write_text("source\ttarget\n" + "".join(f"{s}\t{t}\n" for s, t in generate_pairs("de", 400, seed=1)) + " \tno source\n")
    cfg = str(write_config({"data": {"train": [{"format": "tsv", "path": str(corpus)}]}}))
    read = []
    real_iter_source = data_checks.iter_source
    monkeypatch.setattr(data_checks, "iter_source", lambda src, data: read.append(src.path) or real_iter_source(src, data))
    caplog.set_level(logging.INFO, logger="rosetta_trainer.preparation.shards")
    out = tmp_path / "run"

    first = train_from_file(cfg, str(out), overrides=["spec.training.maxSteps=4"], progress=False)
    counts = first["data"]["train"]
    kept = counts["kept"]  # the generated pairs repeat some sentences: duplicates are dropped too
    assert counts["read"] == 401 and counts["dropped"]["empty"] == 1
    assert str(corpus) in read and f"tokenized and wrote {kept} pairs" in caplog.text
    read.clear()
    caplog.clear()
    resumed = train_from_file(cfg, str(out), overrides=["spec.training.maxSteps=6"], progress=False)
    assert resumed["resumed_from_step"] == 4
    assert str(corpus) not in read  # only the validation split was read
    assert "the training text was not read" in caplog.text
    assert resumed["data"]["train"] == counts  # what the first start counted

    # A changed file is read again, and keyed by its content.
    with open(corpus, "a") as fh:
        fh.write("one more line\tnoch eine Zeile\n")
    read.clear()
    caplog.clear()
    again = train_from_file(cfg, str(out), overrides=["spec.training.maxSteps=8"], progress=False)
    assert str(corpus) in read and f"tokenized and wrote {kept + 1} pairs" in caplog.text
    assert again["data"]["train"]["kept"] == kept + 1
    # An identical copy (new mtime, same text) is read, and maps the directory its content names.
    copy = tmp_path / "copy.tsv"
    copy.write_bytes(corpus.read_bytes())
    cfg_copy = str(write_config({"data": {"train": [{"format": "tsv", "path": str(copy)}]}}, name="copy.yaml"))
    read.clear()
    caplog.clear()
    train_from_file(cfg_copy, str(out), overrides=["spec.training.maxSteps=10"], progress=False)
    assert str(copy) in read and f"mapped prepared {kept + 1} pairs" in caplog.text and "tokenized" not in caplog.text
    read.clear()
    train_from_file(cfg_copy, str(out), overrides=["spec.training.maxSteps=12"], progress=False)
    assert str(copy) not in read


def test_a_bad_training_file_stops_every_rank_with_the_one_reader_s_message(tmp_path):
    # Under torchrun only rank 0 reads the training text (it trains the tokenizer and tokenizes):
    # rank 1 must still stop, with the same data error, rather than wait for rank 0 forever.
    good = [(f"The house number {i} is red.", f"Das Haus Nummer {i} ist rot.") for i in range(200)]
    (tmp_path / "train.en").write_text("".join(f"{s}\n" for s, _ in good))
    (tmp_path / "train.de").write_bytes("".join(f"{t}\n" for _, t in good[:149]).encode() + b"Stra\xdfe\n"
                                        + "".join(f"{t}\n" for _, t in good[150:]).encode())
    config = deep_update(TINY, {"spec": {"data": {"train": [
        {"format": "pairs", "source": str(tmp_path / "train.en"), "target": str(tmp_path / "train.de")}]}}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "termination-log"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "rosetta_trainer", "train", "-f", str(path), "--output", str(tmp_path / "out"),
                          "--no-progress"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", TERMINATION_LOG_ENV: str(log)})
    message = f"{tmp_path / 'train.de'}:150: not UTF-8 text"
    assert res.returncode != 0
    assert res.stderr.count(f"error: {message}") == 2, res.stderr[-3000:]  # one line from each rank
    assert message in log.read_text()
    assert not (tmp_path / "out" / shards.PREPARED_DIR).exists() or not [
        p for p in (tmp_path / "out" / shards.PREPARED_DIR).iterdir() if not p.name.startswith(".")]


def test_the_stage_job_s_prepare_serves_the_training_until_the_tokenizer_settings_change(
        write_config, tmp_path, caplog, capsys):
    """`rosetta stage --prepare OUTPUT` is the stage job of data.prepare: BeforeTraining."""
    cfg = str(write_config())
    out = tmp_path / "run"
    assert main(["stage", "-f", cfg, "--prepare", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nothing to stage" in printed and f"prepared: {out / shards.PREPARED_DIR}" in printed
    caplog.set_level(logging.INFO, logger="rosetta_trainer")
    caplog.clear()
    train_from_file(cfg, str(out), overrides=["spec.training.maxSteps=2"], progress=False)
    assert "tokenizer: reusing" in caplog.text and "the training text was not read" in caplog.text

    # Other tokenizer settings: a new tokenizer, so new ids, written by the training itself.
    caplog.clear()
    other = tmp_path / "other"
    assert main(["stage", "-f", cfg, "--prepare", str(other)]) == 0
    train_from_file(cfg, str(other), overrides=["spec.training.maxSteps=2", "spec.tokenizer.train.vocabSize=280"],
                    progress=False)
    assert "tokenizer: reusing" not in caplog.text
    assert "training data: tokenized and wrote 800 pairs" in caplog.text
