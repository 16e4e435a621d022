"""Atomic checkpoints: keep the latest k plus the best by validation BLEU, resume from the newest.

A checkpoint is written into a hidden temporary directory and renamed into
place only when every file is on disk, with a COMPLETE marker written last.
Readers only ever look at directories named `step-NNNNNNNN` that hold the
marker, so a crash mid-write (or a half-copied directory) is never resumed from.

Every rank writes into the temporary directory (its RNG state; under DeepSpeed its ZeRO shards)
and every rank resumes from the checkpoint, so ranks on several nodes need the checkpoint
directory on storage they all mount; `check_shared` verifies that at start.

Layout of one checkpoint:
    step-00001000/
        model/            save_pretrained() weights and config (DeepSpeed: the config only)
        deepspeed/        DeepSpeed backend only: ZeRO shards of weights and optimizer, per rank
        tokenizer/
        trainer_state.pt  optimizer, scheduler, step and data position
        rng/rank-N.pt     each rank's RNG state (dropout differs per rank)
        training.yaml     the document the run was started with (spec.dump_training; earlier versions: as read)
        meta.json         step, epoch, validation BLEU, world size
        COMPLETE
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence, TypeVar, cast

import numpy as np
import torch
from torch.serialization import MAP_LOCATION
from torch.types import FileLike

from rosetta_trainer.runtime.distributed import World, all_gather_objects, barrier, broadcast_object
from rosetta_trainer.runtime.durable_files import fsync_dir, fsync_tree

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")

STEP_DIR = re.compile(r"^step-(\d{8})$")
MARKER = "COMPLETE"
# check_shared's probe: rank 0 writes one (named after a token of this run), every rank looks for it.
SHARED_PROBE_PREFIX = ".shared-probe-"
SHARED_PROBE_WAIT_S = 3.0  # a network file system may show a new file to other nodes a moment later


class SharedStorageError(RuntimeError):
    """The checkpoint directory is not one directory for every rank (each node has its own)."""


def check_shared(root: Path, world: World) -> None:
    """Collective: make sure every rank sees the same checkpoint directory when the ranks run on
    more than one node; raises SharedStorageError, on every rank, naming the directory if not.

    Rank 0 writes a probe file named after a random token it sends to every rank; each rank looks
    for it; all learn who saw it; rank 0 removes it. On one node there is nothing to check.
    """
    if not world.spans_nodes:
        return
    token = cast(str, broadcast_object(world, secrets.token_hex(16) if world.is_main else None))  # rank 0's
    probe = root / f"{SHARED_PROBE_PREFIX}{token}"
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{SHARED_PROBE_PREFIX}*"):  # of a run killed while checking
            stale.unlink(missing_ok=True)
        probe.write_text(token)
    barrier(world)
    deadline = time.monotonic() + SHARED_PROBE_WAIT_S
    while not (seen := _holds(probe, token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    views = all_gather_objects(world, (seen, socket.gethostname(), str(root)))
    if world.is_main:
        probe.unlink(missing_ok=True)
    _, main_host, main_root = views[0]
    blind = [f"{rank} (on {host}{'' if path == main_root else f', looking in {path}'})"
             for rank, (ok, host, path) in enumerate(views) if not ok]
    if blind:
        raise SharedStorageError(
            f"the checkpoint directory {main_root} is not shared between the nodes: rank 0 (on {main_host}) wrote "
            f"{probe.name} into it, and rank{'s' * (len(blind) > 1)} {', '.join(blind)} cannot see it there. "
            "Every rank writes into each checkpoint and resumes from it, so with ranks on more than one node "
            "the checkpoint directory (spec.checkpoint.dir, default <output>/checkpoints) must be on storage "
            "every node mounts: a ReadWriteMany volume (EFS, Filestore, NFS)")


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = STEP_DIR.match(child.name)
        # meta.json too: a checkpoint half-deleted by an older version kept its marker.
        if m and child.is_dir() and (child / MARKER).is_file() and (child / "meta.json").is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (a checkpoint's size on disk, for the metrics)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                pass  # pruned while we counted
    return total


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def best_by_score(candidates: Iterable[tuple[float | None, str, T]]) -> T | None:
    """The item of the best-scoring (score, step directory name, item), skipping unscored ones;
    None when none has a score. Ties go to the earlier step: a later checkpoint must be
    strictly better (the same rule here and for the copies in S3)."""
    scored = [(score, -int(cast("re.Match[str]", STEP_DIR.match(name)).group(1)), i, item)  # step-N names
              for i, (score, name, item) in enumerate(candidates) if score is not None]
    return max(scored)[3] if scored else None


def read_meta(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / "meta.json").read_text())
    return meta


def checkpoint_score(meta: dict[str, Any]) -> float | None:
    """The validation score of the primary metric a checkpoint was saved with ("metric" names it);
    checkpoints of earlier versions call it "bleu", whatever the metric."""
    return meta["score"] if "score" in meta else meta.get("bleu")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ModelSaver(Protocol):
    """What writes a checkpoint's weights: the engine's backends (DDP, DeepSpeed)."""

    def save_model(self, directory: Path) -> None: ...


class CheckpointManager:
    def __init__(self, root: Path, world: World, keep: int = 3, keep_best: bool = True,
                 on_complete: Callable[[Path], None] | None = None) -> None:
        self.root, self.world, self.keep, self.keep_best = Path(root), world, keep, keep_best
        # Rank 0 calls it with each checkpoint once complete on disk (the S3 mirror's hook).
        self.on_complete = on_complete

    def save(self, *, step: int, backend: ModelSaver, tokenizer: PreTrainedTokenizerBase, trainer_state: dict[str, Any],
             document_yaml: str, meta: dict[str, Any]) -> Path:
        """Collective: every rank must call it. Returns the final directory.

        `backend.save_model(tmp)` writes the weights: Hugging Face files from rank 0 (DDP), or
        DeepSpeed's per-rank shards plus the model config (ZeRO).
        """
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        if self.world.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crashed save
            (tmp / "rng").mkdir(parents=True)
        barrier(self.world)
        torch.save(rng_state(), tmp / "rng" / f"rank-{self.world.rank}.pt")
        backend.save_model(tmp)
        barrier(self.world)
        if self.world.is_main:
            tokenizer.save_pretrained(tmp / "tokenizer")
            torch.save(trainer_state, tmp / "trainer_state.pt")
            (tmp / "training.yaml").write_text(document_yaml)
            (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "world_size": self.world.size}, indent=2))
            fsync_tree(tmp)
            (tmp / MARKER).write_text("")
            fsync_tree(tmp)
            if final.exists():  # re-saving a step (e.g. the final save after an interval save)
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.root)
            self._prune()
            if self.on_complete is not None:
                self.on_complete(final)
        barrier(self.world)
        return final

    def best(self) -> Path | None:
        """The complete checkpoint with the highest validation score, if any has one."""
        return best_by_score((checkpoint_score(read_meta(p)), p.name, p) for p in complete_checkpoints(self.root))

    def _prune(self) -> None:
        found = complete_checkpoints(self.root)
        protected = set(found[-self.keep:])
        best = self.best() if self.keep_best else None
        if best is not None:
            protected.add(best)
            (self.root / "best.json").write_text(json.dumps(
                {"path": best.name, **{k: v for k, v in read_meta(best).items() if k in ("step", "score", "metric")},
                 "score": checkpoint_score(read_meta(best))}
            ))
        for path in found:
            if path not in protected:
                # Marker first: rmtree's order is the directory's, and a kill mid-delete must not
                # leave a "complete" checkpoint with files missing.
                (path / MARKER).unlink(missing_ok=True)
                fsync_dir(path)
                shutil.rmtree(path, ignore_errors=True)


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that asks to run code when loaded: refused, never unpickled."""


