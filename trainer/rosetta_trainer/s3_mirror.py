"""Mirror complete checkpoints to S3, and fetch the newest one back onto an empty node.

A node's disk (an emptyDir, a local SSD) dies with the node; the S3 copy lets the
next attempt resume anyway. The S3 side follows the local rules of checkpoint.py:
only a step prefix holding a COMPLETE object counts, COMPLETE is written last
on upload and deleted first on prune or re-upload, so a crash or a kill at any
moment leaves S3 with nothing but complete checkpoints and ignorable debris.

Layout under s3://bucket/prefix/:
    step-00001000/<every file of the local checkpoint, same relative paths>
    step-00001000/MANIFEST.json   size and sha256 of each file
    step-00001000/COMPLETE        the manifest's sha256; written after every object was verified

A checkpoint is an opaque directory tree here (DDP files, DeepSpeed shards alike).
One writer per prefix: the rank 0 of one run. Credentials come from the standard
AWS chain (env, IRSA, instance profile); the operator fills the env from a Secret.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import botocore.exceptions as boto_errors
from boto3.exceptions import S3UploadFailedError

from rosetta_contract.config import CheckpointSpec, S3MirrorSpec
from rosetta_trainer.checkpoint import (
    MARKER,
    STEP_DIR,
    _fsync_dir,
    _fsync_tree,
    best_by_score,
    complete_checkpoints,
    read_meta,
)
from rosetta_trainer.distributed import World, barrier, broadcast_object

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
# Below this a file is one PutObject, so S3's own SHA-256 of it must equal ours.
MULTIPART_THRESHOLD = 64 * 2**20
# Error codes no retry can fix: fail the checkpoint at once with the store's own words.
PERMANENT_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
    "ExpiredToken", "NoSuchBucket", "InvalidBucketName", "InvalidObjectState",
})


class MirrorError(RuntimeError):
    """S3 could not be read or written, retries included."""


class IntegrityError(MirrorError):
    """An object's bytes differ from its manifest: never resume from that checkpoint."""


class VerifyError(MirrorError):
    """An object just uploaded does not read back as written; uploading it again may fix it."""


@dataclass(frozen=True)
class RetryPolicy:
    """Two layers: botocore retries each HTTP request (`http_attempts`, its own backoff);
    we retry each whole object (`attempts`) with exponential backoff and jitter."""

    attempts: int = 5
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    http_attempts: int = 3
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)


@dataclass
class Counters:
    """Retries seen: `http` by botocore inside one call, `object` by our loop around a call."""

    http: int = 0
    object: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, n: int = 1) -> None:
        if n:
            with self.lock:
                setattr(self, kind, getattr(self, kind) + n)

    def as_dict(self) -> dict:
        return {"http": self.http, "object": self.object}


def make_client(spec: S3MirrorSpec, policy: RetryPolicy = RetryPolicy(), counters: Counters | None = None):
    import boto3
    from botocore.config import Config

    options = dict(retries={"mode": "standard", "total_max_attempts": policy.http_attempts},
                   connect_timeout=policy.connect_timeout_s, read_timeout=policy.read_timeout_s)
    if spec.endpoint_url:
        # S3-compatible stores rarely serve virtual-hosted bucket names.
        options["s3"] = {"addressing_style": "path"}
    client = boto3.session.Session().client("s3", endpoint_url=spec.endpoint_url, region_name=spec.region,
                                            config=Config(**options))
    if counters is not None:
        def count(request=None, **_):  # once per HTTP attempt; botocore numbers them from 1
            if getattr(request, "context", {}).get("retries", {}).get("attempt", 1) > 1:
                counters.add("http")
        client.meta.events.register("request-created.s3", count)
    return client


def _transfer_config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD,
                          max_concurrency=4)


def _root_cause(exc: BaseException) -> BaseException:
    # upload_file wraps ClientError in S3UploadFailedError; s3transfer's
    # RetriesExceededError keeps the last error in `last_exception`.
    inner = getattr(exc, "last_exception", None)
    if inner is not None:
        return inner
    if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
        return exc.__context__
    return exc


