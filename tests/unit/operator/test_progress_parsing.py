"""Trainer metrics → status.progress (operator/rosetta_operator/progress.py), and finding rank 0."""

from __future__ import annotations

import pytest

from rosetta_operator import progress as pr
from rosetta_operator.crd_status import status_schema

RUN = 'training="mt",namespace="team"'
TEXT = f"""
# HELP rosetta_step Optimizer steps taken
# TYPE rosetta_step gauge
rosetta_step{{{RUN}}} 120.0
rosetta_total_steps{{{RUN}}} 600.0
rosetta_epoch{{{RUN}}} 1.23456
rosetta_loss{{{RUN}}} 2.345678
rosetta_learning_rate{{{RUN}}} 0.0005
rosetta_tokens_per_second{{{RUN}}} 12345.67
rosetta_mfu{{{RUN}}} NaN
rosetta_step_seconds{{{RUN}}} 0.5
rosetta_last_checkpoint_step{{{RUN}}} 100.0
rosetta_last_checkpoint_info{{{RUN},path="/ckpt/mt/checkpoints/step-00000100"}} 1.0
rosetta_bleu{{{RUN}}} 27.456
rosetta_best_bleu{{{RUN}}} 28.1
rosetta_validation_loss{{{RUN}}} 3.123456
rosetta_eval_bleu{{{RUN},lang="de"}} 27.456
rosetta_gpu_memory_bytes{{{RUN},rank="0"}} 1e9
rosetta_gpu_memory_bytes{{{RUN},rank="1"}} 2e9
python_gc_objects_collected_total{{generation="0"}} 10.0
"""
NOW = "2026-01-01T00:00:00Z"


def test_parse_keeps_run_gauges_labelled_series_and_the_checkpoint_path():
    m = pr.parse_metrics(TEXT)
    assert m["rosetta_step"] == 120
    assert "rosetta_mfu" not in m  # NaN: not reported
    assert m["rosetta_eval_bleu"] == {"de": 27.456}
    assert m["rosetta_gpu_memory_bytes"] == {"0": 1e9, "1": 2e9}
    assert m["rosetta_last_checkpoint_info"] == "/ckpt/mt/checkpoints/step-00000100"
    assert not any(k.startswith("python_") for k in m)


def test_progress_has_every_figure_and_only_declared_fields():
    p = pr.progress_from(pr.parse_metrics(TEXT), now=NOW)
    assert p == {
        "step": 120, "totalSteps": 600, "percent": 20.0, "display": "20% 120/600", "epoch": 1.2346,
        "loss": 2.3457, "learningRate": 0.0005, "tokensPerSecond": 12345.7, "etaSeconds": 240.0,
        "bleu": 27.46, "bestBleu": 28.1, "validationLoss": 3.1235, "lastCheckpointStep": 100,
        "lastCheckpoint": "/ckpt/mt/checkpoints/step-00000100", "updatedAt": NOW,
    }
    declared = status_schema()["properties"]["progress"]["properties"]
    assert set(p) <= set(declared)


@pytest.mark.parametrize("metrics, expected", [
    ({}, None),                                                      # trainer up, no step logged yet
    ({"rosetta_step": 3.0}, {"step": 3, "display": "step 3", "updatedAt": NOW}),
    ({"rosetta_step": 700.0, "rosetta_total_steps": 600.0},          # never past 100 %
     {"step": 700, "totalSteps": 600, "percent": 100.0, "display": "100% 700/600", "updatedAt": NOW}),
    ({"rosetta_step": 1.0, "rosetta_total_steps": 4.0, "rosetta_eval_bleu": {"de": 10.0, "fr": 20.0}},
     {"step": 1, "totalSteps": 4, "percent": 25.0, "display": "25% 1/4", "bleu": 15.0, "updatedAt": NOW}),
])
def test_progress_edge_cases(metrics, expected):
    assert pr.progress_from(metrics, now=NOW) == expected


@pytest.mark.parametrize("phases, activity", [
    ({"train": 1.0, "evaluate": 0.0, "checkpoint": 0.0}, "training"),
    ({"train": 0.0, "evaluate": 1.0, "checkpoint": 0.0}, "evaluating"),
    ({"train": 0.0, "evaluate": 0.0, "checkpoint": 1.0}, "checkpointing"),
    ({"train": 1.0, "evaluate": 1.0}, None),   # not one thing: not said
    ({"sleeping": 1.0}, None),
])
def test_progress_says_what_rank_0_is_doing(phases, activity):
    p = pr.progress_from({"rosetta_step": 3.0, "rosetta_phase": phases}, now=NOW)
    assert p.get("activity") == activity
    declared = status_schema()["properties"]["progress"]["properties"]["activity"]["enum"]
    assert activity is None or activity in declared


def test_only_a_moved_figure_is_a_change():
    p = pr.progress_from(pr.parse_metrics(TEXT), now=NOW)
    assert not pr.changed(p, {**p, "updatedAt": "2026-01-01T00:00:15Z"})
    assert pr.changed(p, {**p, "step": 121})
    assert pr.changed(None, p)


def pod(name, index="0", ip="10.0.0.5", jobset="mt", created="2026-01-01T00:00:00Z", phase="Running",
        job_index="0", **meta):
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {pr.JOBSET_NAME_LABEL: jobset, pr.JOB_INDEX_LABEL: job_index},
                         "annotations": {"batch.kubernetes.io/job-completion-index": index}, **meta},
            "status": {"podIP": ip, "phase": phase}}


@pytest.mark.parametrize("pods, expected", [
    ([pod("a", index="1"), pod("b")], "b"),
    ([pod("a", jobset="other"), pod("b", ip=None)], None),                    # other JobSet; no IP yet
    ([pod("old", created="2026-01-01T00:00:00Z"), pod("new", created="2026-01-01T01:00:00Z")], "new"),
    ([pod("gone", deletionTimestamp="2026-01-01T00:00:00Z"), pod("done", phase="Failed")], None),
    ([pod("other-job", job_index="1")], None),
])
def test_rank0_pod(pods, expected):
    found = pr.rank0_pod(pods, "mt")
    assert (found and found["metadata"]["name"]) == expected


def test_rank0_pod_by_label_alone_and_ipv6_url():
    p = pod("a")
    del p["metadata"]["annotations"]
    p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "0"
    assert pr.rank0_pod([p], "mt") is p
    assert pr.metrics_url(pod("b", ip="fd00::5"), 9400) == "http://[fd00::5]:9400/metrics"
    assert pr.metrics_url(p, 9400) == "http://10.0.0.5:9400/metrics"
