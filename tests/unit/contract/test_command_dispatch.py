"""One dispatch for every command: the exit status and one line for expected errors; the failure
class reported only where the command (or its caller) asks for it."""

from __future__ import annotations

import argparse

import pytest

from rosetta_contract.command_dispatch import dispatch
from rosetta_contract.failures import CLASS_EXITS, FailureClass
from rosetta_contract.strict_model import ConfigError


def failing(exc: BaseException, **defaults: object) -> argparse.Namespace:
    def run(_: argparse.Namespace) -> int:
        raise exc
    return argparse.Namespace(func=run, **defaults)


def test_an_expected_error_is_one_line_and_its_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(failing(ConfigError([("spec.training.maxSteps", "must be at least 1")]))) == CLASS_EXITS[FailureClass.CONFIG_ERROR]
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "spec.training.maxSteps" in err and "Traceback" not in err


def test_an_unexpected_error_is_raised() -> None:
    with pytest.raises(ZeroDivisionError):
        dispatch(failing(ZeroDivisionError("bug")))


def test_the_failure_class_goes_where_the_command_asks_else_nowhere() -> None:
    error = ConfigError([("spec.model.name", "unknown")])
    reported: list[tuple[str, str]] = []
    # An operator-side command (no report_failure): a status, nothing reported.
    assert dispatch(failing(error)) == CLASS_EXITS[FailureClass.CONFIG_ERROR]
    # The command's own choice wins over the caller's default.
    dispatch(failing(error, report_failure=lambda cls, msg: reported.append(("command", cls))),
             report_failure=lambda cls, msg: reported.append(("caller", cls)))
    dispatch(failing(error), report_failure=lambda cls, msg: reported.append(("caller", cls)))
    assert reported == [("command", FailureClass.CONFIG_ERROR), ("caller", FailureClass.CONFIG_ERROR)]


def test_a_successful_command_returns_its_status_or_zero() -> None:
    assert dispatch(argparse.Namespace(func=lambda _: None)) == 0
    assert dispatch(argparse.Namespace(func=lambda _: 3)) == 3