def retryable(exc: BaseException) -> bool:
    exc = _root_cause(exc)
    if isinstance(exc, VerifyError):
        return True
    if isinstance(exc, boto_errors.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if code in PERMANENT_CODES:
            return False
        return status >= 500 or status in (408, 429) or code in ("RequestTimeout", "SlowDown", "Throttling")
    return isinstance(exc, (boto_errors.HTTPClientError, boto_errors.ConnectionError,
                            boto_errors.IncompleteReadError, boto_errors.ChecksumError))


def with_retries(what: str, fn, policy: RetryPolicy, counters: Counters):
    """fn(), retried with backoff on 5xx/throttling/connection errors; MirrorError naming `what` at the end."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if not retryable(exc):
                raise MirrorError(f"{what}: {_root_cause(exc)}") from exc
            if attempt == policy.attempts:
                raise MirrorError(f"{what}: still failing after {policy.attempts} attempts: {_root_cause(exc)}") from exc
            counters.add("object")
            delay = policy.delay(attempt)
            log.warning("%s: %s; retry %d/%d in %.1fs", what, _root_cause(exc), attempt, policy.attempts - 1, delay)
            time.sleep(delay)


def _not_found(exc: BaseException) -> bool:
    exc = _root_cause(exc)
    return isinstance(exc, boto_errors.ClientError) and \
        exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


# --------------------------------------------------------------------- layout


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(4 * 2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_of(checkpoint: Path) -> dict:
    """{relative path: {size, sha256}} of every file but the local COMPLETE marker."""
    files = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        rel = path.relative_to(checkpoint).as_posix()
        if rel != MARKER:
            files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


class Keys:
    """Object keys of one mirror prefix."""

    def __init__(self, spec: S3MirrorSpec):
        self.bucket, self.base = spec.bucket, f"{spec.prefix}/" if spec.prefix else ""

    def step(self, name: str) -> str:
        return f"{self.base}{name}/"

    def file(self, name: str, rel: str) -> str:
        return f"{self.base}{name}/{rel}"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


def _list_keys(client, bucket: str, prefix: str) -> list[str]:
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [obj["Key"] for obj in page.get("Contents", [])]
    return keys


def list_checkpoints(client, spec: S3MirrorSpec, policy: RetryPolicy, counters: Counters) -> list[tuple[str, bool]]:
    """(step dir name, has COMPLETE) of every step prefix in S3, oldest first."""
    keys = Keys(spec)

    def step_names():
        names = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=keys.bucket, Prefix=keys.base,
                                                                      Delimiter="/"):
            names += [p["Prefix"][len(keys.base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(n for n in names if STEP_DIR.match(n))

    def has_marker(name):
        try:
            client.head_object(Bucket=keys.bucket, Key=keys.file(name, MARKER))
            return True
        except boto_errors.ClientError as exc:
            if _not_found(exc):
                return False
            raise

    names = with_retries(f"list {keys.url(keys.base)}", step_names, policy, counters)
    return [(n, with_retries(f"check {keys.url(keys.file(n, MARKER))}", lambda n=n: has_marker(n), policy, counters))
            for n in names]


# --------------------------------------------------------------------- upload


def upload_checkpoint(client, spec: S3MirrorSpec, source: Path, name: str, policy: RetryPolicy,
                      counters: Counters) -> dict:
    """Upload the tree `source` as step prefix `name`; verify every object; COMPLETE last."""
    keys, bucket = Keys(spec), spec.bucket
    started = time.perf_counter()
    files = manifest_of(source)
    marker = keys.file(name, MARKER)
    # Re-uploading a step (a restarted run saves it again): unmark it before touching its objects.
    with_retries(f"delete {keys.url(marker)}", lambda: client.delete_object(Bucket=bucket, Key=marker),
                 policy, counters)
    transfer = _transfer_config()
    for rel, meta in files.items():
        key = keys.file(name, rel)

        def put_and_verify(rel=rel, meta=meta, key=key):
            client.upload_file(str(source / rel), bucket, key, Config=transfer, ExtraArgs={
                "ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": meta["sha256"]}})
            _verify_object(client, bucket, key, meta, keys)

        with_retries(f"upload {keys.url(key)}", put_and_verify, policy, counters)
    manifest = json.dumps({"step": name, "files": files}, indent=1, sort_keys=True).encode()
    manifest_key = keys.file(name, MANIFEST)
    _put_bytes(client, bucket, manifest_key, manifest, keys, policy, counters)
    _check_listing(client, spec, name, files, policy, counters)
    body = json.dumps({"manifest_sha256": hashlib.sha256(manifest).hexdigest(), "files": len(files),
                       "bytes": sum(m["size"] for m in files.values()), "bleu": read_meta(source).get("bleu")}).encode()
    _put_bytes(client, bucket, marker, body, keys, policy, counters)
    return {"files": len(files), "bytes": sum(m["size"] for m in files.values()),
            "seconds": round(time.perf_counter() - started, 3)}


def _put_bytes(client, bucket, key, body: bytes, keys: Keys, policy, counters) -> None:
    meta = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    def put():
        client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256",
                          Metadata={"sha256": meta["sha256"]})
        _verify_object(client, bucket, key, meta, keys)

    with_retries(f"upload {keys.url(key)}", put, policy, counters)


def _verify_object(client, bucket: str, key: str, meta: dict, keys: Keys) -> None:
    """HEAD the object: its size, our sha256 and (single-part objects) S3's own SHA-256 must match."""
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    problems = []
    if head["ContentLength"] != meta["size"]:
        problems.append(f"size {head['ContentLength']}, expected {meta['size']}")
    if head.get("Metadata", {}).get("sha256") != meta["sha256"]:
        problems.append("sha256 metadata differs")
    theirs = head.get("ChecksumSHA256")
    ours = base64.b64encode(bytes.fromhex(meta["sha256"])).decode()
    if theirs and meta["size"] < MULTIPART_THRESHOLD and "-" not in theirs and theirs != ours:
        problems.append(f"S3 checksum {theirs}, expected {ours}")
    if problems:
        raise VerifyError(f"{keys.url(key)} reads back wrong: {'; '.join(problems)}")


def _check_listing(client, spec: S3MirrorSpec, name: str, files: dict, policy, counters) -> None:
    """Every manifest file is listed; objects left by an earlier upload of this step are deleted."""
    keys = Keys(spec)
    listed = set(with_retries(f"list {keys.url(keys.step(name))}",
                              lambda: _list_keys(client, spec.bucket, keys.step(name)), policy, counters))
    wanted = {keys.file(name, rel) for rel in files} | {keys.file(name, MANIFEST)}
    missing = wanted - listed
    if missing:
        raise MirrorError(f"{keys.url(keys.step(name))}: uploaded objects missing from the listing: "
                          f"{', '.join(sorted(missing)[:5])}")
    _delete_keys(client, spec.bucket, sorted(listed - wanted), keys, policy, counters)


def _delete_keys(client, bucket: str, doomed: list[str], keys: Keys, policy, counters) -> None:
    for i in range(0, len(doomed), 1000):
        batch = {"Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True}

        def delete(batch=batch):
            errors = client.delete_objects(Bucket=bucket, Delete=batch).get("Errors", [])
            if errors:
                raise MirrorError(f"delete {keys.url(errors[0]['Key'])}: {errors[0].get('Message')}")

        with_retries(f"delete {len(batch['Objects'])} objects under {keys.url(keys.base)}", delete, policy, counters)


def prune(client, spec: S3MirrorSpec, keep: int, best: str | None, policy: RetryPolicy,
          counters: Counters, keep_best: bool = True) -> list[str]:
    """Keep the newest `keep` complete checkpoints and the best; delete the rest, COMPLETE first.

    The best is the one best.json names (`best`) and, with `keep_best`, the one with
    the highest BLEU among those in S3: after a resume from S3 the local best.json
    only knows the checkpoints this node has seen. Step prefixes without COMPLETE
    are debris of failed uploads (one writer per prefix, and this runs only
    between uploads) and go too.
    """
    keys = Keys(spec)
    found = list_checkpoints(client, spec, policy, counters)
    complete = [name for name, done in found if done]
    protected = set(complete[-keep:]) | ({best} if best in complete else set())
    if keep_best:
        protected |= set(_best_in_s3(client, spec, complete, policy, counters))
    pruned = []
    for name, done in found:
        if name in protected:
            continue
        if done:
            marker = keys.file(name, MARKER)
            with_retries(f"delete {keys.url(marker)}", lambda: client.delete_object(Bucket=spec.bucket, Key=marker),
                         policy, counters)
        rest = with_retries(f"list {keys.url(keys.step(name))}",
                            lambda: _list_keys(client, spec.bucket, keys.step(name)), policy, counters)
        _delete_keys(client, spec.bucket, rest, keys, policy, counters)
        pruned.append(name)
    return pruned


def _best_in_s3(client, spec: S3MirrorSpec, complete: list[str], policy, counters) -> list[str]:
    """[the complete checkpoint with the highest BLEU in its COMPLETE marker], or []; ties go
    to the earlier step, as in CheckpointManager.best()."""
    keys = Keys(spec)
    scored = []  # (BLEU from the marker, step name, step name)
    for name in complete:
        key = keys.file(name, MARKER)
        try:
            raw = with_retries(f"read {keys.url(key)}",
                               lambda key=key: client.get_object(Bucket=spec.bucket, Key=key)["Body"].read(),
                               policy, counters)
            bleu = json.loads(raw).get("bleu")
        except (MirrorError, ValueError):
            continue  # pruned meanwhile, or a marker without scores: not a candidate
        scored.append((bleu, name, name))
    best = best_by_score(scored)
    return [best] if best else []


# ------------------------------------------------------------------- download


def fetch_checkpoint(client, spec: S3MirrorSpec, name: str, root: Path, policy: RetryPolicy,
                     counters: Counters) -> Path:
    """Download complete checkpoint `name` into root/name, verified against its manifest, atomically."""
    keys, bucket = Keys(spec), spec.bucket

    def get(key):
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()

    try:
        marker = json.loads(with_retries(f"read {keys.url(keys.file(name, MARKER))}",
                                         lambda: get(keys.file(name, MARKER)), policy, counters))
    except MirrorError as exc:
        if _not_found(exc.__cause__):
            raise IntegrityError(f"{keys.url(keys.step(name))} is not complete (no {MARKER})") from exc
        raise
    raw = with_retries(f"read {keys.url(keys.file(name, MANIFEST))}", lambda: get(keys.file(name, MANIFEST)),
                       policy, counters)
    if hashlib.sha256(raw).hexdigest() != marker.get("manifest_sha256"):
        raise IntegrityError(f"{keys.url(keys.file(name, MANIFEST))}: sha256 differs from the one in {MARKER}")
    files = json.loads(raw)["files"]

    root.mkdir(parents=True, exist_ok=True)
    # Unique per node and process: nodes sharing one checkpoint dir may fetch at once.
    tmp = root / f".s3-{name}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    transfer = _transfer_config()
    try:
        for rel, meta in files.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            key = keys.file(name, rel)
            try:
                with_retries(f"download {keys.url(key)}",
                             lambda key=key, dest=dest: client.download_file(bucket, key, str(dest), Config=transfer),
                             policy, counters)
            except MirrorError as exc:
                if _not_found(exc.__cause__):
                    raise IntegrityError(f"{keys.url(key)} is in the manifest but not in S3") from exc
                raise
            size, digest = dest.stat().st_size, sha256_file(dest)
            if size != meta["size"] or digest != meta["sha256"]:
                raise IntegrityError(f"{keys.url(key)}: {size} bytes with sha256 {digest[:12]}…, the manifest "
                                     f"says {meta['size']} bytes with sha256 {meta['sha256'][:12]}…")
        (tmp / MARKER).write_text("")
        _fsync_tree(tmp)
        final = root / name
        if (final / MARKER).is_file():  # another node sharing this directory was first
            shutil.rmtree(tmp)
            return final
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fetch_newest(client, spec: S3MirrorSpec, root: Path, policy: RetryPolicy, counters: Counters) -> Path | None:
    """The newest complete S3 checkpoint that verifies, downloaded into `root`; None if S3 has none.

    A corrupt checkpoint is skipped for the one before it. S3 being unreachable is
    an error: starting from scratch would throw the mirrored progress away.
    """
    keys = Keys(spec)
    complete = [name for name, done in list_checkpoints(client, spec, policy, counters) if done]
    for name in reversed(complete):
        try:
            path = fetch_checkpoint(client, spec, name, root, policy, counters)
        except IntegrityError as exc:
            log.error("s3 mirror: not resuming from %s: %s", keys.url(keys.step(name)), exc)
            continue
        log.info("s3 mirror: fetched %s into %s", keys.url(keys.step(name)), path)
        return path
    if complete:
        log.error("s3 mirror: none of the %d complete checkpoints under %s verifies; starting fresh",
                  len(complete), keys.url(keys.base))
    return None


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


# ---------------------------------------------------------- background upload


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
        self.failed: list[dict] = []
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

    def finish(self, timeout: float | None = None) -> dict:
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

    def summary(self) -> dict:
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
        record = {"step": step, "uri": f"{self.spec.uri.rstrip('/')}/{job.name}/"}
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
    return int(STEP_DIR.match(name).group(1))


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
        return json.loads((root / "best.json").read_text()).get("path")
    except (OSError, ValueError):
        return None


def start(spec: CheckpointSpec, root: Path, world: World, output: Path) -> Mirror | None:
    """The run's mirror (rank 0 only), or None when spec.checkpoint.s3 is not set."""
    if spec.s3 is None or not world.is_main:
        return None
    return Mirror(spec.s3, root, keep=spec.s3.keep or spec.keep, keep_best=spec.keep_best,
                  log_path=output / "s3-mirror.jsonl")
