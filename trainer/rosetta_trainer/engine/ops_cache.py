"""DeepSpeed's CPU Adam (ZeRO-Offload) compiled once per cache volume and machine type, not per start.

DeepSpeed JIT-compiles CPU Adam the first time a process uses it: three minutes of C++ on a one-CPU
pod (measured), again on every start of every pod, since a pod's HOME is an emptyDir. With a volume
of purpose `cache` the operator sets ROSETTA_OPS_CACHE to a folder on it and the trainer builds
there instead:

- in a sub-folder per machine type (`machine_key`): DeepSpeed compiles with -march=native, so a
  binary built on one CPU model may not run on another node's; the compiler, Python, torch and
  DeepSpeed are in the key too (torch's own check covers only the sources and flags);
- one process at a time, under an flock the kernel releases when its holder dies. torch's own lock
  is a file: a build killed half-way leaves it, and every later load would wait on it forever. Under
  the flock no one else builds, so such a file is stale and is removed. The other ranks wait for the
  one build and then only load it.

A TORCH_EXTENSIONS_DIR in spec.env wins: the trainer then leaves DeepSpeed to build where that says.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import logging
import os
import platform
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from rosetta_trainer.runtime.deepspeed_import import import_deepspeed

log = logging.getLogger(__name__)

CACHE_ENV = "ROSETTA_OPS_CACHE"
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first processor's model and feature flags: what -march=native compiles for."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor()
    first = text.split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")  # x86 and Arm spellings
    return "|".join(f"{key}={fields[name].strip()}" for key in wanted for name in fields if name.strip() == key)


def compiler_version() -> str:
    compiler = shlex.split(os.environ.get("CXX") or "") or [shutil.which("c++") or "c++"]  # CXX may be "ccache g++"
    try:
        return subprocess.run([*compiler, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "none"


def machine_key() -> str:
    import torch

    parts = [platform.machine(), cpu_identity(), compiler_version(), platform.python_version(), torch.__version__,
             importlib.metadata.version("deepspeed")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def use_ops_cache() -> Path | None:
    """Point TORCH_EXTENSIONS_DIR at this machine type's folder of the cache; None without a cache
    or with a TORCH_EXTENSIONS_DIR of the user's."""
    root = os.environ.get(CACHE_ENV)
    if not root or os.environ.get(EXTENSIONS_ENV):
        return None
    folder = Path(root) / machine_key()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[EXTENSIONS_ENV] = str(folder)
    return folder


def build_cpu_adam(folder: Path) -> None:
    """Build (or only load) CPU Adam in `folder`, one process at a time."""
    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("CPUAdamBuilder")  # the accelerator's flavour, as DeepSpeed's
    if builder is None:
        return
    started = time.monotonic()
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        (folder / builder.name / "lock").unlink(missing_ok=True)
        builder.load(verbose=False)
    log.info("DeepSpeed CPU Adam from the ops cache %s: %.0f s waiting for another build, %.0f s building "
             "or loading", folder, waited, time.monotonic() - started - waited)


def prepare_cpu_adam(config: dict[str, Any]) -> None:
    """Before deepspeed.initialize: when its config offloads a DeepSpeed Adam to the CPU and a cache
    is set, build CPU Adam there (DeepSpeed's own load then finds it built).

    A cache that cannot be used (read-only, full, an NFS mount without locks) costs the saving, not
    the run: DeepSpeed then builds in the pod's own folder, as without a cache."""
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device")
    optimizer = str(config.get("optimizer", {}).get("type", "")).lower()
    if offload != "cpu" or optimizer not in ("adam", "adamw"):
        return
    folder = None
    try:
        folder = use_ops_cache()
        if folder is not None:
            build_cpu_adam(folder)
    except OSError as exc:
        if folder is not None:  # set by use_ops_cache: DeepSpeed's default again
            os.environ.pop(EXTENSIONS_ENV, None)
        log.warning("the ops cache %s cannot be used (%s): DeepSpeed builds CPU Adam in the pod's own folder",
                    os.environ.get(CACHE_ENV), exc)
