"""One table maps errors to exit statuses for `rosetta` and for a pod's `python -m rosetta_trainer`."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from rosetta_contract.exits import CONFIG_EXIT, DATA_INVALID_EXIT, ERROR_EXITS, NON_FINITE_EXIT, exit_status


@pytest.mark.parametrize("module, name, status", ERROR_EXITS, ids=[f"{m}.{n}" for m, n, _ in ERROR_EXITS])
def test_every_row_names_a_real_exception_class(module, name, status):
    cls = getattr(importlib.import_module(module), name, None)
    assert isinstance(cls, type) and issubclass(cls, Exception), f"{module}.{name} is not an exception class"
    assert status in (CONFIG_EXIT, DATA_INVALID_EXIT, NON_FINITE_EXIT)


def test_an_error_gets_its_row_a_subclass_its_parents_and_anything_else_none():
    from rosetta_contract.strict_model import ConfigError
    from rosetta_operator.policy import PolicyViolation
    from rosetta_trainer.data import DataError

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
