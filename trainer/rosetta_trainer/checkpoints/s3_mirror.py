"""The background mirror of a training's checkpoints to S3 (rank 0's upload thread), and the
resume point of a start: the newest complete checkpoint, fetched from S3 onto an empty node.
The layout and the transfers are in s3_checkpoints.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rosetta_contract.checkpoint_fields import CheckpointSpec, S3MirrorSpec
from rosetta_trainer.checkpoints.checkpoint import (
    MARKER,
    STEP_DIR,
    complete_checkpoints,
)
from rosetta_trainer.checkpoints.s3_checkpoints import fetch_checkpoint, fetch_newest, prune, upload_checkpoint
from rosetta_trainer.runtime.distributed import World, barrier, broadcast_object
from rosetta_trainer.runtime.s3_client import Counters, MirrorError, RetryPolicy, make_client

log = logging.getLogger(__name__)


def resume_point(spec: S3MirrorSpec, root: Path, world: World, policy: RetryPolicy = RetryPolicy()) -> Path | None:
    """Collective. The checkpoint every rank resumes from: rank 0's newest local one, else the
    newest complete one in S3. Each node's local rank 0 downloads it when its own
    directory lacks it (node-local disks), then all ranks meet at a barrier."""
    counters = Counters()
    name = None
    if world.is_main:
        local = complete_checkpoints(root)
        if local:
            name = local[-1].name
        else:
            fetched = fetch_newest(make_client(spec, policy, counters), spec, root, policy, counters)
            name = fetched.name if fetched else None
    name = broadcast_object(world, name)
    if name is not None and world.local_rank == 0 and not world.is_main and not (root / name / MARKER).is_file():
        try:
            fetch_checkpoint(make_client(spec, policy, counters), spec, name, root, policy, counters)
        except MirrorError as exc:
            raise MirrorError(f"rank {world.rank}: {root} lacks {name}, which rank 0 resumes from, and it could "
                              f"not be fetched from {spec.uri}: {exc}") from exc
    barrier(world)
    return root / name if name is not None else None



@dataclass
class _Job:
    name: str
    snapshot: Path
    best: str | None


class Mirror:
    """Uploads checkpoints in a background thread so training never waits for S3.

    `submit` (rank 0, once a checkpoint is complete on disk) hard-links the
    checkpoint into a private snapshot, so local pruning cannot pull files from
    under an upload. While one upload runs, a newer submission replaces an
    older waiting one: S3 gets the newest state, not a backlog. A failed upload
    is logged and recorded, never raised: the next checkpoint tries again.
    `finish` waits for the last one (the final or preemption checkpoint).
    """

    def __init__(self, spec: S3MirrorSpec, root: Path, *, keep: int, keep_best: bool = True,
                 log_path: Path | None = None, policy: RetryPolicy = RetryPolicy()):
        self.spec, self.root, self.keep, self.log_path, self.policy = spec, Path(root), keep, log_path, policy
        self.keep_best = keep_best
        self.counters = Counters()
        self.client = make_client(spec, policy, self.counters)
        self.uploaded: list[int] = []
        self.failed: list[dict[str, Any]] = []
        self.skipped: list[int] = []
        self.upload_seconds = 0.0
        self.upload_bytes = 0
        self._pending: _Job | None = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        for leftover in self.root.glob(".mirror-step-*"):  # snapshots of a killed process
            shutil.rmtree(leftover, ignore_errors=True)
        self._thread = threading.Thread(target=self._work, name="s3-mirror", daemon=True)
        self._thread.start()

    def submit(self, checkpoint: Path) -> None:
        checkpoint = Path(checkpoint)
        job = _Job(checkpoint.name, _snapshot(checkpoint), _best_name(checkpoint.parent))
        with self._cond:
            if self._closed:
                raise RuntimeError("s3 mirror: submit after finish")
            if self._pending is not None:
                self.skipped.append(_step(self._pending.name))
                shutil.rmtree(self._pending.snapshot, ignore_errors=True)
                log.warning("s3 mirror: %s superseded by %s before its upload started",
                            self._pending.name, job.name)
            self._pending = job
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or uploading; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def finish(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the queued upload, stop the thread; the summary of everything mirrored."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        summary = self.summary()
        if self._thread.is_alive():
            summary["unfinished"] = True
            log.error("s3 mirror: upload still running after %.0fs; S3 keeps its last complete checkpoint",
                      timeout)
        return summary

    def summary(self) -> dict[str, Any]:
        return {"uri": self.spec.uri, "uploaded": list(self.uploaded), "failed": list(self.failed),
                "skipped": list(self.skipped), "last_uploaded_step": self.uploaded[-1] if self.uploaded else None,
                "retries": self.counters.as_dict(), "upload_seconds": round(self.upload_seconds, 3),
                "upload_bytes": self.upload_bytes}

    def _work(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                job, self._pending, self._busy = self._pending, None, True
            try:
                self._mirror(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _mirror(self, job: _Job) -> None:
        step = _step(job.name)
        before = self.counters.as_dict()
        record: dict[str, Any] = {"step": step, "uri": f"{self.spec.uri.rstrip('/')}/{job.name}/"}
        try:
            record.update(upload_checkpoint(self.client, self.spec, job.snapshot, job.name, self.policy,
                                            self.counters))
            record["ok"] = True
            try:
                record["pruned"] = prune(self.client, self.spec, self.keep, job.best, self.policy, self.counters,
                                         keep_best=self.keep_best)
            except MirrorError as exc:  # the upload stands; the next prune catches up
                record["prune_error"] = str(exc)
                log.error("s3 mirror: pruning after %s failed: %s", job.name, exc)
            self.uploaded.append(step)
            self.upload_seconds += record["seconds"]
            self.upload_bytes += record["bytes"]
            log.info("s3 mirror: %s uploaded (%d files, %.1f MB, %.1fs)", record["uri"], record["files"],
                     record["bytes"] / 1e6, record["seconds"])
        except Exception as exc:  # noqa: BLE001 - a failed mirror must not stop training
            record.update(ok=False, error=str(exc))
            self.failed.append({"step": step, "error": str(exc)})
            log.error("s3 mirror: %s not mirrored, the next checkpoint tries again: %s", job.name, exc)
        finally:
            shutil.rmtree(job.snapshot, ignore_errors=True)
        after = self.counters.as_dict()
        record["retries"] = {k: after[k] - before[k] for k in after}
        if self.log_path is not None:
            with self.log_path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")


def _step(name: str) -> int:
    return int(cast("re.Match[str]", STEP_DIR.match(name)).group(1))  # step-N names only


def _snapshot(checkpoint: Path) -> Path:
    """A private copy of the tree: hard links (free; checkpoint files are never rewritten in
    place), or a real copy on filesystems without them."""
    dest = checkpoint.parent / f".mirror-{checkpoint.name}"
    shutil.rmtree(dest, ignore_errors=True)
    try:
        shutil.copytree(checkpoint, dest, copy_function=os.link)
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(checkpoint, dest)
    return dest


def _best_name(root: Path) -> str | None:
    try:
        name: str | None = json.loads((root / "best.json").read_text()).get("path")
        return name
    except (OSError, ValueError):
        return None


def start(spec: CheckpointSpec, root: Path, world: World, output: Path) -> Mirror | None:
    """The run's mirror (rank 0 only), or None when spec.checkpoint.s3 is not set."""
    if spec.s3 is None or not world.is_main:
        return None
    return Mirror(spec.s3, root, keep=spec.s3.keep or spec.keep, keep_best=spec.keep_best,
                  log_path=output / "s3-mirror.jsonl")
