"""`rosetta run` end to end: the rendered JobSet's pods as local processes, 2 nodes x 1 CPU process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rosetta_trainer.checkpoints.checkpoint import complete_checkpoints
from support.training import SHARED_CHECKPOINTS, TINY, deep_update, read_jsonl

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_training(tmp_path: Path, spec_patch: dict) -> Path:
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"spec": {"nodes": 2, "volumes": SHARED_CHECKPOINTS,
                                                               **spec_patch}})))
    return path


def rosetta_run(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "rosetta_cli", "run", "--no-progress", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs)


def wait_for_checkpoint(root: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (root / f"step-{step:08d}" / "COMPLETE").exists():
        assert proc.poll() is None, f"rosetta run ended before step {step}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no checkpoint at step {step} after {timeout} s"
        time.sleep(0.05)


def test_two_nodes_join_one_rendezvous_and_write_to_the_mapped_volume(tmp_path):
    cfg = write_training(tmp_path, {"training": {"maxSteps": 30}, "checkpoint": {"interval": 10, "keep": 2},
                                    "evaluation": {"interval": 10},
                                    "volumes": [*SHARED_CHECKPOINTS, {"name": "scratch", "mountPath": "/scratch",
                                                                      "emptyDir": {}}]})
    volume = tmp_path / "shared-volume"
    proc = rosetta_run(["-f", str(cfg), "--output", str(tmp_path / "run"), "--volume", f"runs={volume}",
                        # reaches the trainer only through the rendered ConfigMap
                        "--set", "spec.training.maxSteps=24"])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]

    trainer_out = volume / "tiny"
    summary = json.loads((trainer_out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["steps"] == summary["total_steps"] == 24
    assert [p.name for p in complete_checkpoints(trainer_out / "checkpoints")][-1] == "step-00000024"
    # pod logs are prefixed and both pods ran; each pod's launcher kept its log of the attempt beside the checkpoints
    assert "[tiny-node-0-0]" in out
    assert (tmp_path / "run" / "logs" / "tiny-node-0-1.log").stat().st_size > 0
    kept = [(trainer_out / "logs" / "attempt-0" / f"node-{n}.log").read_text() for n in (0, 1)]
    for n in (0, 1):
        header, _, printed = (tmp_path / "run" / "logs" / f"tiny-node-0-{n}.log").read_text().partition("\n")
        assert header.startswith("--- attempt 0: ") and printed == kept[n]
    assert "summary" in kept[0]
    # the claim is the mapped directory; the emptyDir is each pod's own
    assert [p.name for p in sorted((tmp_path / "run" / "pods" / "attempt-0").iterdir())] == ["pod-0", "pod-1"]
    assert all((tmp_path / "run" / "pods" / "attempt-0" / pod / "scratch").is_dir() for pod in ("pod-0", "pod-1"))

    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["phase"] == "Succeeded" and run["restarts"] == 0
    assert sorted(Path(p).name for p in run["plots"]) == ["bleu.png", "learning_rate.png", "loss.png"]
    for plot in run["plots"]:
        data = Path(plot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, plot
        assert plot in out  # the summary table prints where the plots are
    assert "validation BLEU" in out


def test_a_killed_pod_restarts_the_set_which_resumes_from_its_checkpoint(tmp_path):
    cfg = write_training(tmp_path, {"training": {"maxSteps": 150}, "checkpoint": {"interval": 10, "keep": 2},
                                    "evaluation": {"interval": 75}, "failurePolicy": {"maxRestarts": 2}})
    run_dir = tmp_path / "run"
    proc = rosetta_run(["-f", str(cfg), "--output", str(run_dir)])
    ckpts = run_dir / "volumes" / "runs" / "tiny" / "checkpoints"
    wait_for_checkpoint(ckpts, 20, proc)
    pods = json.loads((run_dir / "pods.json").read_text())
    victim = next(p for p in pods["pods"] if p["index"] == 1)
    os.killpg(victim["pgid"], signal.SIGKILL)  # the node is gone: launcher and worker at once
    killed_after = max(int(p.name.split("-")[1]) for p in complete_checkpoints(ckpts))

    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "exited with code" in out and "restarting every pod (restart 1 of 2)" in out
    run = json.loads((run_dir / "run.json").read_text())
    assert run["phase"] == "Succeeded" and run["restarts"] == 1

    summary = json.loads((run_dir / "volumes" / "runs" / "tiny" / "summary.json").read_text())
    assert summary["steps"] == 150 and summary["world_size"] == 2
    assert summary["restart_attempt"] == 1
    assert summary["resumed_from_step"] is not None and summary["resumed_from_step"] >= killed_after >= 20
    steps = [r["step"] for r in read_jsonl(run_dir / "volumes" / "runs" / "tiny" / "metrics.jsonl")]
    assert steps == list(range(1, 151))  # resumed where it stopped: no step lost, none repeated


def test_a_data_error_fails_the_set_at_once_with_the_trainers_words(tmp_path):
    """As on a cluster: the launcher exits with the class's code (65), which failurePolicy.actions
    fails at once, so no restart meets the same files again."""
    (tmp_path / "train.en").write_text("a\nb\nc\n")
    (tmp_path / "train.de").write_bytes(b"Die Katze.\n\xc3(\nHeute.\n")
    source = {"format": "pairs", "source": str(tmp_path / "train.en"), "target": str(tmp_path / "train.de")}
    cfg = write_training(tmp_path, {"data": {"train": [source]}, "failurePolicy": {"maxRestarts": 2}})
    proc = rosetta_run(["-f", str(cfg), "--output", str(tmp_path / "run"), "--allow-host-path"])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-4000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["phase"] == "Failed" and run["restarts"] == 0, run
    assert 65 in run["exit_codes"].values()
    assert "exited with code 65: DataInvalid: " in run["message"] and "not UTF-8 text" in run["message"]
    assert "not restarted: failurePolicy.actions fails it at once" in run["message"]
    assert "restarting every pod" not in out


def test_ctrl_c_stops_every_pod_after_a_checkpoint(tmp_path):
    cfg = write_training(tmp_path, {"training": {"maxSteps": 100000}, "checkpoint": {"interval": 10},
                                    "evaluation": {"interval": 100000}})
    run_dir = tmp_path / "run"
    proc = rosetta_run(["-f", str(cfg), "--output", str(run_dir)])
    ckpts = run_dir / "volumes" / "runs" / "tiny" / "checkpoints"
    wait_for_checkpoint(ckpts, 10, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["phase"] == "Stopped"
    for pod in json.loads((run_dir / "pods.json").read_text())["pods"]:
        with pytest.raises(ProcessLookupError):
            os.killpg(pod["pgid"], 0)  # nothing of the pod is left running
    # SIGTERM made the trainer write a last checkpoint past the periodic ones
    summary = json.loads((run_dir / "volumes" / "runs" / "tiny" / "summary.json").read_text())
    assert summary["stopped_early"] is True
    assert (ckpts / f"step-{summary['steps']:08d}" / "COMPLETE").exists()


def test_with_prepare_before_training_the_stage_pod_tokenizes_and_the_gang_reads_no_training_text(tmp_path):
    cfg = write_training(tmp_path, {"training": {"maxSteps": 4}, "checkpoint": {"interval": 4},
                                    "evaluation": {"interval": 4}, "data": {"prepare": "BeforeTraining"}})
    volume = tmp_path / "shared-volume"
    proc = rosetta_run(["-f", str(cfg), "--output", str(tmp_path / "run"), "--volume", f"runs={volume}"])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "then preparing the training data" in out
    stage_log = (tmp_path / "run" / "logs" / "tiny-stage-0-0.log").read_text()
    assert f"prepared: {volume}/tiny/prepared/" in stage_log, stage_log
    rank0 = (tmp_path / "run" / "logs" / "tiny-node-0-0.log").read_text()
    assert "tokenizer: reusing" in rank0 and "the training text was not read" in rank0, rank0[-3000:]
    assert json.loads((volume / "tiny" / "summary.json").read_text())["steps"] == 4
