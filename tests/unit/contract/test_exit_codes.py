"""One table maps errors to exit statuses for `rosetta` and for a pod's `python -m rosetta_trainer`."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from rosetta_contract.exits import (
    COLLECTIVE_TIMEOUT_EXIT,
    CONFIG_EXIT,
    DATA_INVALID_EXIT,
    ERROR_EXITS,
    exit_status,
)
from rosetta_contract.failures import EXIT_CLASSES


@pytest.mark.parametrize("module, name, status", ERROR_EXITS, ids=[f"{m}.{n}" for m, n, _ in ERROR_EXITS])
def test_every_row_names_a_real_exception_class(module, name, status):
    cls = getattr(importlib.import_module(module), name, None)
    assert isinstance(cls, type) and issubclass(cls, Exception), f"{module}.{name} is not an exception class"
    assert status in EXIT_CLASSES  # each status is a failure class a pod reports (rosetta_contract.failures)


def test_an_error_gets_its_row_a_subclass_its_parents_and_anything_else_none():
    from rosetta_contract.strict_model import ConfigError
    from rosetta_operator.policy import PolicyViolation
    from rosetta_trainer.data.examples import DataError

    assert exit_status(ConfigError([("spec.nodes", "must be at least 1")])) == CONFIG_EXIT
    assert exit_status(PolicyViolation([("spec.image", "not allowed")])) == CONFIG_EXIT
    assert exit_status(DataError("x")) == DATA_INVALID_EXIT
    assert exit_status(ValueError("x")) is None  # a bug: its traceback is shown
    assert exit_status(KeyboardInterrupt()) is None


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)


def test_the_pods_entry_point_has_the_trainers_commands_and_the_same_exit_status(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: rosetta.dev/v1alpha1\nkind: TranslationTraining\nmetadata: {name: bad}\n"
                   "spec: {training: {maxSteps: -1}}\n")
    pod = run("-m", "rosetta_trainer", "train", "-f", str(bad))
    assert pod.returncode == CONFIG_EXIT
    assert pod.stderr.startswith("error: ") and "maxSteps" in pod.stderr and "Traceback" not in pod.stderr
    user = run("-m", "rosetta_cli", "train", "-f", str(bad))
    assert (user.returncode, user.stderr) == (pod.returncode, pod.stderr)

    # The operator's commands are not the pod's.
    not_the_pods = run("-m", "rosetta_trainer", "crd")
    assert not_the_pods.returncode == 2 and "invalid choice: 'crd'" in not_the_pods.stderr
    assert run("-m", "rosetta_cli", "crd").stdout.startswith("apiVersion: apiextensions.k8s.io/v1")


# ------------------------------------------------------------------------ a collective that times out

# Two gloo ranks in one process (threads), rank 1 never joining rank 0's all-reduce: torch's own
# error, not one written to look like it. A subprocess, because gloo's threads abort the interpreter
# at exit.
GLOO_TIMEOUT = """
import datetime, os, threading
import torch, torch.distributed as dist
from rosetta_contract.exits import exit_status
from rosetta_trainer.runtime.distributed import collective_timeout
store, groups = dist.HashStore(), {}
def join(rank):
    groups[rank] = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=1))
threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
[t.start() for t in threads]
[t.join() for t in threads]
try:
    groups[0].allreduce([torch.ones(1)]).wait()
except RuntimeError as exc:
    mapped = collective_timeout(exc)
    print(type(exc).__name__, type(mapped).__name__, exit_status(mapped), flush=True)
    print(mapped, flush=True)
os._exit(0)
"""


def test_a_real_gloo_timeout_is_a_collective_timeout():
    got = run("-c", GLOO_TIMEOUT)
    first, _, message = got.stdout.partition("\n")
    assert first == f"RuntimeError CollectiveTimeout {COLLECTIVE_TIMEOUT_EXIT}", got.stdout + got.stderr
    assert "collectiveTimeoutSeconds" in message and "Timed out waiting 1000ms for recv operation" in message


@pytest.mark.parametrize("error, timed_out", [
    # NCCL's watchdog report, as the main thread gets it under TORCH_NCCL_ASYNC_ERROR_HANDLING=2.
    ("DistBackendError", "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
                         "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."),
    ("DistBackendError", "NCCL communicator was aborted on rank 1. Original reason for failure was: [Rank 1] "
                         "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST)"),
    ("DistStoreError", "wait timeout after 1800000ms, keys: /default_pg/0//cuda//0"),
    ("RuntimeError", "Application timeout caused pair closure"),
])
def test_torchs_timeout_errors_map_to_collective_timeout(error, timed_out):
    import torch.distributed as dist

    from rosetta_trainer.runtime.distributed import CollectiveTimeout, collective_timeout

    exc = getattr(dist, error, RuntimeError)(timed_out)
    assert isinstance(collective_timeout(exc), CollectiveTimeout)
    wrapped = RuntimeError("step 12 failed")
    wrapped.__cause__ = exc
    assert exit_status(collective_timeout(wrapped)) == COLLECTIVE_TIMEOUT_EXIT


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("DataLoader timed out after 30 seconds"),       # not a collective: a bug to show
    ValueError("Timed out waiting 5ms for recv operation"),      # not torch's type
])
def test_other_errors_are_not_collective_timeouts(exc):
    import torch.distributed as dist

    from rosetta_trainer.runtime.distributed import collective_timeout

    assert collective_timeout(exc) is None
    assert collective_timeout(dist.DistBackendError("NCCL error: unhandled system error, remote process exited")) is None


def test_the_train_command_exits_75_on_a_collective_timeout(monkeypatch, capsys):
    from rosetta_contract.command_dispatch import dispatch
    from rosetta_trainer.commands import train as trainer_main
    from rosetta_trainer.commands.cli import build_parser

    def hung(*_, **__):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                           "1800000ms for recv operation to complete")

    monkeypatch.setattr(trainer_main, "train_from_file", hung)
    assert dispatch(build_parser().parse_args(["train", "-f", "x.yaml"])) == COLLECTIVE_TIMEOUT_EXIT
    assert capsys.readouterr().err.startswith("error: a collective operation timed out")

    def broken(*_, **__):
        raise RuntimeError("something else")

    monkeypatch.setattr(trainer_main, "train_from_file", broken)
    with pytest.raises(RuntimeError, match="something else"):  # a bug keeps its traceback
        dispatch(build_parser().parse_args(["train", "-f", "x.yaml"]))
