"""model.source / data.source from S3 (moto's server; a proxy in front of it injects faults): a copy
lands whole or not at all, once, and a source that is not there is a data error, not a retry."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest

from rosetta_contract.staging_fields import StagingSpec
from rosetta_trainer.data.examples import DataError
from rosetta_trainer.preparation.staging import MARKER, StagingError, stage, staged_from
from rosetta_trainer.runtime.s3_client import MirrorError, RetryPolicy
from support.s3_server import FaultyProxy, isolate_aws_env, moto_s3

FAST = RetryPolicy(attempts=3, first_delay_s=0.01, max_delay_s=0.05, http_attempts=1, connect_timeout_s=2,
                   read_timeout_s=10)
FILES = {"config.json": b'{"model_type": "t5"}', "model.safetensors": bytes(range(256)) * 4096,
         "tokenizer/spiece.model": b"\x00spm"}


@pytest.fixture(scope="module")
def s3_url():
    with moto_s3() as url:
        yield url


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    isolate_aws_env(monkeypatch, tmp_path)


@pytest.fixture
def bucket(s3_url):
    name = f"weights-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_url)
    client.create_bucket(Bucket=name)
    for rel, body in FILES.items():
        client.put_object(Bucket=name, Key=f"models/t5/{rel}", Body=body)
    client.put_object(Bucket=name, Key="models/t5-other/config.json", Body=b"{}")  # a sibling prefix
    return name


def source(endpoint: str, uri: str, path: Path) -> StagingSpec:
    return StagingSpec(uri=uri, path=str(path), endpoint_url=endpoint)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_prefix_is_copied_whole_and_only_once(s3_url, bucket, tmp_path):
    dest = tmp_path / "volume" / "t5"
    first = stage(source(s3_url, f"s3://{bucket}/models/t5", dest), "model", FAST)
    assert first["copied"] and first["files"] == 3
    assert tree(dest) == {**FILES, MARKER: (dest / MARKER).read_bytes()}  # not the t5-other sibling
    assert staged_from(dest) == f"s3://{bucket}/models/t5"
    assert [p.name for p in dest.parent.iterdir()] == ["t5"]  # no staging leftovers beside it
    # A gang restart, or another training on the same volume: nothing copied again.
    with FaultyProxy(s3_url, lambda method, path, n: 503) as down:
        again = stage(source(down.url, f"s3://{bucket}/models/t5", dest), "model", FAST)
    assert not again["copied"] and down.log == []


def test_a_copy_that_breaks_off_leaves_nothing_behind(s3_url, bucket, tmp_path):
    dest = tmp_path / "volume" / "t5"
    # Every GET of the weights fails: the listing and the small files go through.
    with FaultyProxy(s3_url, lambda method, path, n: 503 if "safetensors" in path else None) as flaky:
        with pytest.raises(MirrorError, match="still failing after 3 attempts") as info:
            stage(source(flaky.url, f"s3://{bucket}/models/t5", dest), "model", FAST)
    assert not isinstance(info.value, DataError)  # transient: the stage job's pod is retried
    assert flaky.injected >= 3
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    # The next attempt, with S3 back, copies all of it.
    assert stage(source(s3_url, f"s3://{bucket}/models/t5", dest), "model", FAST)["files"] == 3


def test_errors_on_the_way_are_retried(s3_url, bucket, tmp_path):
    dest = tmp_path / "t5"
    seen: set[tuple[str, str]] = set()

    def first_try_fails(method: str, path: str, n: int):  # each request's first attempt: a 500
        if (method, path) in seen:
            return None
        seen.add((method, path))
        return 500

    with FaultyProxy(s3_url, first_try_fails) as flaky:
        stage(source(flaky.url, f"s3://{bucket}/models/t5", dest), "model", FAST)
    assert flaky.injected >= 2 and tree(dest).keys() >= FILES.keys()


@pytest.mark.parametrize("uri, says", [
    ("s3://{bucket}/models/missing", "no objects under this prefix"),
    ("s3://no-such-bucket-{bucket}/models/t5", "NoSuchBucket"),
])
def test_a_source_that_is_not_there_is_a_data_error(s3_url, bucket, tmp_path, uri, says):
    with pytest.raises(StagingError, match=says) as info:
        stage(source(s3_url, uri.format(bucket=bucket), tmp_path / "t5"), "model", FAST)
    assert isinstance(info.value, DataError)  # rosetta stage exits with the data-error code
    assert not (tmp_path / "t5").exists()


def test_a_directory_that_holds_other_files_is_not_overwritten(s3_url, bucket, tmp_path):
    dest = tmp_path / "t5"
    dest.mkdir()
    (dest / "mine.bin").write_bytes(b"keep")
    with pytest.raises(StagingError, match="already holds files"):
        stage(source(s3_url, f"s3://{bucket}/models/t5", dest), "model", FAST)
    assert tree(dest) == {"mine.bin": b"keep"}
