"""One dispatch for every command: the exit status and one line for expected errors; in a pod the
failure class also becomes the termination message, whichever side's command failed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rosetta_contract.command_dispatch import dispatch
from rosetta_contract.exits import TERMINATION_LOG_ENV
from rosetta_contract.failures import CLASS_EXITS, FailureClass
from rosetta_contract.strict_model import ConfigError


def failing(exc: BaseException) -> argparse.Namespace:
    def run(_: argparse.Namespace) -> int:
        raise exc
    return argparse.Namespace(func=run)


def test_an_expected_error_is_one_line_and_its_status(capsys: pytest.CaptureFixture[str]) -> None:
    error = ConfigError([("spec.training.maxSteps", "must be at least 1")])
    assert dispatch(failing(error)) == CLASS_EXITS[FailureClass.CONFIG_ERROR]
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "spec.training.maxSteps" in err and "Traceback" not in err


def test_an_unexpected_error_is_raised() -> None:
    with pytest.raises(ZeroDivisionError):
        dispatch(failing(ZeroDivisionError("bug")))


def test_in_a_pod_the_failure_class_is_the_termination_message(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))
    dispatch(failing(ConfigError([("spec.model.name", "unknown")])))
    assert log.read_text().startswith("ConfigError: ") and "spec.model.name" in log.read_text()


def test_a_successful_command_returns_its_status_or_zero() -> None:
    assert dispatch(argparse.Namespace(func=lambda _: None)) == 0
    assert dispatch(argparse.Namespace(func=lambda _: 3)) == 3
