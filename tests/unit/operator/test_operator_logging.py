"""`rosetta operator --log-level LEVEL --log-format text|json`: what reaches stderr, and in what shape."""

from __future__ import annotations

import io
import json
import logging
from typing import Iterator

import kopf
import pytest

from rosetta_cli.main import build_parser
from rosetta_operator import main

TRAINING = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": "mt", "namespace": "team", "uid": "uid-mt"}}


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """What the handler that `configure_logging` installs writes; the root logger is put back after."""
    root, asyncio_logger = logging.getLogger(), logging.getLogger("asyncio")
    saved = root.handlers[:], root.level, asyncio_logger.handlers[:], asyncio_logger.propagate
    out = io.StringIO()
    yield out
    root.handlers[:], root.level, asyncio_logger.handlers[:], asyncio_logger.propagate = saved


def configure(out: io.StringIO, *argv: str) -> None:
    args = build_parser().parse_args(["operator", *argv])
    main.configure_logging(args.log_level, args.log_format)
    logging.getLogger().handlers[-1].setStream(out)  # type: ignore[attr-defined]


def training_logger() -> logging.LoggerAdapter:
    """The `logger` kopf gives a handler of one training."""
    return kopf.ObjectLogger(body=kopf.Body(TRAINING), settings=kopf.OperatorSettings())


def test_the_defaults_are_info_and_text():
    args = build_parser().parse_args(["operator"])
    assert (args.log_level, args.log_format) == ("info", "text")
    for flag in ("--log-level=verbose", "--log-format=yaml"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["operator", flag])


def test_json_is_one_object_per_line_with_the_training_it_is_about(stderr):
    configure(stderr, "--log-format", "json")
    training_logger().warning("the API refused JobSet mt: exceeded quota: %s", "jobsets")
    logging.getLogger("rosetta_operator.progress_round").info("progress of team/mt: no step yet")

    lines = stderr.getvalue().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert len(lines) == 2
    assert first["level"] == "WARNING" and first["logger"] == "kopf.objects"
    assert first["message"] == "the API refused JobSet mt: exceeded quota: jobsets"
    assert first["time"].endswith("+00:00")
    assert {k: first["object"][k] for k in ("kind", "namespace", "name")} == {
        "kind": "TranslationTraining", "namespace": "team", "name": "mt"}
    assert "settings" not in first and "k8s_skip" not in first  # kopf's internals stay out
    assert (second["level"], second["logger"]) == ("INFO", "rosetta_operator.progress_round")
    assert "object" not in second


def test_a_traceback_stays_on_its_line(stderr):
    configure(stderr, "--log-format=json")
    try:
        raise RuntimeError("apiserver went away")
    except RuntimeError:
        logging.getLogger("rosetta_operator.handlers").exception("progress failed")
    (line,) = stderr.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and "RuntimeError: apiserver went away" in record["exc_info"]


@pytest.mark.parametrize("level, written", [
    ("debug", ["debug", "info", "warning", "error"]),
    ("info", ["info", "warning", "error"]),
    ("warning", ["warning", "error"]),
    ("error", ["error"]),
])
def test_the_level_filters_every_logger(stderr, level, written):
    configure(stderr, "--log-level", level, "--log-format", "json")
    for name in ("debug", "info", "warning", "error"):
        getattr(training_logger(), name)(name)
        getattr(logging.getLogger("rosetta_operator.handlers"), name)(name)
    said = [json.loads(line)["message"] for line in stderr.getvalue().splitlines()]
    assert said == [name for name in written for _ in range(2)]


def test_text_is_kopfs_own_line_with_the_object_in_front(stderr):
    configure(stderr, "--log-level", "warning")
    training_logger().info("created JobSet mt")
    training_logger().warning("invalid spec: spec.nodes: must be at least 1")
    (line,) = stderr.getvalue().splitlines()
    assert line.startswith("[") and "[WARNING ] [team/mt] invalid spec: spec.nodes: must be at least 1" in line


def test_the_operator_command_configures_logging_before_kopf_runs(stderr, monkeypatch):
    ran: list[int] = []
    monkeypatch.setattr(kopf, "run", lambda **_: ran.append(logging.getLogger().level))
    args = build_parser().parse_args(["operator", "--log-level", "error", "--log-format", "json"])
    assert args.func(args) == 0
    assert ran == [logging.ERROR]
    logging.getLogger().handlers[-1].setStream(stderr)  # type: ignore[attr-defined]
    logging.getLogger("rosetta_operator.handlers").error("could not start")
    assert json.loads(stderr.getvalue())["logger"] == "rosetta_operator.handlers"
