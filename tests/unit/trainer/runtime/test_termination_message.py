"""Every error the trainer classifies leaves `<Class>: <message>` in its pod's termination message, which
the operator reads and the pod's launcher exits with (rosetta_contract.failures, rosetta_contract.termination)."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from rosetta_contract.command_dispatch import dispatch
from rosetta_contract.exits import MAX_TERMINATION_MESSAGE, TERMINATION_LOG_ENV, TERMINATION_PREFIX
from rosetta_contract.failures import CLASS_EXITS, FailureClass, parse_termination_message
from rosetta_contract.strict_model import ConfigError
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.engine.loop import NonFiniteError
from rosetta_trainer.preparation.data_checks import report_data_invalid
from rosetta_trainer.runtime.distributed import CollectiveTimeout


def failing(exc: BaseException) -> argparse.Namespace:
    def command(args):
        raise exc
    return argparse.Namespace(func=command)


@pytest.fixture
def message_file(tmp_path, monkeypatch):
    path = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(path))
    return path


@pytest.mark.parametrize("error, failure_class, text", [
    (ConfigError([("spec.nodes", "must be at least 1")], "t.yaml"), FailureClass.CONFIG_ERROR,
     "invalid TranslationTraining in t.yaml: spec.nodes: must be at least 1"),
    (DataError("train.en:3: not UTF-8 text"), FailureClass.DATA_INVALID, "train.en:3: not UTF-8 text"),
    (NonFiniteError("the loss is nan at step 7"), FailureClass.NON_FINITE, "the loss is nan at step 7"),
    (CollectiveTimeout("a collective operation timed out"), FailureClass.COLLECTIVE_TIMEOUT,
     "a collective operation timed out"),
], ids=lambda v: v if isinstance(v, str) and v in CLASS_EXITS else "")
def test_a_classified_error_leaves_its_class_and_exits_with_its_code(message_file, capsys, error, failure_class,
                                                                     text):
    assert dispatch(failing(error)) == CLASS_EXITS[failure_class]
    assert message_file.read_text() == f"{failure_class}: {text}"
    assert parse_termination_message(message_file.read_text()) == (failure_class, text)
    assert capsys.readouterr().err == f"error: {error}\n"


def test_the_data_invalid_line_the_operator_matches_is_as_before(message_file):
    report_data_invalid(DataError("corpus.tsv:2: a bad row"))
    assert message_file.read_text() == TERMINATION_PREFIX + "corpus.tsv:2: a bad row"
    assert TERMINATION_PREFIX == "DataInvalid: "


def test_cuda_out_of_memory_says_what_to_change_before_torchs_own_words(message_file, capsys):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "79.19 GiB of which 1.2 GiB is free.")
    assert dispatch(failing(oom)) == CLASS_EXITS[FailureClass.CUDA_OUT_OF_MEMORY] == 80
    failure_class, text = parse_termination_message(message_file.read_text())
    assert failure_class == FailureClass.CUDA_OUT_OF_MEMORY
    # the spec's own field names, each of which exists
    for field in ("spec.training.batch.tokens", "batch.sentences", "training.gradientAccumulation",
                  "training.activationCheckpointing", "distributed.backend: deepspeed", "distributed.zeroStage",
                  "offload.optimizer"):
        assert text.index(field) < text.index("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert capsys.readouterr().err == f"error: {text}\n"
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError  # what torch.cuda raises is caught too


def test_the_first_class_a_pods_ranks_leave_is_kept(message_file):
    """A rank's error is the cause; the errors of the ranks that fail after it mostly follow from it."""
    dispatch(failing(torch.OutOfMemoryError("CUDA out of memory.")))
    dispatch(failing(CollectiveTimeout("a collective operation timed out")))
    assert message_file.read_text().startswith("CudaOutOfMemory: ")
    message_file.write_text("Traceback (most recent call last):")  # not a class: replaced
    dispatch(failing(CollectiveTimeout("a collective operation timed out")))
    assert message_file.read_text() == "CollectiveTimeout: a collective operation timed out"


def test_a_long_message_is_one_line_within_the_kubelets_bound(message_file):
    dispatch(failing(DataError("ü" * 3000 + "\n\tsecond line")))
    text = message_file.read_text()
    assert "\n" not in text and len(text.encode()) <= MAX_TERMINATION_MESSAGE
    assert text.startswith(TERMINATION_PREFIX + "üü") and text.endswith("ü")  # cut between characters


def test_a_bug_is_raised_and_leaves_nothing(message_file):
    with pytest.raises(ZeroDivisionError):
        dispatch(failing(ZeroDivisionError("bug")))
    assert not message_file.exists()


def test_off_a_cluster_no_termination_message_file_is_created(monkeypatch, capsys):
    monkeypatch.delenv(TERMINATION_LOG_ENV, raising=False)
    if os.path.exists("/dev/termination-log"):
        pytest.skip("this machine is a pod")
    assert dispatch(failing(ConfigError([("spec.nodes", "must be at least 1")]))) == 2
    assert not os.path.exists("/dev/termination-log")
