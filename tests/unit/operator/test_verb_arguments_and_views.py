"""The cluster verbs' pure parts: arguments, durations, tables, pod choice, the event-file copy and the
kubeconfig rules. tests/cluster/test_cli_verbs.py runs the verbs themselves against a cluster."""

from __future__ import annotations

import argparse
import io
import tarfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import tomllib
import yaml

from rosetta_cli.main import build_parser, main
from rosetta_contract.strict_model import ConfigError
from rosetta_operator import describe
from rosetta_operator.event_files import extract
from rosetta_operator.kube import VerbError
from rosetta_operator.kubeconfig import connect
from rosetta_operator.pod_logs import container_state, has_log, header, rank_pod
from rosetta_operator.submit import kind_name, read_documents
from rosetta_operator.verb_arguments import duration_seconds
from rosetta_operator.wait_goals import parse_for

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
NOW = datetime(2025, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("1.5s", 1.5), ("10m", 600),
                                           ("1h30m", 5400), ("2h", 7200), ("1m30s", 90)])
def test_durations_read_as_kubectl_writes_them(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10x", "-5s", "1d"])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        duration_seconds(text)


def test_wait_for_takes_phases_conditions_and_delete():
    succeeded = {"status": {"phase": "Succeeded", "conditions": [{"type": "Running", "status": "False"}]}}
    assert str(parse_for("phase=succeeded")) == "phase Succeeded" and parse_for("phase=Succeeded").met(succeeded)
    assert not parse_for("phase=Failed").met(succeeded)
    assert parse_for("condition=Running=False").met(succeeded)
    assert not parse_for("condition=Running").met(succeeded)  # True by default
    assert parse_for("delete").met(None) and not parse_for("delete").met(succeeded)


@pytest.mark.parametrize("text", ["phase=Done", "condition=", "condition=Running=maybe", "Succeeded", "delete=1"])
def test_wait_for_refuses_what_it_cannot_wait_for(text):
    with pytest.raises(VerbError) as exc:
        parse_for(text)
    assert exc.value.exit_code == 2


def test_version_and_bad_arguments(capsys):
    from rosetta_trainer import __version__

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"rosetta {__version__}"
    for argv in (["logs", "x", "--rank", "-1"], ["get", "-o", "xml"], ["get", "-o", "jsonpath={.a"], ["wait", "x"],
                 ["wait", "x", "--for", "delete", "--timeout", "soon"], ["logs", "x", "--rank", "1", "--all-ranks"],
                 ["logs", "x", "--since", "0s"], ["get", "-w", "--request-timeout", "0"], ["completion", "fish"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2, argv


def test_the_kubectl_plugin_is_the_same_program():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-rosetta"] == scripts["rosetta"]


# ------------------------------------------------------------------------------ get, status


def training(**status) -> dict:
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": "mt", "namespace": "team", "creationTimestamp": ago(300)}, "status": status}


RUNNING = training(
    phase="Running", message="running: 2/2 jobs ready", restarts=1, preemptions=2, jobSetName="mt",
    startTime=ago(290),
    progress={"step": 450, "totalSteps": 1000, "display": "45% 450/1000", "etaSeconds": 550.0, "bleu": 31.234,
              "bestBleu": 32.0, "loss": 2.5, "epoch": 1.25, "tokensPerSecond": 1234.0, "lastCheckpointStep": 400,
              "lastCheckpoint": "/checkpoints/mt/step-400", "updatedAt": ago(10)},
    conditions=[{"type": "Valid", "status": "True", "reason": "SpecValid", "message": "", "lastTransitionTime": ago(290)},
                {"type": "Running", "status": "True", "reason": "AllJobsReady", "message": "all\njobs  ready",
                 "lastTransitionTime": ago(200)}])


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0, "0s"), (119, "119s"), (120, "2m"), (200, "3m20s"),
                                           (600, "10m"), (179 * 60, "179m"), (3 * 3600, "3h"), (5.5 * 3600, "5h30m"),
                                           (49 * 3600, "2d1h"), (-5, "0s")])
def test_durations_print_as_kubectl_prints_ages(seconds, text):
    assert describe.duration(seconds) == text


def test_the_eta_counts_down_from_the_last_report_while_running_only():
    assert describe.eta_seconds(RUNNING["status"], NOW) == 540.0
    assert describe.eta_seconds({**RUNNING["status"], "phase": "Succeeded"}, NOW) is None
    assert describe.eta_seconds({"phase": "Running", "progress": {"etaSeconds": 5, "updatedAt": ago(60)}}, NOW) == 0.0
    assert describe.eta_seconds({"phase": "Running"}, NOW) is None