# Besides tensors and Python's plain types, a checkpoint's pickles hold one kind of object: the
# uint32 array of numpy's RNG state. These rebuild arrays and nothing else.
# numpy's stubs leave out its private _core, where the pickles name _reconstruct.
NUMPY_ARRAY_GLOBALS = [np.ndarray, np.dtype, np._core.multiarray._reconstruct,  # type: ignore[attr-defined]
                       type(np.dtype(np.uint32))]


def load_state_file(path: FileLike, map_location: MAP_LOCATION = None, *,
                    allowed: Sequence[Callable[..., Any] | tuple[Callable[..., Any], str]] = (),
                    **load_args: Any) -> Any:
    """torch.load that runs no code from the file (weights_only, numpy arrays and the `allowed`
    classes permitted): whoever can write the shared claim or the S3 prefix must not run code in
    every training pod. A pickle that asks for anything else is refused with UnsafeCheckpointError,
    naming the file. `load_args` are torch.load's (mmap)."""
    with torch.serialization.safe_globals([*NUMPY_ARRAY_GLOBALS, *allowed]):
        try:
            # torch.serialization.load, not torch.load: deepspeed_backend points torch.load here
            # while DeepSpeed reads a checkpoint.
            return torch.serialization.load(path, map_location=map_location, weights_only=True, **load_args)
        except pickle.UnpicklingError as exc:
            asked = re.search(r"(?i)unsupported global[^\n]*|got <[^>]*>", str(exc))
            what = asked.group()[:300] if asked else type(exc).__name__
            raise UnsafeCheckpointError(f"{path} holds objects a checkpoint never has (refused, not run): {what}") from None


def load_trainer_state(path: Path, world: World) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(trainer state, this rank's RNG state or None when the world size changed)."""
    state = load_state_file(path / "trainer_state.pt", map_location=world.device)
    rng_file = path / "rng" / f"rank-{world.rank}.pt"
    rng = load_state_file(rng_file) if rng_file.exists() else None
    return state, rng
