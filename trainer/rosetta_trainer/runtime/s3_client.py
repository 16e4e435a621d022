"""The S3 client the checkpoint mirror and staging share: boto3 with timeouts, our own retries
(what is worth retrying, with backoff and counters) and the errors no retry can fix.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import botocore.exceptions as boto_errors
from boto3.exceptions import S3UploadFailedError

from rosetta_contract.checkpoint_fields import S3MirrorSpec
from rosetta_contract.staging_fields import StagingSpec

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig

T = TypeVar("T")

log = logging.getLogger(__name__)

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
        backoff: float = self.first_delay_s * 2 ** (failures - 1)
        return min(self.max_delay_s, backoff) * random.uniform(0.5, 1.0)


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

    def as_dict(self) -> dict[str, int]:
        return {"http": self.http, "object": self.object}


# boto3's clients are made at run time from service descriptions: no annotations to name them by.
def make_client(spec: S3MirrorSpec | StagingSpec, policy: RetryPolicy = RetryPolicy(), counters: Counters | None = None) -> Any:
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = dict(retries={"mode": "standard", "total_max_attempts": policy.http_attempts},
                   connect_timeout=policy.connect_timeout_s, read_timeout=policy.read_timeout_s)
    if spec.endpoint_url:
        # S3-compatible stores rarely serve virtual-hosted bucket names.
        options["s3"] = {"addressing_style": "path"}
    client = boto3.session.Session().client("s3", endpoint_url=spec.endpoint_url, region_name=spec.region,
                                            config=Config(**options))
    if counters is not None:
        def count(request: Any = None, **_: Any) -> None:  # once per HTTP attempt; botocore numbers them from 1
            if getattr(request, "context", {}).get("retries", {}).get("attempt", 1) > 1:
                counters.add("http")
        client.meta.events.register("request-created.s3", count)
    return client


def transfer_config() -> TransferConfig:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD,
                          max_concurrency=4)


def _root_cause(exc: BaseException) -> BaseException:
    # upload_file wraps ClientError in S3UploadFailedError; s3transfer's
    # RetriesExceededError keeps the last error in `last_exception`.
    inner = getattr(exc, "last_exception", None)
    if inner is not None:
        return cast(BaseException, inner)
    if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
        return cast(BaseException, exc.__context__)
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


# The last attempt returns or raises; only attempts < 1 falls through (to None, as it always has).
def with_retries(what: str, fn: Callable[[], T], policy: RetryPolicy, counters: Counters) -> T:  # type: ignore[return]
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


def not_found(exc: BaseException) -> bool:
    exc = _root_cause(exc)
    return isinstance(exc, boto_errors.ClientError) and \
        exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [obj["Key"] for obj in page.get("Contents", [])]
    return keys
