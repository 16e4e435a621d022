"""`rosetta run` with model.source and data.source on S3 (moto's server): the stage job's pod runs
first and copies a pretrained model and the corpora onto the shared volume, then the gang fine-tunes
that model from there with the hub offline; a source that is not there stops the run before any pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
import yaml

from rosetta_trainer.preparation.staging import MARKER
from support.s3_server import moto_s3
from support.tiny_models import PAIRS, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.slow

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A bucket with a tiny pretrained model under models/tiny/ and JSONL corpora under corpora/."""
    root = tmp_path_factory.mktemp("upload")
    tokenizer = tiny_tokenizer(root / "tokenizer")
    model_dir = root / "model"
    tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    bucket = f"staging-{uuid.uuid4().hex[:10]}"
    with moto_s3() as url:
        client = boto3.client("s3", endpoint_url=url, **{k.lower(): v for k, v in AWS_ENV.items()
                                                         if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")},
                              region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        for path in model_dir.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), bucket, f"models/tiny/{path.relative_to(model_dir).as_posix()}")
        for split, rows in (("train", PAIRS[:200]), ("valid", PAIRS[200:224])):
            body = "".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in rows)
            client.put_object(Bucket=bucket, Key=f"corpora/{split}.jsonl", Body=body.encode())
        yield url, bucket


def training(url: str, bucket: str, model_prefix: str = "models/tiny") -> dict:
    return {
        "apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "metadata": {"name": "staged"},
        "spec": {
            "model": {"name": "/shared/models/tiny",
                      "source": {"uri": f"s3://{bucket}/{model_prefix}", "endpointUrl": url}},
            "data": {"sourceLang": "en", "targetLangs": ["de"],
                     "source": {"uri": f"s3://{bucket}/corpora", "path": "/shared/corpora", "endpointUrl": url},
                     "train": [{"format": "jsonl", "path": "/shared/corpora/train.jsonl"}],
                     "validation": [{"format": "jsonl", "path": "/shared/corpora/valid.jsonl"}],
                     "maxSourceLength": 48, "maxTargetLength": 48},
            "training": {"maxSteps": 4, "batch": {"sentences": 8}, "learningRate": 1e-3, "logInterval": 1},
            "checkpoint": {"interval": 4, "keep": 1},
            "evaluation": {"interval": 4, "beams": 1, "maxSamples": 8, "maxNewTokens": 8},
            "metrics": {"port": 0},
            "volumes": [{"name": "shared", "mountPath": "/shared", "purpose": "model",
                         "persistentVolumeClaim": {"claimName": "shared"}}],
        },
    }


def rosetta_run(tmp_path: Path, doc: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, **AWS_ENV, "PYTHONUNBUFFERED": "1", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    return subprocess.run([sys.executable, "-m", "rosetta_cli", "run", "--no-progress", "-f", str(path),
                           "--output", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=900)


def test_the_model_and_corpora_are_staged_then_fine_tuned_offline(s3, tmp_path):
    url, bucket = s3
    res = rosetta_run(tmp_path, training(url, bucket))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["phase"] == "Succeeded"
    shared = tmp_path / "run" / "volumes" / "shared"
    assert json.loads((shared / "models" / "tiny" / MARKER).read_text())["uri"] == f"s3://{bucket}/models/tiny"
    assert (shared / "models" / "tiny" / "model.safetensors").exists()
    assert (shared / "corpora" / "train.jsonl").read_text().count("\n") == 200
    stage_log = (tmp_path / "run" / "logs" / "staged-stage-0-0.log").read_text()
    assert f"model: s3://{bucket}/models/tiny -> " in stage_log and "copied" in stage_log
    # The gang fine-tuned the staged model: its log says it loaded it from the volume.
    summary = json.loads(next((tmp_path / "run").rglob("summary.json")).read_text())
    assert summary["steps"] == 4


def test_a_missing_source_stops_the_run_before_any_pod(s3, tmp_path):
    url, bucket = s3
    res = rosetta_run(tmp_path, training(url, bucket, model_prefix="models/nothing-here"))
    assert res.returncode == 1
    assert "staging failed" in res.stderr and "no objects under this prefix" in res.stderr
    assert "Traceback" not in res.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["phase"] == "Failed" and "no objects under this prefix" in run["message"]
    assert not list((tmp_path / "run" / "logs").glob("staged-node-*"))
