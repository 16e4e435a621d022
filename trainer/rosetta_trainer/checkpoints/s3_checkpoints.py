"""Checkpoints in S3: their layout, and uploading, verifying, listing, pruning and fetching them.

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
import functools
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, cast

import botocore.exceptions as boto_errors

from rosetta_contract.checkpoint_fields import S3MirrorSpec
from rosetta_trainer.checkpoints.checkpoint import (
    MARKER,
    STEP_DIR,
    best_by_score,
    read_meta,
)
from rosetta_trainer.runtime.durable_files import fsync_dir, fsync_tree
from rosetta_trainer.runtime.s3_client import (
    MULTIPART_THRESHOLD,
    Counters,
    IntegrityError,
    MirrorError,
    RetryPolicy,
    VerifyError,
    list_keys,
    not_found,
    transfer_config,
    with_retries,
)

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"



def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(4 * 2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_of(checkpoint: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} of every file but the local COMPLETE marker."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        rel = path.relative_to(checkpoint).as_posix()
        if rel != MARKER:
            files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


class Keys:
    """Object keys of one mirror prefix."""

    def __init__(self, spec: S3MirrorSpec) -> None:
        self.bucket, self.base = spec.bucket, f"{spec.prefix}/" if spec.prefix else ""

    def step(self, name: str) -> str:
        return f"{self.base}{name}/"

    def file(self, name: str, rel: str) -> str:
        return f"{self.base}{name}/{rel}"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


def list_checkpoints(client: Any, spec: S3MirrorSpec, policy: RetryPolicy, counters: Counters) -> list[tuple[str, bool]]:
    """(step dir name, has COMPLETE) of every step prefix in S3, oldest first."""
    keys = Keys(spec)

    def step_names() -> list[str]:
        names: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=keys.bucket, Prefix=keys.base,
                                                                      Delimiter="/"):
            names += [p["Prefix"][len(keys.base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(n for n in names if STEP_DIR.match(n))

    def has_marker(name: str) -> bool:
        try:
            client.head_object(Bucket=keys.bucket, Key=keys.file(name, MARKER))
            return True
        except boto_errors.ClientError as exc:
            if not_found(exc):
                return False
            raise

    names = with_retries(f"list {keys.url(keys.base)}", step_names, policy, counters)
    return [(n, with_retries(f"check {keys.url(keys.file(n, MARKER))}", functools.partial(has_marker, n), policy,
                             counters))
            for n in names]



def upload_checkpoint(client: Any, spec: S3MirrorSpec, source: Path, name: str, policy: RetryPolicy,
                      counters: Counters) -> dict[str, Any]:
    """Upload the tree `source` as step prefix `name`; verify every object; COMPLETE last."""
    keys, bucket = Keys(spec), spec.bucket
    started = time.perf_counter()
    files = manifest_of(source)
    marker = keys.file(name, MARKER)
    # Re-uploading a step (a restarted run saves it again): unmark it before touching its objects.
    with_retries(f"delete {keys.url(marker)}", lambda: client.delete_object(Bucket=bucket, Key=marker),
                 policy, counters)
    transfer = transfer_config()
    for rel, meta in files.items():
        key = keys.file(name, rel)

        def put_and_verify(rel: str = rel, meta: dict[str, Any] = meta, key: str = key) -> None:
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


def _put_bytes(client: Any, bucket: str, key: str, body: bytes, keys: Keys, policy: RetryPolicy,
               counters: Counters) -> None:
    meta = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    def put() -> None:
        client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256",
                          Metadata={"sha256": meta["sha256"]})
        _verify_object(client, bucket, key, meta, keys)

    with_retries(f"upload {keys.url(key)}", put, policy, counters)


def _verify_object(client: Any, bucket: str, key: str, meta: dict[str, Any], keys: Keys) -> None:
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


def _check_listing(client: Any, spec: S3MirrorSpec, name: str, files: dict[str, dict[str, Any]], policy: RetryPolicy,
                   counters: Counters) -> None:
    """Every manifest file is listed; objects left by an earlier upload of this step are deleted."""
    keys = Keys(spec)
    listed = set(with_retries(f"list {keys.url(keys.step(name))}",
                              lambda: list_keys(client, spec.bucket, keys.step(name)), policy, counters))
    wanted = {keys.file(name, rel) for rel in files} | {keys.file(name, MANIFEST)}
    missing = wanted - listed
    if missing:
        raise MirrorError(f"{keys.url(keys.step(name))}: uploaded objects missing from the listing: "
                          f"{', '.join(sorted(missing)[:5])}")
    _delete_keys(client, spec.bucket, sorted(listed - wanted), keys, policy, counters)


def _delete_keys(client: Any, bucket: str, doomed: list[str], keys: Keys, policy: RetryPolicy,
                 counters: Counters) -> None:
    for i in range(0, len(doomed), 1000):
        objects = [{"Key": k} for k in doomed[i:i + 1000]]
        batch = {"Objects": objects, "Quiet": True}

        def delete(batch: dict[str, Any] = batch) -> None:
            errors = client.delete_objects(Bucket=bucket, Delete=batch).get("Errors", [])
            if errors:
                raise MirrorError(f"delete {keys.url(errors[0]['Key'])}: {errors[0].get('Message')}")

        with_retries(f"delete {len(objects)} objects under {keys.url(keys.base)}", delete, policy, counters)


def prune(client: Any, spec: S3MirrorSpec, keep: int, best: str | None, policy: RetryPolicy,
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
    pruned: list[str] = []
    for name, done in found:
        if name in protected:
            continue
        if done:
            marker = keys.file(name, MARKER)
            with_retries(f"delete {keys.url(marker)}", lambda: client.delete_object(Bucket=spec.bucket, Key=marker),
                         policy, counters)
        rest = with_retries(f"list {keys.url(keys.step(name))}",
                            lambda: list_keys(client, spec.bucket, keys.step(name)), policy, counters)
        _delete_keys(client, spec.bucket, rest, keys, policy, counters)
        pruned.append(name)
    return pruned


def _best_in_s3(client: Any, spec: S3MirrorSpec, complete: list[str], policy: RetryPolicy,
                counters: Counters) -> list[str]:
    """[the complete checkpoint with the highest BLEU in its COMPLETE marker], or []; ties go
    to the earlier step, as in CheckpointManager.best()."""
    keys = Keys(spec)
    scored: list[tuple[float | None, str, str]] = []  # (BLEU from the marker, step name, step name)
    for name in complete:
        key = keys.file(name, MARKER)
        try:
            def read(key: str = key) -> bytes:
                body: bytes = client.get_object(Bucket=spec.bucket, Key=key)["Body"].read()
                return body
            raw = with_retries(f"read {keys.url(key)}", read, policy, counters)
            bleu = json.loads(raw).get("bleu")
        except (MirrorError, ValueError):
            continue  # pruned meanwhile, or a marker without scores: not a candidate
        scored.append((bleu, name, name))
    best = best_by_score(scored)
    return [best] if best else []



def fetch_checkpoint(client: Any, spec: S3MirrorSpec, name: str, root: Path, policy: RetryPolicy,
                     counters: Counters) -> Path:
    """Download complete checkpoint `name` into root/name, verified against its manifest, atomically."""
    keys, bucket = Keys(spec), spec.bucket

    def get(key: str) -> bytes:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    try:
        marker = json.loads(with_retries(f"read {keys.url(keys.file(name, MARKER))}",
                                         lambda: get(keys.file(name, MARKER)), policy, counters))
    except MirrorError as exc:
        if not_found(cast(BaseException, exc.__cause__)):  # with_retries raises from the error
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
    transfer = transfer_config()
    try:
        for rel, meta in files.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            key = keys.file(name, rel)
            try:
                def download(key: str = key, dest: Path = dest) -> None:
                    client.download_file(bucket, key, str(dest), Config=transfer)
                with_retries(f"download {keys.url(key)}", download, policy, counters)
            except MirrorError as exc:
                if not_found(cast(BaseException, exc.__cause__)):  # as above
                    raise IntegrityError(f"{keys.url(key)} is in the manifest but not in S3") from exc
                raise
            size, digest = dest.stat().st_size, sha256_file(dest)
            if size != meta["size"] or digest != meta["sha256"]:
                raise IntegrityError(f"{keys.url(key)}: {size} bytes with sha256 {digest[:12]}…, the manifest "
                                     f"says {meta['size']} bytes with sha256 {meta['sha256'][:12]}…")
        (tmp / MARKER).write_text("")
        fsync_tree(tmp)
        final = root / name
        if (final / MARKER).is_file():  # another node sharing this directory was first
            shutil.rmtree(tmp)
            return final
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fetch_newest(client: Any, spec: S3MirrorSpec, root: Path, policy: RetryPolicy, counters: Counters) -> Path | None:
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
