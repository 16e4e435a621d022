"""DeepSpeed's CPU Adam built into a cache folder by two processes at once (two ranks, or two pods
on one cache volume): one builds, the other waits for it and only loads; a lock file torch's own
build left behind when it was killed does not make either wait forever."""

import os
import subprocess
import sys
import time

import pytest

from rosetta_trainer.engine import ops_cache

pytestmark = pytest.mark.slow

BUILD = ("import os; from rosetta_trainer.engine.ops_cache import prepare_cpu_adam; "
         "prepare_cpu_adam({'zero_optimization': {'offload_optimizer': {'device': 'cpu'}}, "
         "'optimizer': {'type': 'AdamW'}}); print(os.environ['TORCH_EXTENSIONS_DIR'])")


def test_two_processes_build_cpu_adam_once_and_a_stale_torch_lock_is_cleared(tmp_path):
    cache = tmp_path / "ops"
    folder = cache / ops_cache.machine_key()
    (folder / "cpu_adam").mkdir(parents=True)
    (folder / "cpu_adam" / "lock").touch()  # as a build killed half-way leaves it
    env = {k: v for k, v in os.environ.items() if k != ops_cache.EXTENSIONS_ENV}
    env[ops_cache.CACHE_ENV] = str(cache)
    procs = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    deadline = time.monotonic() + 600
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    finally:
        for proc in procs:
            proc.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all(out.strip().splitlines()[-1] == str(folder) for out in outputs), outputs
    assert (folder / "cpu_adam" / "cpu_adam.so").is_file()
    assert not (folder / "cpu_adam" / "lock").exists()
    # ninja logs each output it built: one link, whichever process came second only loaded it
    log = (folder / "cpu_adam" / ".ninja_log").read_text().splitlines()
    links = [line for line in log if line.split("\t")[3:4] == ["cpu_adam.so"]]
    assert len(links) == 1, links