def test_get_prints_kubectl_columns():
    pending = training(phase="Pending")
    pending["metadata"]["name"] = "a-longer-name"
    out = describe.table([RUNNING, pending], NOW)
    assert out == ("NAME            PHASE     PROGRESS       ETA   BLEU   RESTARTS   PREEMPTIONS   AGE\n"
                   "mt              Running   45% 450/1000   9m    31.2   1          2             5m\n"
                   "a-longer-name   Pending   -              -     -      0          0             5m\n")
    assert describe.table([RUNNING], NOW, namespaces=True).splitlines()[1].split()[:2] == ["team", "mt"]
    assert describe.table([training()], NOW).splitlines()[1].split() == ["mt", "-", "-", "-", "-", "0", "0", "5m"]


def test_status_shows_the_validation_loss_beside_the_training_loss():
    status = {**RUNNING["status"], "progress": {**RUNNING["status"]["progress"], "validationLoss": 2.75}}
    out = describe.describe({**RUNNING, "status": status}, NOW)
    assert "(epoch 1.25, loss 2.5000, validation loss 2.7500, 1234 tokens/s)" in out


def test_status_prints_one_training_in_full():
    out = describe.describe(RUNNING, NOW)
    fields = dict((k, v.strip()) for k, v in (line.split(":", 1) for line in out.splitlines()[:12]))
    assert fields == {
        "Name": "mt", "Namespace": "team", "Phase": "Running", "Message": "running: 2/2 jobs ready",
        "Progress": "45% 450/1000 (epoch 1.25, loss 2.5000, 1234 tokens/s), reported 10s ago", "ETA": "9m",
        "BLEU": "31.23 (best 32.00)", "Restarts": "1 (preemptions 2)",
        "Last checkpoint": "step 400 /checkpoints/mt/step-400", "JobSet": "mt",
        "Started": f"{ago(290)} (4m50s ago)", "Completed": "-"}
    assert out.splitlines()[12:] == [
        "Conditions:",
        "  TYPE      STATUS   REASON         AGE     MESSAGE",
        "  Valid     True     SpecValid      4m50s",
        "  Running   True     AllJobsReady   3m20s   all jobs ready"]
    assert "Conditions:     -" in describe.describe(training(), NOW)


def test_status_shows_the_after_training_evaluation():
    evaluation = {"phase": "Succeeded", "jobName": "mt-eval", "checkpoint": "best", "checkpointPath": "step-00000400",
                  "step": 400, "samples": 20, "rouge1": 41.2, "rougeL": 38.1}
    obj = {**RUNNING, "status": {**RUNNING["status"], "phase": "Succeeded", "evaluation": evaluation}}
    line = next(line for line in describe.describe(obj, NOW).splitlines() if line.startswith("Evaluation:"))
    assert line.split(":", 1)[1].strip() == ("Succeeded (best: step-00000400): ROUGE-1 41.20, ROUGE-L 38.10 "
                                             "on 20 test pairs, Job mt-eval")
    assert describe.summary(obj, NOW)["evaluation"] == evaluation
    assert "evaluation" not in describe.summary(RUNNING, NOW) and "Evaluation:" not in describe.describe(RUNNING, NOW)


def test_status_as_data_has_the_same_figures():
    figures = describe.summary(RUNNING, NOW)
    assert figures["etaSeconds"] == 540.0 and figures["lastCheckpointStep"] == 400 and figures["restarts"] == 1
    assert yaml.safe_load(describe.dump(figures, "yaml")) == figures
    assert describe.as_list([RUNNING])["items"] == [RUNNING]


# ------------------------------------------------------------------------------------ pods


def pod(name: str, index: int, created: int, *, jobset: str = "mt", state: str | None = "running",
        deleting: bool = False, attempt: str = "0") -> dict:
    meta = {"name": name, "uid": name, "creationTimestamp": ago(created),
            "labels": {"jobset.sigs.k8s.io/jobset-name": jobset, "jobset.sigs.k8s.io/job-index": "0",
                       "jobset.sigs.k8s.io/restart-attempt": attempt},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}}
    if deleting:
        meta["deletionTimestamp"] = ago(1)
    statuses = [{"name": "trainer", "state": {state: {}}}] if state else []
    return {"metadata": meta, "status": {"containerStatuses": statuses}}


def test_the_pod_of_a_rank_is_the_newest_of_its_index_not_being_deleted():
    old, new = pod("mt-node-0-0-aaaaa", 0, 300, deleting=True), pod("mt-node-0-0-bbbbb", 0, 10, attempt="1")
    pods = [old, new, pod("mt-node-0-1-ccccc", 1, 10), pod("other-node-0-0-ddddd", 0, 1, jobset="other")]
    assert rank_pod(pods, "mt", 0) is new
    assert rank_pod([old, pod("mt-node-0-1-ccccc", 1, 10)], "mt", 0) is old  # nothing newer: still its log
    assert rank_pod(pods, "mt", 1)["metadata"]["name"] == "mt-node-0-1-ccccc"
    assert rank_pod(pods, "mt", 2) is None
    assert header(new, 0) == "--- node rank 0: pod mt-node-0-0-bbbbb, gang restart 1 ---"
    assert header(pods[2], 1) == "--- node rank 1: pod mt-node-0-1-ccccc ---"


