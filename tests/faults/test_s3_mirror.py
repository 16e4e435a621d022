"""The S3 checkpoint mirror against a real S3-compatible HTTP server, with real HTTP failures.

moto's server mode plays S3; a proxy in front of it (support/s3_server.py) answers
chosen requests with 500/503 or drops the connection. Shown here: uploads survive
errors by retrying, an upload that keeps failing leaves no COMPLETE marker and
is never resumed from, corruption is caught at download and the checkpoint before
it is used, pruning keeps keep-k plus the best, and a real training resumes on an
empty node from S3.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import boto3
import pytest
import yaml

from rosetta_contract.checkpoint_fields import S3MirrorSpec
from rosetta_trainer.checkpoints import s3_checkpoints, s3_mirror
from rosetta_trainer.checkpoints.s3_checkpoints import MANIFEST
from rosetta_trainer.checkpoints.s3_mirror import Mirror
from rosetta_trainer.runtime import s3_client
from rosetta_trainer.runtime.s3_client import Counters, MirrorError, RetryPolicy
from support.s3_server import FaultyProxy, isolate_aws_env, moto_s3
from support.training import TINY, deep_update, read_jsonl

# Real backoff shapes, test-sized delays; botocore makes up to 2 attempts per request.
FAST = RetryPolicy(attempts=4, first_delay_s=0.01, max_delay_s=0.05, http_attempts=2, connect_timeout_s=2,
                   read_timeout_s=10)


@pytest.fixture(scope="module")
def s3_url():
    with moto_s3() as url:
        yield url


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    isolate_aws_env(monkeypatch, tmp_path)


@pytest.fixture
def bucket(s3_url):
    """A fresh bucket per test: moto's state is shared by the whole process."""
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    direct(s3_url).create_bucket(Bucket=name)
    return name


def direct(url):
    return boto3.client("s3", endpoint_url=url)


def keys_in(url, bucket) -> list[str]:
    pages = direct(url).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def fake_checkpoint(root: Path, step: int, *, bleu: float | None = None, salt: str = "") -> Path:
    """A checkpoint-shaped tree, DeepSpeed-style shards included: the mirror treats it as opaque files."""
    path = root / f"step-{step:08d}"
    files = {
        "model/model.safetensors": os.urandom(150_000),
        "model/config.json": b'{"d_model": 32}',
        "deepspeed/global_step/zero_pp_rank_0_mp_rank_00_optim_states.pt": os.urandom(40_000),
        "deepspeed/global_step/zero_pp_rank_1_mp_rank_00_optim_states.pt": os.urandom(40_000),
        "trainer_state.pt": f"state {step} {salt}".encode(),
        "meta.json": json.dumps({"step": step, "bleu": bleu}).encode(),
    }
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    (path / "COMPLETE").write_text("")
    return path


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def spec_for(bucket: str, endpoint: str, prefix: str = "runs/mt") -> S3MirrorSpec:
    return S3MirrorSpec(uri=f"s3://{bucket}/{prefix}", endpoint_url=endpoint)


def complete_steps(url, bucket, prefix="runs/mt") -> list[str]:
    return sorted(re.match(rf"{prefix}/(step-\d+)/COMPLETE$", k).group(1)
                  for k in keys_in(url, bucket) if k.endswith("/COMPLETE"))


def fetch(url, bucket, root: Path):
    counters = Counters()
    spec = spec_for(bucket, url)
    return s3_checkpoints.fetch_newest(s3_client.make_client(spec, FAST, counters), spec, root, FAST, counters)


# ----------------------------------------------------------------- retries


@pytest.mark.slow  # ~5 s: retries through injected errors
def test_uploads_complete_through_injected_errors(s3_url, bucket, tmp_path):
    # Half the requests fail (500, dropped connections, 503); two in a row exhaust botocore's
    # 2 attempts, so both retry layers are exercised.
    faults = [500, None, "drop", None, 503, "drop", None, None]
    with FaultyProxy(s3_url, lambda method, path, n: faults[n % len(faults)]) as proxy:
        ckpt = fake_checkpoint(tmp_path / "ckpts", 10, bleu=1.0)
        mirror = Mirror(spec_for(bucket, proxy.url), ckpt.parent, keep=3, policy=FAST,
                        log_path=tmp_path / "s3-mirror.jsonl")
        started = time.perf_counter()
        mirror.submit(ckpt)
        summary = mirror.finish()
        seconds = time.perf_counter() - started

    assert summary["uploaded"] == [10] and summary["failed"] == []
    assert proxy.injected >= 10, proxy.log
    assert summary["retries"]["object"] > 0 and summary["retries"]["http"] > 0
    # Each injected failure cost exactly one retry, by botocore or by our loop around it.
    assert summary["retries"]["http"] + summary["retries"]["object"] == proxy.injected
    (record,) = read_jsonl(tmp_path / "s3-mirror.jsonl")
    assert record["ok"] and record["files"] == 6 and record["retries"] == summary["retries"]
    print(f"\n[measured] {proxy.injected} injected failures of {len(proxy.log)} requests, retries "
          f"{summary['retries']}, upload {record['bytes']} B in {seconds:.2f}s")

    restored = fetch(s3_url, bucket, tmp_path / "fresh")
    assert restored.name == "step-00000010"
    assert tree(restored) == tree(ckpt)
    assert not list(ckpt.parent.glob(".mirror-*")), "the upload snapshot is removed"


