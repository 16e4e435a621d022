"""model.source and data.source: copy a model or corpora into a shared directory once, before training.

On a cluster this runs as the JobSet's `stage` job, which the gang depends on, so that the GPUs are
not held while weights download and no training pod needs the hub or S3. `rosetta run` calls it
before training. A copy is complete or absent: files land in a sibling directory, which is renamed
to `path` only when every file is there, with a marker that names the source; a later run (a gang
restart, a second training on the same volume) finds the marker and copies nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from rosetta_contract.config import TrainerSpec
from rosetta_contract.staging_fields import StagingSpec
from rosetta_trainer.data.examples import DataError

if TYPE_CHECKING:
    from rosetta_trainer.runtime.s3_client import RetryPolicy

log = logging.getLogger(__name__)

MARKER = ".rosetta-staged.json"


class StagingError(DataError):
    """The source cannot be copied as asked (missing, empty, refused): retrying will not help, so it
    ends the training as a data error does (the DataInvalid condition), not with a restart."""


def staged_from(path: Path) -> str | None:
    """The uri `path` was staged from, or None."""
    try:
        uri: str | None = json.loads((path / MARKER).read_text()).get("uri")
        return uri
    except (OSError, ValueError, AttributeError):
        return None


def stage_all(spec: TrainerSpec) -> list[dict[str, Any]]:
    """Stage every source of the spec; one summary per source."""
    return [stage(source, what) for what, source in spec.staging_sources()]


def stage(source: StagingSpec, what: str = "data", policy: RetryPolicy | None = None) -> dict[str, Any]:
    """Copy `source.uri` into `source.path` unless it is already there. `policy`: the S3 retries
    (s3_client.RetryPolicy; the mirror's by default)."""
    # Validation sets it: data.source requires one, model.source's is model.name.
    dest = Path(cast(str, source.path))
    previous = staged_from(dest)
    if previous == source.uri:
        log.info("%s: %s is already staged from %s", what, dest, source.uri)
        return {"what": what, "uri": source.uri, "path": str(dest), "copied": False}
    if dest.exists() and any(dest.iterdir()):
        where = f"from {previous}" if previous else "by someone else"
        raise StagingError(f"{what}.source: {dest} already holds files (staged {where}); empty it or "
                           f"choose another path for {source.uri}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.staging-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.monotonic()
    try:
        files = _copy_s3(source, partial, policy) if source.scheme == "s3" else _copy_hub(source, partial)
        size = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file())
        (partial / MARKER).write_text(json.dumps({"uri": source.uri, "files": files, "bytes": size}))
        if dest.exists():
            dest.rmdir()  # empty (checked above): a mount point's child, or left by a crashed copy
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    seconds = time.monotonic() - started
    log.info("%s: staged %s into %s (%d files, %.1f MB, %.1fs)", what, source.uri, dest, files, size / 1e6, seconds)
    return {"what": what, "uri": source.uri, "path": str(dest), "copied": True, "files": files, "bytes": size}


# ------------------------------------------------------------------------------- S3


def _copy_s3(source: StagingSpec, into: Path, policy: RetryPolicy | None = None) -> int:
    from rosetta_trainer.runtime import s3_client  # boto3 (the [s3] extra): only an s3:// source needs it

    bucket, _, prefix = source.uri[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    policy, counters = policy or s3_client.RetryPolicy(), s3_client.Counters()
    client = s3_client.make_client(source, policy)  # endpointUrl and region; credentials from the AWS chain
    try:
        keys = s3_client.with_retries(f"listing {source.uri}", lambda: s3_client.list_keys(
            client, bucket, f"{prefix}/" if prefix else ""), policy, counters)
        keys = [k for k in keys if not k.endswith("/")]  # "folders" that consoles make
        if not keys:
            raise StagingError(f"{source.uri}: no objects under this prefix")
        for key in keys:
            rel = PurePosixPath(key[len(prefix):].lstrip("/") if prefix else key)
            if not rel.parts or ".." in rel.parts:
                raise StagingError(f"{source.uri}: object key {key!r} does not fit below {source.path}")
            target = into.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            def download(key: str = key, target: Path = target) -> None:
                client.download_file(bucket, key, str(target))
            s3_client.with_retries(f"s3://{bucket}/{key}", download, policy, counters)
    except s3_client.MirrorError as exc:
        if exc.__cause__ is not None and s3_client.retryable(exc.__cause__):
            raise  # still failing after the retries: the stage job's own retry may get through
        raise StagingError(str(exc)) from None  # refused (no bucket, no access): the same next time
    return len(keys)


# ------------------------------------------------------------------------------ hub


def _copy_hub(source: StagingSpec, into: Path) -> int:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    repo, _, revision = source.uri[len("hf://"):].partition("@")
    repo_type = "model"
    if repo.startswith("datasets/"):
        repo, repo_type = repo[len("datasets/"):], "dataset"
    try:
        # HF_ENDPOINT read now, not when huggingface_hub was first imported: a mirror or proxy of the
        # hub set in spec.env reaches the stage pod's environment either way, but not always first.
        snapshot_download(repo_id=repo, repo_type=repo_type, revision=revision or None, local_dir=str(into),
                          endpoint=os.environ.get("HF_ENDPOINT") or None)
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as exc:
        raise StagingError(f"{source.uri}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    shutil.rmtree(into / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
    return sum(1 for f in into.rglob("*") if f.is_file())


