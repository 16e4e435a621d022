"""The finished run's figures travel from rank 0's termination message into status.progress."""

from __future__ import annotations

import json

from rosetta_contract import exits
from rosetta_contract import final_result as fr
from rosetta_operator.progress import final_progress, final_result

SUMMARY = {"steps": 600, "total_steps": 600, "final_loss": 1.08021, "final_score": 97.91, "best_score": 97.91,
           "completed": True, "test": {"bleu": 94.5}, "data": {"train": 20000}}


def pod(name: str, index: str, created: str, message: str, jobset: str = "qs") -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {"jobset.sigs.k8s.io/jobset-name": jobset},
                         "annotations": {"batch.kubernetes.io/job-completion-index": index}},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": message}}}]}}


def test_report_writes_one_line_the_operator_parses_back(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv("ROSETTA_TERMINATION_LOG", str(log))
    fr.report(SUMMARY)
    text = log.read_text()
    assert text.startswith("Result: ") and "\n" not in text and len(text.encode()) <= 4096
    assert fr.parse(text) == {"step": 600, "totalSteps": 600, "loss": 1.0802, "bleu": 97.91, "bestBleu": 97.91}


def test_report_outside_a_pod_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("ROSETTA_TERMINATION_LOG", raising=False)
    monkeypatch.setattr(exits, "DEFAULT_TERMINATION_LOG", str(tmp_path / "absent"))
    fr.report(SUMMARY)
    assert not (tmp_path / "absent").exists()


def test_non_finite_and_missing_figures_are_left_out():
    assert fr.result_of({"steps": 10, "final_score": float("nan"), "best_score": None, "final_loss": True}) == {"step": 10}


def test_parse_refuses_other_messages():
    assert fr.parse("DataInvalid: train.de:3: not UTF-8") is None
    assert fr.parse("Result: not json") is None
    assert fr.parse("Result: [1, 2]") is None
    assert fr.parse('Result: {"step": "600", "bleu": 1e999}') == {}


def test_the_newest_rank_0_pod_with_a_result_wins():
    old = pod("qs-node-0-0-a", "0", "2026-11-24T07:00:00Z", "Result: " + json.dumps({"step": 207}))
    new = pod("qs-node-0-0-b", "0", "2026-11-24T07:05:00Z", "Result: " + json.dumps({"step": 600, "bleu": 97.9}))
    rank1 = pod("qs-node-0-1-b", "1", "2026-11-24T07:05:00Z", "Result: " + json.dumps({"step": 1}))
    other = pod("x-node-0-0-c", "0", "2026-11-24T07:09:00Z", "Result: " + json.dumps({"step": 5}), jobset="x")
    assert final_result([old, rank1, new, other], "qs") == {"step": 600, "bleu": 97.9}
    assert final_result([rank1, other], "qs") is None


def test_final_progress_replaces_the_stale_scrape_and_says_100_percent():
    stale = {"step": 580, "totalSteps": 600, "percent": 96.7, "display": "97% 580/600", "bleu": 40.6,
             "etaSeconds": 21, "lastCheckpointStep": 400, "updatedAt": "t0"}
    got = final_progress(stale, {"step": 600, "totalSteps": 600, "bleu": 97.9}, "t1")
    assert got == {"step": 600, "totalSteps": 600, "percent": 100.0, "display": "100% 600/600", "bleu": 97.9,
                   "lastCheckpointStep": 400, "updatedAt": "t1"}
