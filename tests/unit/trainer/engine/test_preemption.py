"""The stop flag and the grace period: when the signal came, and how much of the grace a stop checkpoint used."""

import logging
import os
import signal

import pytest

from rosetta_contract.spec import parse_training
from rosetta_operator.local.pods import fit_hardware, mount_volumes, plan_pods
from rosetta_operator.render import render
from rosetta_trainer.engine.preemption import GRACE_ENV, WARN_FRACTION, StopRequested, grace_period_from_env
from support.training import SHARED_CHECKPOINTS, TINY, deep_update


class Clock:
    """Seconds the test decides, so that the thresholds are checked exactly."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def signalled(grace, seconds_until_checkpoint: float, signum=signal.SIGTERM) -> StopRequested:
    clock = Clock()
    stop = StopRequested(grace_seconds=grace, clock=clock)
    stop.install()
    try:
        os.kill(os.getpid(), signum)  # a real signal, through the real handler
    finally:
        stop.restore()
    clock.now += seconds_until_checkpoint
    return stop


def test_a_real_sigterm_sets_the_flag_records_when_and_restore_puts_the_old_handler_back(caplog):
    before = signal.getsignal(signal.SIGTERM)
    stop = signalled(grace=30, seconds_until_checkpoint=2.5)
    assert caplog.messages == ["received SIGTERM: stopping at the next step boundary (grace period 30 s)"]
    assert stop.flag is True
    assert stop.signal_name == "SIGTERM"
    assert stop.seconds_since_signal() == pytest.approx(2.5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_grace_period_runs_from_the_first_signal():
    clock = Clock()
    stop = StopRequested(grace_seconds=30, clock=clock)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        clock.now += 10
        os.kill(os.getpid(), signal.SIGINT)  # an impatient second Ctrl-C does not reset the clock
    finally:
        stop.restore()
    clock.now += 1
    assert stop.seconds_since_signal() == pytest.approx(11)
    assert stop.signal_name == "SIGTERM"


def test_remaining_grace_is_the_deadline_left_for_uploads_after_a_stop():
    assert signalled(grace=60, seconds_until_checkpoint=20).remaining_grace(margin=5) == pytest.approx(35)
    assert signalled(grace=10, seconds_until_checkpoint=9).remaining_grace(margin=5) == 0.0
    assert signalled(grace=None, seconds_until_checkpoint=1).remaining_grace() is None
    assert StopRequested(grace_seconds=30).remaining_grace() is None  # no signal: no deadline


def test_a_checkpoint_well_within_the_grace_is_logged_as_info(caplog):
    stop = signalled(grace=30, seconds_until_checkpoint=3.04)
    caplog.clear()  # the handler's own warning
    with caplog.at_level(logging.INFO, logger="rosetta_trainer.engine.preemption"):
        assert stop.checkpoint_written(42) == pytest.approx(3.04)
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == "checkpoint at step 42 written 3.0 s after SIGTERM (grace period 30 s)"


@pytest.mark.parametrize("seconds, share", [(24.0, "80%"), (29.4, "98%")])
def test_a_checkpoint_that_used_most_of_the_grace_warns_and_suggests_more(caplog, seconds, share):
    stop = signalled(grace=30, seconds_until_checkpoint=seconds)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rosetta_trainer.engine.preemption"):
        stop.checkpoint_written(7)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(f"checkpoint at step 7 written {seconds:.1f} s after SIGTERM: {share} of the grace")
    suggested = StopRequested.suggested_grace(seconds)
    assert f"spec.terminationGracePeriodSeconds to at least {suggested}" in message
    assert seconds < WARN_FRACTION * suggested  # the suggestion would not warn again


def test_a_checkpoint_past_the_grace_says_the_pod_would_have_been_killed(caplog):
    stop = signalled(grace=10, seconds_until_checkpoint=12.5, signum=signal.SIGINT)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rosetta_trainer.engine.preemption"):
        stop.checkpoint_written(100)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "checkpoint at step 100 written 12.5 s after SIGINT, 2.5 s past the grace period of 10 s: on a cluster "
        "the pod would have been killed before this checkpoint completed; set "
        "spec.terminationGracePeriodSeconds to at least 16")


def test_without_a_known_grace_it_still_reports_the_time(caplog, monkeypatch):
    monkeypatch.delenv(GRACE_ENV, raising=False)
    stop = signalled(grace=None, seconds_until_checkpoint=1.0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rosetta_trainer.engine.preemption"):
        stop.checkpoint_written(5)
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint at step 5 written 1.0 s after SIGTERM (grace period unknown: {GRACE_ENV} not set)"]


def test_no_signal_no_report(caplog):
    stop = StopRequested(grace_seconds=30)
    with caplog.at_level(logging.DEBUG, logger="rosetta_trainer.engine.preemption"):
        assert stop.checkpoint_written(10) is None
    assert stop.flag is False and caplog.records == []


def test_the_grace_comes_from_the_pod_env(monkeypatch):
    monkeypatch.setenv(GRACE_ENV, "45")
    assert StopRequested().grace == 45.0
    assert StopRequested(grace_seconds=5).grace == 5  # an explicit value wins
    assert grace_period_from_env({}) is None and grace_period_from_env({GRACE_ENV: " "}) is None
    assert grace_period_from_env({GRACE_ENV: "0"}) == 0.0


@pytest.mark.parametrize("raw, expected", [("soon", "a number"), ("-1", "non-negative"), ("nan", "non-negative")])
def test_a_bad_grace_env_is_a_clear_error(raw, expected):
    with pytest.raises(ValueError, match=f"{GRACE_ENV}='{raw}': expected .*{expected}"):
        grace_period_from_env({GRACE_ENV: raw})


@pytest.mark.parametrize("spec_grace, rendered", [(None, "30"), (120, "120"), (0, "0")])
def test_every_pod_is_told_its_grace_period_here_and_on_a_cluster(tmp_path, spec_grace, rendered):
    patch = {"nodes": 2, "volumes": SHARED_CHECKPOINTS}
    if spec_grace is not None:
        patch["terminationGracePeriodSeconds"] = spec_grace
    training = parse_training(deep_update(TINY, {"spec": patch}))
    jobset = render("tiny", "default", training.spec)
    pod = jobset.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    # what the trainer reads, and how long torchrun lets its workers finish before it SIGKILLs them
    assert env[GRACE_ENV] == env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == rendered
    assert pod.get("terminationGracePeriodSeconds") == spec_grace

    mounts = mount_volumes(jobset, tmp_path, {})
    hardware = fit_hardware(2, 0, 1, available_gpus=0)
    for local in plan_pods(jobset, 2, mounts, hardware, master_port=29500, attempt=0, warn=pytest.fail):
        assert local.env[GRACE_ENV] == local.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == rendered
