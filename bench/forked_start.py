"""What forking a trainer from a warm process would save: a tiny training (tests' support.training.TINY,
or any document) started fresh twice, then twice forked from this process once it has imported torch,
transformers and the trainer. Prints wall seconds and the children's CPU seconds of each run.

    python bench/forked_start.py training.yaml OUT_DIR

The case for a test-only fork server (docs/testing.md, "A test trainer forked from a warm process");
this process imports with OMP_NUM_THREADS=1, as the tests' trainers run, and must hold one thread
when it forks.
"""

from __future__ import annotations

import os
import resource
import runpy
import subprocess
import sys
import time


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_argv(config: str, out: str) -> list[str]:
    return ["train", "-f", config, "--output", out, "--no-progress"]


def fresh(config: str, out: str) -> None:
    subprocess.run([sys.executable, "-m", "rosetta_trainer", *train_argv(config, out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


def forked(config: str, out: str) -> None:
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.argv = ["rosetta_trainer", *train_argv(config, out)]
        code = 0
        try:
            runpy.run_module("rosetta_trainer", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the forked training failed ({os.waitstatus_to_exitcode(status)})")


def timed(label: str, run, config: str, out: str) -> None:
    cpu, started = children_cpu(), time.perf_counter()
    run(config, out)
    print(f"{label:<7} {time.perf_counter() - started:5.1f} s wall {children_cpu() - cpu:5.1f} CPU-s", flush=True)


def main() -> None:
    config, out = sys.argv[1], sys.argv[2]
    for i in range(2):
        timed("fresh", fresh, config, f"{out}/fresh-{i}")
    os.environ["OMP_NUM_THREADS"] = "1"
    started = time.perf_counter()
    import rosetta_trainer.checkpoints.deepspeed_checkpoints  # noqa: F401  (the models: transformers)
    import rosetta_trainer.commands.cli  # noqa: F401
    import rosetta_trainer.commands.train  # noqa: F401
    threads = len(os.listdir("/proc/self/task"))
    print(f"warm imports {time.perf_counter() - started:.1f} s, {threads} thread(s)", flush=True)
    if threads != 1:
        raise SystemExit("more than one thread after the imports: forking would not be safe")
    for i in range(2):
        timed("forked", forked, config, f"{out}/forked-{i}")


if __name__ == "__main__":
    main()
