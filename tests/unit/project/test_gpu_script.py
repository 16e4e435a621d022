"""bench/gpu_checks.py on a machine where the repository is not installed: a GPU machine's Python has
only the third-party packages, so every process the script starts must find the sources through the
environment it is given. The CPU rehearsal (tests/training/test_gpu_checks.py) cannot show this: it
runs in the installed checkout."""

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpu_checks():
    spec = importlib.util.spec_from_file_location("gpu_checks", ROOT / "bench" / "gpu_checks.py")
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the module puts the sources first for its own process
    return module


def test_a_step_finds_every_package_without_the_install(gpu_checks):
    env = gpu_checks.child_environment()
    # -S: no site-packages processing, so the editable install's path hook is not loaded; the
    # third-party packages stay reachable as a plain folder, as a GPU machine's site-packages are.
    env["PYTHONPATH"] += ":" + sysconfig.get_paths()["purelib"]
    code = ("import rosetta_contract, rosetta_operator, rosetta_trainer, rosetta_cli, rosetta_trainer.__main__; "
            "print(*(m.__file__ for m in (rosetta_contract, rosetta_operator, rosetta_trainer, rosetta_cli)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(path.startswith(str(ROOT)) for path in out.stdout.split())


def test_the_sources_come_before_what_the_caller_put_on_the_path(gpu_checks, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    path = gpu_checks.child_environment()["PYTHONPATH"].split(":")
    assert path[-1] == "/tmp/site"
    assert set(path[:-1]) == {str(ROOT / d) for d in ("cli", "contract", "operator", "trainer")}