@pytest.mark.slow  # ~5 s: every retry of a failing upload
def test_an_upload_that_keeps_failing_leaves_no_marker_and_is_not_resumed(s3_url, bucket, tmp_path):
    broken = {"on": False}

    def faults(method, path, n):  # one shard of step 20 can never be written
        return 503 if broken["on"] and method == "PUT" and "step-00000020/trainer_state.pt" in path else None

    root = tmp_path / "ckpts"
    with FaultyProxy(s3_url, faults) as proxy:
        mirror = Mirror(spec_for(bucket, proxy.url), root, keep=3, policy=FAST)
        mirror.submit(fake_checkpoint(root, 10))
        assert mirror.wait_idle(60)
        broken["on"] = True
        started = time.perf_counter()
        mirror.submit(fake_checkpoint(root, 20))  # never raises: training goes on
        assert mirror.wait_idle(60)
        failing_for = time.perf_counter() - started
        assert complete_steps(s3_url, bucket) == ["step-00000010"]
        assert any("step-00000020/" in k for k in keys_in(s3_url, bucket)), "partial upload exists"
        # What an empty node would resume from: the older, complete checkpoint.
        assert fetch(s3_url, bucket, tmp_path / "fresh").name == "step-00000010"

        broken["on"] = False
        mirror.submit(fake_checkpoint(root, 30))  # the next checkpoint tries again
        summary = mirror.finish()

    (failure,) = summary["failed"]
    assert failure["step"] == 20
    assert "step-00000020/trainer_state.pt" in failure["error"] and "still failing after 4 attempts" in failure["error"]
    assert summary["uploaded"] == [10, 30]
    # The debris of the failed upload went with the next prune.
    assert complete_steps(s3_url, bucket) == ["step-00000010", "step-00000030"]
    assert not any("step-00000020" in k for k in keys_in(s3_url, bucket))
    injected = sum(1 for method, path, outcome in proxy.log if outcome == 503)
    # 4 attempts of ours, each of 2 HTTP attempts by botocore: bounded, not forever.
    assert injected == FAST.attempts * FAST.http_attempts
    print(f"\n[measured] a persistently failing object: {injected} failed requests, gave up after "
          f"{failing_for:.2f}s")


def test_unreachable_s3_at_resume_is_an_error_not_a_fresh_start(tmp_path, bucket):
    with FaultyProxy("http://127.0.0.1:9") as proxy:  # forwards to a closed port
        spec = spec_for(bucket, proxy.url)
        with pytest.raises(MirrorError, match=rf"list s3://{bucket}/runs/mt/: still failing after 4 attempts"):
            s3_checkpoints.fetch_newest(s3_client.make_client(spec, FAST), spec, tmp_path, FAST, Counters())
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------- integrity


def _upload(url, bucket, ckpt: Path):
    spec = spec_for(bucket, url)
    counters = Counters()
    return s3_checkpoints.upload_checkpoint(s3_client.make_client(spec, FAST, counters), spec, ckpt, ckpt.name,
                                       FAST, counters)


def _flip_a_byte(url, bucket, key):
    client = direct(url)
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


@pytest.mark.parametrize("damage", ["object bytes", "manifest", "missing object"])
def test_corruption_is_caught_at_download_and_the_previous_checkpoint_is_used(s3_url, bucket, tmp_path, caplog,
                                                                              damage):
    src = tmp_path / "src"
    for step in (10, 20):
        _upload(s3_url, bucket, fake_checkpoint(src, step))
    prefix = "runs/mt/step-00000020"
    if damage == "object bytes":
        _flip_a_byte(s3_url, bucket, f"{prefix}/model/model.safetensors")
        expected = "model/model.safetensors: 150000 bytes with sha256"
    elif damage == "manifest":
        # A consistent lie: the manifest rewritten to match a tampered object.
        manifest = json.loads(direct(s3_url).get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}")["Body"].read())
        manifest["files"]["trainer_state.pt"]["sha256"] = "0" * 64
        direct(s3_url).put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}", Body=json.dumps(manifest).encode())
        expected = "MANIFEST.json: sha256 differs from the one in COMPLETE"
    else:
        direct(s3_url).delete_object(Bucket=bucket, Key=f"{prefix}/trainer_state.pt")
        expected = "trainer_state.pt is in the manifest but not in S3"

    root = tmp_path / "fresh"
    restored = fetch(s3_url, bucket, root)

    assert restored == root / "step-00000010"
    assert tree(restored) == tree(src / "step-00000010")
    assert sorted(p.name for p in root.iterdir()) == ["step-00000010"], "no half-downloaded directory is left"
    assert f"not resuming from s3://{bucket}/{prefix}/" in caplog.text and expected in caplog.text