@pytest.mark.parametrize("state, log", [("running", True), ("terminated", True), ("waiting", False), (None, False)])
def test_only_a_started_container_has_a_log(state, log):
    p = pod("p", 0, 1, state=state)
    assert container_state(p) == state and has_log(p) is log


# ------------------------------------------------------------------------------ tensorboard


def archive(members: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buf.getvalue()


def test_the_event_files_are_unpacked_and_nothing_else(tmp_path):
    data = archive({"tensorboard/events.out.tfevents.1": b"e1", "tensorboard/eval/events.out.tfevents.2": b"e2",
                    "tensorboard/../../escape": b"x", "/etc/cron.d/x": b"x", "other/file": b"x"},
                   links=("tensorboard/link",))
    dest = tmp_path / "copy"
    assert extract(data, dest) == 2
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "copy/eval/events.out.tfevents.2", "copy/events.out.tfevents.1"]


# ----------------------------------------------------------------------------------- submit


def test_submit_applies_every_document_with_the_overrides(tmp_path):
    docs = read_documents(str(QUICKSTART), ["spec.training.maxSteps=50"])
    assert [kind_name(d) for d in docs] == ["persistentvolumeclaim/quickstart-cpu-checkpoints",
                                            "translationtraining.rosetta.dev/quickstart-cpu"]
    assert docs[1]["spec"]["training"]["maxSteps"] == 50
    assert "maxRestarts" in docs[1]["spec"]["failurePolicy"] and "launcher" not in docs[1]["spec"]  # as written
    single = tmp_path / "one.yaml"
    single.write_text(yaml.safe_dump(docs[1]))
    assert read_documents(str(single), []) == [docs[1]]


def test_submit_refuses_an_invalid_file_before_the_cluster(tmp_path):
    with pytest.raises(ConfigError, match="spec.nodes"):
        read_documents(str(QUICKSTART), ["spec.nodes=0"])
    nameless = tmp_path / "two.yaml"
    nameless.write_text(QUICKSTART.read_text().replace("name: quickstart-cpu-checkpoints\n", "labels: {}\n", 1))
    with pytest.raises(ConfigError, match="metadata.name"):
        read_documents(str(nameless), [])
    assert main(["submit", "-f", str(QUICKSTART), "--set", "spec.nodes=0", "--kubeconfig", "/nonexistent"]) == 2


# -------------------------------------------------------------------------------- kubeconfig


def kubeconfig(path: Path) -> str:
    cluster = {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "team"}},
                     {"name": "prod", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def test_the_namespace_is_chosen_as_kubectl_chooses_it(tmp_path, monkeypatch):
    path = kubeconfig(tmp_path / "config")
    assert connect(path).namespace == "team"
    assert connect(path, namespace="other").namespace == "other"
    assert connect(path, context="prod").namespace == "default"
    monkeypatch.setenv("KUBECONFIG", path)
    got = connect()
    assert (got.namespace, got.context, got.server) == ("team", "dev", "https://127.0.0.1:6443")
    with pytest.raises(VerbError, match="nowhere"):
        connect(path, context="nowhere")


def test_without_any_kubeconfig_the_error_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(VerbError, match="--kubeconfig") as exc:
        connect()
    assert exc.value.exit_code == 1


def test_status_says_why_each_attempt_ended_and_which_nodes_are_kept_out():
    status = {**RUNNING["status"],
              "attempts": [{"attempt": 0, "startTime": "2025-05-01T11:00:00Z", "endTime": "2025-05-01T11:30:00Z",
                            "reason": "NodeUnhealthy", "pod": "mt-node-0-1-x", "node": "gpu-7", "exitCode": 81,
                            "lastStep": 300, "message": "pod mt-node-0-1-x on node gpu-7: GPU 0\nfailed"},
                           {"attempt": 1, "startTime": "2025-05-01T11:31:00Z"}],
              "excludedNodes": [{"node": "gpu-7", "reason": "NodeUnhealthy", "attempt": 0,
                                 "time": "2025-05-01T11:30:00Z", "message": "GPU 0 failed"}]}
    out = describe.describe({**RUNNING, "status": status}, NOW).splitlines()
    attempts = out.index("Attempts:")
    assert out[attempts + 1].split() == ["ATTEMPT", "REASON", "ENDED", "STEP", "POD", "NODE", "EXIT", "MESSAGE"]
    assert out[attempts + 2].split()[:8] == ["0", "NodeUnhealthy", "30m", "ago", "300", "mt-node-0-1-x", "gpu-7", "81"]
    assert out[attempts + 2].endswith("GPU 0 failed")  # one line, whatever the message held
    assert out[attempts + 3].split()[:3] == ["1", "running", "-"]
    excluded = out.index("Excluded nodes:")
    assert out[excluded + 2].split()[:4] == ["gpu-7", "NodeUnhealthy", "0", "30m"]
    assert "Attempts:" not in describe.describe(RUNNING, NOW)
