"""Checks of the places the trainer's fields name: S3 buckets, http(s) URLs (never with a credential
in them) and Kubernetes Secret names. model.source and data.source (staging_fields.py), checkpoint.s3
(checkpoint_fields.py) and tracking (evaluation_fields.py) share them.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Optional

from rosetta_contract.strict_model import clip

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def bucket_problem(value: str) -> Optional[str]:
    bucket = value[len("s3://"):].split("/", 1)[0]
    if not bucket:
        return f"'{clip(value, 80)}' names no bucket (s3://bucket/prefix)"
    if not _S3_BUCKET.match(bucket) or ".." in bucket:
        return (f"bucket '{clip(bucket, 80)}' is not a valid S3 bucket name "
                "(3-63 characters: a-z, 0-9, '.', '-', starting and ending with a letter or digit)")
    return None


# Query parameters that carry a credential (?token=..., ?password=..., ?X-Amz-Signature=...).
_SECRET_QUERY = re.compile(r"(?i)(^|[-_.])(token|password|passwd|secret|api[-_.]?key|apikey|signature|sig|"
                           r"access[-_.]?key|credentials?)$")


def no_credentials(value: Optional[str], secret: str) -> Optional[str]:
    """Refuse a URL that carries a credential: it would be copied in clear into the ConfigMap, the
    applied-spec annotation, every checkpoint's training.yaml and the tracking run's config.
    The message never repeats the URL (it holds the credential)."""
    if value is None:
        return value
    try:
        parts = urllib.parse.urlsplit(value)
        names = [name for name, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    except ValueError:
        return value  # not a URL at all: the field's own check says so
    if "@" in parts.netloc:
        raise ValueError(f"the URL has a user name or password before '@' (not repeated here); remove them and "
                         f"give the credential through {secret}, from a Secret")
    if any(_SECRET_QUERY.search(name) for name in names):
        raise ValueError(f"the URL's query carries a credential (not repeated here); remove it and give the "
                         f"credential through {secret}, from a Secret")
    return value


def http_url(value: Optional[str], secret: str = "credentialsSecret") -> Optional[str]:
    no_credentials(value, secret)
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"'{value}' must be an http:// or https:// URL")
    return value


def secret_name(value: Optional[str]) -> Optional[str]:
    if value is not None and not _SECRET_NAME.match(value):
        raise ValueError(f"'{value}' is not a valid Secret name (lowercase a-z, 0-9, '-' and '.')")
    return value