def test_reuploading_a_step_unmarks_it_first_and_drops_stale_objects(s3_url, bucket, tmp_path):
    first = fake_checkpoint(tmp_path / "a", 10, salt="first")
    second = fake_checkpoint(tmp_path / "b", 10, salt="second")
    shutil.rmtree(second / "deepspeed" / "global_step")  # e.g. re-saved with fewer ranks
    (second / "deepspeed" / "other.pt").write_bytes(b"x")
    _upload(s3_url, bucket, first)
    with FaultyProxy(s3_url) as proxy:
        spec = spec_for(bucket, proxy.url)
        s3_checkpoints.upload_checkpoint(s3_client.make_client(spec, FAST), spec, second, second.name, FAST, Counters())

    writes = [(m, p.split("?")[0]) for m, p, _ in proxy.log if m in ("PUT", "DELETE", "POST")]
    assert writes[0] == ("DELETE", f"/{bucket}/runs/mt/step-00000010/COMPLETE")
    assert writes[-1] == ("PUT", f"/{bucket}/runs/mt/step-00000010/COMPLETE")
    restored = fetch(s3_url, bucket, tmp_path / "fresh")
    assert tree(restored) == tree(second)
    assert not any("global_step" in k for k in keys_in(s3_url, bucket))


# ------------------------------------------------------------------ pruning


def test_pruning_keeps_k_and_the_best_and_unmarks_first(s3_url, bucket, tmp_path):
    root = tmp_path / "ckpts"
    scores = {10: 5.0, 20: 9.0, 30: 3.0, 40: 4.0, 50: 1.0}
    with FaultyProxy(s3_url) as proxy:
        mirror = Mirror(spec_for(bucket, proxy.url), root, keep=1, policy=FAST)
        for step, bleu in scores.items():
            ckpt = fake_checkpoint(root, step, bleu=bleu)
            # The local best.json after a resume only knows this node's checkpoints: it names 40,
            # while the S3 markers know 20 scored best.
            (root / "best.json").write_text(json.dumps({"path": "step-00000040" if step >= 40 else ckpt.name}))
            mirror.submit(ckpt)
            assert mirror.wait_idle(60)
        summary = mirror.finish()

    assert summary["uploaded"] == list(scores)
    # keep=1: the newest (50), best.json's (40) and the best BLEU in S3 (20).
    assert complete_steps(s3_url, bucket) == ["step-00000020", "step-00000040", "step-00000050"]
    assert {k.split("/")[2] for k in keys_in(s3_url, bucket)} == {"step-00000020", "step-00000040", "step-00000050"}
    for pruned in ("step-00000010", "step-00000030"):
        requests = [(m, p) for m, p, _ in proxy.log]
        unmark = requests.index(("DELETE", f"/{bucket}/runs/mt/{pruned}/COMPLETE"))
        listing = next(i for i, (m, p) in enumerate(requests)
                       if m == "GET" and f"prefix=runs%2Fmt%2F{pruned}%2F" in p)
        assert unmark < listing, f"{pruned}: objects were listed for deletion before its marker went"


# --------------------------------------------------------------- background


def test_finish_waits_and_newer_checkpoints_supersede_queued_ones(s3_url, bucket, tmp_path):
    root = tmp_path / "ckpts"
    mirror = Mirror(spec_for(bucket, s3_url), root, keep=5, policy=FAST)
    for step in (10, 20, 30):
        mirror.submit(fake_checkpoint(root, step))
        shutil.rmtree(root / f"step-{step:08d}")  # local pruning cannot pull files from under an upload
    summary = mirror.finish()

    assert complete_steps(s3_url, bucket)[-1] == "step-00000030", "finish() returned before the last upload"
    assert 30 in summary["uploaded"] and sorted(summary["uploaded"] + summary["skipped"]) == [10, 20, 30]
    assert summary["failed"] == []
    assert not list(root.glob(".mirror-*"))


