"""Run the pods of one JobSet as process groups and apply its failure policy.

As on a cluster, the pods form a gang: when one fails, the others are stopped and the whole
set is started again (a new restart attempt, new pods with new emptyDirs) until `maxRestarts`
is used up, unless its exit code is one the spec fails at once (failurePolicy.actions, through the
launcher's classified exit codes: failure_policies.fail_fast_exit_codes), as the cluster's pod failure policy does; the trainer resumes from its latest checkpoint on the shared volume. Each pod is its own process group. Stopping is SIGTERM
to the launcher first (it forwards it, and the trainer checkpoints on it), then SIGKILL to
the whole group after the grace period, as the kubelet does with a container.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from rosetta_contract.exits import TERMINATION_LOG_ENV
from rosetta_contract.failures import parse_termination_message
from rosetta_operator.local.pods import LocalPod

POLL_SECONDS = 0.2


@dataclass
class Outcome:
    phase: str  # Succeeded, Failed or Stopped
    restarts: int
    exit_codes: dict[str, int] = field(default_factory=dict)  # of the last attempt
    message: str = ""


class _Pod:
    def __init__(self, pod: LocalPod, log_dir: Path, sink: Callable[[str], None], attempt: int):
        self.pod = pod
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(log_dir / f"{pod.name}.log", "a", encoding="utf-8")
        self.log.write(f"--- attempt {attempt}: {' '.join(pod.argv)}\n")
        # The container's /dev/termination-log: where the trainer names why it stopped.
        self.termination_log = log_dir / f"{pod.name}.attempt-{attempt}.termination-log"
        self.termination_log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            pod.argv, env={**os.environ, "PYTHONUNBUFFERED": "1", **pod.env,
                           TERMINATION_LOG_ENV: str(self.termination_log)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, text=True, errors="replace", bufsize=1,
        )
        self.reader = threading.Thread(target=self._pump, args=(sink,), daemon=True)
        self.reader.start()

    def _pump(self, sink: Callable[[str], None]) -> None:
        prefix = f"[{self.pod.name}] "
        assert self.proc.stdout is not None  # started with stdout=PIPE
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.strip():
                sink(prefix + line.rstrip("\n"))

    def why(self) -> str:
        """`pod NAME exited with code N`, and what the trainer said (its termination message)."""
        said = self.termination_log.read_text(errors="replace").strip() if self.termination_log.exists() else ""
        why = f"pod {self.pod.name} exited with code {self.proc.returncode}"
        return f"{why}: {said}" if parse_termination_message(said) else why

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.reader.join(timeout=5)
        self.log.close()


class LocalJobSet:
    """`make_pods(attempt)` builds the pods of each attempt: fresh ports and emptyDirs, the same
    shared volumes (where the checkpoints are, for the new pods to resume from)."""

    def __init__(self, make_pods: Callable[[int], list[LocalPod]], *, max_restarts: int, grace_seconds: float,
                 output: Path, sink: Callable[[str], None] = print, on_tick: Optional[Callable[[], None]] = None,
                 fail_fast_codes: Iterable[int] = ()):
        self.make_pods, self.max_restarts, self.grace = make_pods, max_restarts, grace_seconds
        self.fail_fast_codes = frozenset(fail_fast_codes)
        self.output, self.sink, self.on_tick = output, sink, on_tick
        self._stop_requested: Optional[int] = None

    def request_stop(self, signum: int = signal.SIGINT) -> None:
        self._stop_requested = signum

    def run(self) -> Outcome:
        attempt = 0
        while True:
            pods = [_Pod(p, self.output / "logs", self.sink, attempt) for p in self.make_pods(attempt)]
            self._write_state(attempt, pods)
            failed = self._watch(pods)
            codes = {p.pod.name: p.proc.returncode for p in pods}
            for p in pods:
                p.close()
            if self._stop_requested is not None:
                return Outcome("Stopped", attempt, codes, "stopped by a signal; the trainer checkpointed on SIGTERM")
            if failed is None:
                return Outcome("Succeeded", attempt, codes)
            why = failed.why()
            if failed.proc.returncode in self.fail_fast_codes:
                return Outcome("Failed", attempt, codes, f"{why}; not restarted: failurePolicy.actions fails it at once")
            if attempt >= self.max_restarts:
                return Outcome("Failed", attempt, codes, f"{why}; maxRestarts ({self.max_restarts}) reached")
            attempt += 1
            self.sink(f"[rosetta run] {why}: restarting every pod (restart {attempt} of {self.max_restarts})")

    def _watch(self, pods: list[_Pod]) -> Optional[_Pod]:
        """Wait until all pods succeed (None), one fails (that pod), or a stop is requested."""
        while True:
            if self.on_tick:
                self.on_tick()
            if self._stop_requested is not None:
                self._terminate(pods)
                return None
            failed = next((p for p in pods if p.proc.poll() not in (None, 0)), None)
            if failed is not None:
                self._terminate(pods)
                return failed
            if all(p.proc.poll() == 0 for p in pods):
                return None
            time.sleep(POLL_SECONDS)

    def _terminate(self, pods: list[_Pod]) -> None:
        for p in pods:
            if p.proc.poll() is None:
                # Like the kubelet: SIGTERM to the container's main process only (the launcher
                # forwards it to its workers). Signalling the whole group would also kill the
                # workers' data-loader processes and crash the step the trainer wants to finish.
                p.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.proc.poll() is None for p in pods):
            if self.on_tick:
                self.on_tick()
            time.sleep(POLL_SECONDS)
        for p in pods:
            # The launcher may be gone while a worker of its group still runs: kill the group.
            p.signal(signal.SIGKILL)
            p.proc.wait()

    def _write_state(self, attempt: int, pods: list[_Pod]) -> None:
        # For people (and tests) who want to find or kill a pod's processes.
        state = {"attempt": attempt, "pods": [
            {"name": p.pod.name, "index": p.pod.index, "pid": p.proc.pid, "pgid": p.proc.pid} for p in pods]}
        tmp = self.output / ".pods.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.output / "pods.json")