def test_resume_point_prefers_the_local_checkpoint(s3_url, bucket, tmp_path):
    import torch

    from rosetta_trainer.runtime.distributed import World

    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))
    _upload(s3_url, bucket, fake_checkpoint(tmp_path / "src", 20))
    with FaultyProxy(s3_url) as proxy:
        spec = spec_for(bucket, proxy.url)
        local = fake_checkpoint(tmp_path / "node", 10)
        assert s3_mirror.resume_point(spec, local.parent, world, FAST) == local
        assert proxy.log == [], "a node with its own checkpoint does not ask S3"
        shutil.rmtree(local)
        assert s3_mirror.resume_point(spec, local.parent, world, FAST) == local.parent / "step-00000020"
    assert tree(local.parent / "step-00000020") == tree(tmp_path / "src" / "step-00000020")


# ---------------------------------------------------------- real training


@pytest.mark.slow
def test_a_new_node_resumes_a_real_training_from_s3(s3_url, bucket, tmp_path):
    from rosetta_trainer.commands.train import train_from_file

    # 1 in 7 requests fails during the first run: training neither waits nor dies for it.
    with FaultyProxy(s3_url, lambda method, path, n: 503 if n % 7 == 0 else None) as proxy:
        cfg = tmp_path / "training.yaml"
        cfg.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"checkpoint": {
            "interval": 10, "keep": 1, "s3": {"uri": f"s3://{bucket}/tiny", "endpointUrl": proxy.url}}}})))
        first = train_from_file(str(cfg), str(tmp_path / "node-a"), progress=False)

    mirrored = first["s3_mirror"]
    assert mirrored["uploaded"] == [10, 20] and mirrored["failed"] == []
    # (The resume check before training is request 1, never a 7th: every fault hit the mirror.)
    assert sum(mirrored["retries"].values()) == proxy.injected > 0
    assert "step-00000020" in complete_steps(s3_url, bucket, prefix="tiny")
    records = read_jsonl(tmp_path / "node-a" / "s3-mirror.jsonl")
    print("\n[measured] tiny checkpoint uploads: " + ", ".join(
        f"step {r['step']}: {r['files']} files, {r['bytes']} B, {r['seconds']:.2f}s, retries {r['retries']}"
        for r in records))

    # A new node: empty output and checkpoint dir, same S3 prefix, and no faults.
    cfg.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"training": {"maxSteps": 30}, "checkpoint": {
        "interval": 10, "keep": 1, "s3": {"uri": f"s3://{bucket}/tiny", "endpointUrl": s3_url}}}})))
    second = train_from_file(str(cfg), str(tmp_path / "node-b"), progress=False)

    saved = json.loads((tmp_path / "node-b" / "summary.json").read_text())
    assert saved["resumed_from_step"] == 20 and saved["steps"] == 30 and saved["completed"]
    assert second["s3_mirror"]["uploaded"] == [30]
    steps = [r["step"] for r in read_jsonl(tmp_path / "node-b" / "metrics.jsonl")]
    assert steps == list(range(21, 31)), "the resumed run continued at step 21"
    assert "step-00000030" in complete_steps(s3_url, bucket, prefix="tiny")


NODE_SCRIPT = """
import json, os, sys
from pathlib import Path
from rosetta_contract.checkpoint_fields import S3MirrorSpec
from rosetta_trainer.runtime.distributed import close, init_world
from rosetta_trainer.runtime.s3_client import RetryPolicy
from rosetta_trainer.checkpoints.s3_mirror import resume_point

world = init_world("cpu", timeout_s=60)
spec = S3MirrorSpec(uri=sys.argv[1], endpoint_url=sys.argv[2])
path = resume_point(spec, Path(sys.argv[3]), world, RetryPolicy(first_delay_s=0.01, max_delay_s=0.05))
print("RESUME", json.dumps(str(path)))
close(world)
"""


@pytest.mark.slow
def test_every_node_with_an_empty_disk_fetches_the_checkpoint_rank_0_picked(s3_url, bucket, tmp_path):
    """Two single-process 'nodes' (gloo), each with its own empty checkpoint dir (node-local disks)."""
    import socket
    import subprocess
    import sys

    src = tmp_path / "src"
    for step in (10, 20):
        _upload(s3_url, bucket, fake_checkpoint(src, step))
    (tmp_path / "node.py").write_text(NODE_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, str(tmp_path / "node.py"), f"s3://{bucket}/runs/mt", s3_url,
             str(tmp_path / f"node-{rank}")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for rank, out in enumerate(outputs):
        (line,) = [text for text in out.splitlines() if text.startswith("RESUME ")]
        assert json.loads(line.split(" ", 1)[1]) == str(tmp_path / f"node-{rank}" / "step-00000020")
        assert tree(tmp_path / f"node-{rank}" / "step-00000020") == tree(src / "step-00000020")
