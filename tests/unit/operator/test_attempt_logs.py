"""`rosetta logs NAME --attempt N`: which nodes' kept logs are read, from where, by what pod, and what
is said when there is none. The pure parts (attempt_logs) directly; the reading (attempt_log_reader) over a
stand-in cluster whose reader pods "run" their argv against an in-memory output directory, and over moto's S3.
tests/cluster/test_real_pods.py reads a real attempt's log on a real node."""

from __future__ import annotations

import copy
import posixpath
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

import rosetta_operator.client as client_module
from rosetta_cli.main import main
from rosetta_contract.failures import attempt_log_path
from rosetta_contract.spec import parse_spec
from rosetta_contract.trainer_pod import DEFAULT_IMAGE
from rosetta_operator import Client, VerbError, attempt_log_reader, attempt_logs
from rosetta_operator.render import render

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
OUTPUT = "/checkpoints/mt"  # the quickstart's checkpoints mountPath, then the training's name


def training(attempts: list[dict] | None = None, **spec_changes) -> dict:
    doc = [d for d in yaml.safe_load_all(QUICKSTART.read_text()) if d["kind"] == "TranslationTraining"][0]
    doc["metadata"] = {"name": "mt", "namespace": "team", "uid": "uid-mt"}
    doc["spec"].update(spec_changes)
    doc["status"] = {"phase": "Failed", "jobSetName": "mt", **({"attempts": attempts} if attempts else {})}
    return doc


def oom(attempt: int = 1, rank: int = 1) -> dict:
    return {"attempt": attempt, "reason": "OOMKilled", "exitCode": 137, "pod": f"mt-node-0-{rank}-x7k2p",
            "nodeRank": rank, "lastStep": 420}


def rendered_template(doc: dict) -> dict:
    jobset = render("mt", "team", parse_spec(doc["spec"], allow_host_path=True)).jobset
    return attempt_logs.trainer_template(jobset)


# ------------------------------------------------------------------------------ pure parts


@pytest.mark.parametrize("record, rank, all_ranks, ranks", [
    (None, None, False, [0]),                       # nothing recorded: node 0
    (oom(rank=1), None, False, [0, 1]),             # node 0 and the node that failed
    (oom(rank=0), None, False, [0]),
    ({"attempt": 1, "reason": "Preempted"}, None, False, [0]),  # no node named
    (oom(rank=9), None, False, [0]),                # a rank the training does not have
    (oom(rank=1), 0, False, [0]),                   # --rank wins
    (oom(rank=1), None, True, [0, 1, 2, 3]),        # --all-ranks
])
def test_node_0_and_the_failing_node_by_default(record, rank, all_ranks, ranks):
    assert attempt_logs.chosen_ranks(4, record, rank, all_ranks) == ranks


def test_the_record_of_the_attempt_is_found_in_the_status():
    doc = training([oom(0, 1), oom(1, 0)])
    assert attempt_logs.attempt_record(doc, 1)["nodeRank"] == 0
    assert attempt_logs.attempt_record(doc, 2) is None
    assert attempt_logs.attempt_record({"metadata": {}}, 0) is None  # no status.attempts: optional


def test_the_header_names_the_failing_pod_and_why():
    assert attempt_logs.header(1, 1, oom()) == "==> attempt 1, node 1 (pod mt-node-0-1-x7k2p, OOMKilled, exit 137) <=="
    assert attempt_logs.header(1, 0, oom()) == "==> attempt 1, node 0 <=="
    assert attempt_logs.header(3, 2, None) == "==> attempt 3, node 2 <=="


def test_files_and_s3_keys_follow_the_contract_path_rotated_half_first():
    assert attempt_logs.file_names(2, 1) == ["node-1.log.1", "node-1.log"]
    assert attempt_logs.attempt_dir(2) == posixpath.dirname(attempt_log_path(2, 1)) == "logs/attempt-2"
    assert attempt_logs.s3_keys("runs/mt", 2, 1) == ["runs/mt/logs/attempt-2/node-1.log.1",
                                                     "runs/mt/logs/attempt-2/node-1.log"]
    assert attempt_logs.s3_keys("", 0, 0) == ["logs/attempt-0/node-0.log.1", "logs/attempt-0/node-0.log"]
    assert attempt_logs.kept_attempts(["attempt-10", "attempt-2/", "junk", "attempt-x"]) == [2, 10]
    assert attempt_logs.ranks_with_log(["node-3.log.1", "node-0.log", "node-1.log.tmp"]) == [0, 3]


def test_the_output_directory_is_found_on_the_pod_template():
    storage = attempt_logs.storage_of(rendered_template(training()))
    assert storage.output == OUTPUT and storage.mount["mountPath"] == "/checkpoints"
    assert storage.volume["persistentVolumeClaim"]["claimName"] == "quickstart-cpu-checkpoints"
    assert storage.image == DEFAULT_IMAGE and storage.security_context["runAsUser"] == 10001
    assert attempt_logs.not_shared(storage, 1) is None


@pytest.mark.parametrize("volumes, said", [  # one node: a multi-node spec must share its volume
    ([], "on an emptyDir (volume output), which is deleted with its pod: the logs were not kept beyond the pods"),
    ([{"name": "checkpoints", "mountPath": "/checkpoints", "purpose": "checkpoints", "emptyDir": {}}],
     "on an emptyDir (volume checkpoints)"),
    ([{"name": "checkpoints", "mountPath": "/checkpoints", "purpose": "checkpoints", "hostPath": {"path": "/mnt/ckpt"}}],
     "on hostPath /mnt/ckpt of each node that ran a pod"),
])
def test_an_output_directory_that_no_other_pod_can_mount_is_said_so(volumes, said):
    storage = attempt_logs.storage_of(rendered_template(training(volumes=volumes, nodes=1)))
    assert said in attempt_logs.not_shared(storage, 1)


def test_the_reader_pod_meets_the_restricted_pod_security_standard():
    storage = attempt_logs.storage_of(rendered_template(training()))
    commands = {**attempt_logs.listing_commands(storage, 1),
                **attempt_logs.cat_commands(storage, 1, attempt_logs.file_names(1, 1))}
    pod = attempt_logs.reader_pod(training(), storage, 1, commands, deadline_seconds=240)
    spec = pod["spec"]
    assert pod["metadata"]["generateName"] == "mt-attempt-1-logs-" and pod["metadata"]["namespace"] == "team"
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
                                                   "name": "mt", "uid": "uid-mt"}]
    labels = pod["metadata"]["labels"]
    assert labels[attempt_logs.READER_LABEL] == "mt" and labels[attempt_logs.ATTEMPT_LABEL] == "1"
    assert "rosetta.dev/training" not in labels  # the operator watches those pods
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 240
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["volumes"] == [{"name": "output", "persistentVolumeClaim": {"claimName": "quickstart-cpu-checkpoints",
                                                                            "readOnly": True}}]
    assert [c["name"] for c in spec["containers"]] == ["attempts", "files", "node-1-rotated", "node-1"]
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
        assert c["volumeMounts"] == [{"name": "output", "mountPath": "/checkpoints", "readOnly": True}]
        assert c["image"] == DEFAULT_IMAGE and c["resources"]["limits"]["memory"]
        assert c["command"][0] in ("ls", "cat") and c["command"][-2] == "--"  # argv, no shell
    assert spec["containers"][0]["command"] == ["ls", "-1", "--", f"{OUTPUT}/logs"]
    assert spec["containers"][3]["command"] == ["cat", "--", f"{OUTPUT}/logs/attempt-1/node-1.log"]


# ------------------------------------------------------------------ a stand-in cluster


class Response:
    def __init__(self, text: str):
        self.data = text.encode()

    def release_conn(self) -> None:
        pass


def run(argv: list[str], files: dict[str, str]) -> tuple[int, str]:
    """What `ls -1 -- DIR` and `cat -- FILE` print and exit with over an in-memory tree."""
    tool, path = argv[0], argv[-1]
    if tool == "cat":
        return (0, files[path]) if path in files else (1, f"cat: {path}: No such file or directory\n")
    children = sorted({p[len(path) + 1:].split("/")[0] for p in files if p.startswith(path + "/")})
    if not children:
        return 2, f"ls: cannot access '{path}': No such file or directory\n"
    return 0, "".join(f"{c}\n" for c in children)


class FakeCore:
    """Reader pods that end as soon as they are read again, each container having run its argv; or,
    with `waiting`, one that never starts."""

    def __init__(self, files: dict[str, str], waiting: dict | None = None):
        self.files, self.waiting = files, waiting
        self.created: list[dict] = []
        self.deleted: list[str] = []
        self.ran: dict[str, dict[str, tuple[int, str]]] = {}

    def create_namespaced_pod(self, namespace, body):
        assert namespace == "team"
        name = f"{body['metadata']['generateName']}{len(self.created):05d}"
        self.created.append(copy.deepcopy(body))
        self.ran[name] = {c["name"]: run(c["command"], self.files) for c in body["spec"]["containers"]}
        return {"metadata": {**body["metadata"], "name": name}, "status": {"phase": "Pending"}}

    def read_namespaced_pod(self, name, namespace):
        if self.waiting is not None:
            return {"metadata": {"name": name}, "status": {"phase": "Pending", "containerStatuses": [
                {"name": "attempts", "state": {"waiting": self.waiting}}]}}
        codes = {c: code for c, (code, _) in self.ran[name].items()}
        return {"metadata": {"name": name}, "status": {
            "phase": "Succeeded" if not any(codes.values()) else "Failed",
            "containerStatuses": [{"name": c, "state": {"terminated": {"exitCode": code}}} for c, code in codes.items()]}}

    def read_namespaced_pod_log(self, name, namespace, container, _preload_content):
        return Response(self.ran[name][container][1])

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds):
        self.deleted.append(name)


class FakeCustom:
    def __init__(self, jobset: dict | None):
        self.jobset = jobset

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        assert (group, plural, name) == ("jobset.x-k8s.io", "jobsets", "mt")
        if self.jobset is None:
            raise ApiException(status=404, reason="Not Found")
        return self.jobset


class FakeApi:
    @staticmethod
    def sanitize_for_serialization(obj):
        return obj


class FakeCluster:
    namespace, server = "team", "https://127.0.0.1:6443"

    def __init__(self, obj: dict, files: dict[str, str], jobset: dict | None = None, waiting: dict | None = None):
        self.obj, self.core, self.custom, self.api = obj, FakeCore(files, waiting), FakeCustom(jobset), FakeApi()

    def existing_training(self, name):
        assert name == "mt"
        return self.obj

    def training(self, name):
        return self.obj


def kept(attempt: int, rank: int, text: str, rotated: str = "") -> dict[str, str]:
    path = f"{OUTPUT}/{attempt_log_path(attempt, rank)}"
    return {path: text, **({path + ".1": rotated} if rotated else {})}


FILES = {**kept(0, 0, "attempt 0 node 0 a\nattempt 0 node 0 b\n"), **kept(0, 1, "attempt 0 node 1\n"),
         **kept(1, 0, "attempt 1 node 0 a\nattempt 1 node 0 b\n"),
         **kept(1, 1, "then CUDA... no: Killed\n", rotated="older half\n")}


def read(cluster, attempt, **kwargs) -> tuple[list[str], list[str]]:
    heard: list[str] = []
    got = list(Client(cluster=cluster).attempt_logs("mt", attempt, on_header=heard.append, **kwargs))
    return got, heard


def test_a_failed_attempt_is_read_from_the_volume_by_a_reader_pod_that_is_then_deleted():
    cluster = FakeCluster(training([oom()]), FILES)
    got, heard = read(cluster, 1)
    assert got == ["[rank 0] attempt 1 node 0 a", "[rank 0] attempt 1 node 0 b",
                   "[rank 1] older half", "[rank 1] then CUDA... no: Killed"]
    assert heard == ["==> attempt 1, node 0 <==", "==> attempt 1, node 1 (pod mt-node-0-1-x7k2p, OOMKilled, exit 137) <=="]
    (pod,) = cluster.core.created
    assert cluster.core.deleted == ["mt-attempt-1-logs-00000"]
    # The JobSet is gone: its template was rendered from the spec, with the operator's default image.
    assert {c["image"] for c in pod["spec"]["containers"]} == {DEFAULT_IMAGE}


def test_one_node_is_printed_without_a_prefix_and_tail_keeps_its_last_lines():
    cluster = FakeCluster(training([oom()]), FILES)
    assert read(cluster, 1, rank=0, tail=1) == (["attempt 1 node 0 b"], ["==> attempt 1, node 0 <=="])
    assert read(cluster, 0)[0] == ["attempt 0 node 0 a", "attempt 0 node 0 b"]  # no record: node 0
    assert read(cluster, 0, all_ranks=True)[0] == ["[rank 0] attempt 0 node 0 a", "[rank 0] attempt 0 node 0 b",
                                                   "[rank 1] attempt 0 node 1"]
    assert len(cluster.core.deleted) == len(cluster.core.created) == 3


def test_the_pods_template_of_a_live_jobset_is_what_the_reader_copies(monkeypatch):
    doc = training()
    jobset = render("mt", "team", parse_spec(doc["spec"])).jobset
    attempt_logs.trainer_template(jobset)["spec"]["containers"][0]["image"] = "registry.example/trainer:pinned"
    cluster = FakeCluster(doc, FILES, jobset=jobset)
    assert read(cluster, 0)[0][0] == "attempt 0 node 0 a"
    assert {c["image"] for c in cluster.core.created[0]["spec"]["containers"]} == {"registry.example/trainer:pinned"}


def test_an_attempt_with_no_kept_log_names_the_attempts_kept():
    cluster = FakeCluster(training(), FILES)
    with pytest.raises(VerbError, match=r"^training mt has no kept log for attempt 7 \(attempts kept: 0, 1\)$") as exc:
        read(cluster, 7)
    assert exc.value.exit_code == 1 and len(cluster.core.deleted) == 1
    with pytest.raises(VerbError, match=r"no kept log for attempt 0 \(attempts kept: none\)"):
        read(FakeCluster(training(), {}), 0)
    with pytest.raises(VerbError, match=r"no kept log of node 1 in attempt 1 \(nodes with a log: 0\)"):
        read(FakeCluster(training(), kept(1, 0, "x\n")), 1, rank=1)
    with pytest.raises(VerbError, match=r"--rank 2: mt has 2 nodes") as exc:
        read(cluster, 1, rank=2)
    assert exc.value.exit_code == 2


def test_a_missing_failing_node_is_a_note_not_an_error():
    cluster = FakeCluster(training([oom()]), kept(1, 0, "only node 0\n"))
    got, heard = read(cluster, 1)
    assert got == ["[rank 0] only node 0"]
    assert heard == ["note: no kept log of node 1 in attempt 1", "==> attempt 1, node 0 <=="]


def test_an_output_on_an_empty_dir_was_not_kept_and_no_pod_is_made():
    cluster = FakeCluster(training(volumes=[], nodes=1), FILES)
    with pytest.raises(VerbError, match="no kept log for attempt 1 .*emptyDir .*not kept beyond the pods"):
        read(cluster, 1)
    assert cluster.core.created == []


def test_a_reader_pod_that_cannot_start_is_named_with_its_reason_and_deleted():
    cluster = FakeCluster(training(), FILES, waiting={"reason": "ImagePullBackOff", "message": "pull access denied"})
    with pytest.raises(VerbError, match=r"the log reader pod mt-attempt-1-logs-00000 in namespace team "
                                        r"\(phase Pending, container attempts ImagePullBackOff: pull access denied\)"):
        read(cluster, 1)
    assert cluster.core.deleted == ["mt-attempt-1-logs-00000"]
    slow = FakeCluster(training(), FILES, waiting={"reason": "ContainerCreating"})
    with pytest.raises(VerbError, match=r"^timed out after 0 s waiting for the log reader pod .* \(phase Pending"):
        read(slow, 1, timeout=0)
    assert len(slow.core.deleted) == 1


def test_many_nodes_are_read_by_several_pods_of_a_few_containers():
    files = {k: v for r in range(20) for k, v in kept(0, r, f"node {r}\n").items()}
    cluster = FakeCluster(training(nodes=20), files)
    got, _ = read(cluster, 0, all_ranks=True)
    assert got == [f"[rank {r}] node {r}" for r in range(20)]
    assert len(cluster.core.created) == 3 == len(cluster.core.deleted)
    assert max(len(p["spec"]["containers"]) for p in cluster.core.created) <= 2 + 2 * attempt_log_reader.RANKS_PER_READER


# ------------------------------------------------------------------------------------ S3


@pytest.fixture
def s3(monkeypatch, tmp_path):
    moto = pytest.importorskip("moto")
    import boto3

    from support.s3_server import isolate_aws_env

    isolate_aws_env(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield client


def mirrored(**changes) -> dict:
    return training([oom()], checkpoint={"interval": 200, "s3": {"uri": "s3://ckpt/runs/mt"}}, **changes)


def test_with_an_s3_mirror_the_logs_are_read_from_s3_with_the_users_credentials(s3):
    for key, body in (("runs/mt/logs/attempt-0/node-0.log", "first attempt\n"),
                      ("runs/mt/logs/attempt-1/node-0.log", "node 0 waited\n"),
                      ("runs/mt/logs/attempt-1/node-1.log.1", "older\n"),
                      ("runs/mt/logs/attempt-1/node-1.log", "newer, no line end")):
        s3.put_object(Bucket="ckpt", Key=key, Body=body.encode())
    cluster = FakeCluster(mirrored(), FILES)  # S3 first, though the volume has them too
    got, heard = read(cluster, 1)
    assert got == ["[rank 0] node 0 waited", "[rank 1] older", "[rank 1] newer, no line end"]
    assert heard[1].startswith("==> attempt 1, node 1 (pod mt-node-0-1-x7k2p")
    assert cluster.core.created == []  # no pod for S3
    alone = FakeCluster(mirrored(volumes=[], nodes=1), {})  # node-local output: only S3 has the logs
    assert read(alone, 0)[0] == ["first attempt"]
    with pytest.raises(VerbError) as exc:
        read(alone, 4)
    assert str(exc.value) == ("training mt has no kept log for attempt 4 (s3://ckpt/runs/mt/logs/: attempts kept: 0, 1; "
                              "its output directory /checkpoints/mt is on an emptyDir (volume output), which is "
                              "deleted with its pod: the logs were not kept beyond the pods)")


def test_what_s3_lacks_is_read_from_a_shared_volume_with_a_note(s3):
    s3.put_object(Bucket="ckpt", Key="runs/mt/logs/attempt-0/node-0.log", Body=b"uploaded\n")
    cluster = FakeCluster(mirrored(), FILES)
    got, heard = read(cluster, 1, rank=0)
    assert got == ["attempt 1 node 0 a", "attempt 1 node 0 b"] and len(cluster.core.created) == 1
    assert heard[0] == ("note: s3://ckpt/runs/mt/logs/: attempts kept: 0; read volume checkpoints (claim "
                        "quickstart-cpu-checkpoints) at /checkpoints/mt/logs/ instead")


def test_s3_that_refuses_is_named(s3, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(VerbError, match=r"^cannot read the kept log of attempt 1 of training mt \(listing "
                                        r"s3://ckpt/runs/mt/logs/attempt-1/: no AWS credentials in this environment"):
        read(FakeCluster(mirrored(volumes=[], nodes=1), {}), 1)
    # With a shared volume, the reader pod reads what S3 would not give.
    got, heard = read(FakeCluster(mirrored(), FILES), 1, rank=1)
    assert got == ["older half", "then CUDA... no: Killed"]
    assert heard[0].startswith("note: listing s3://ckpt/runs/mt/logs/attempt-1/: no AWS credentials")
    assert heard[0].endswith("; read volume checkpoints (claim quickstart-cpu-checkpoints) at /checkpoints/mt/logs/ "
                             "instead")


# ------------------------------------------------------------------------------- the verb


class FakeClient:
    cluster = None

    def __init__(self):
        self.calls: list[tuple] = []

    def attempt_logs(self, name, attempt, **kwargs):
        self.calls.append((name, attempt, kwargs))
        kwargs["on_header"]("==> attempt 1, node 0 <==")
        yield "line"


def test_the_verb_prints_lines_on_stdout_and_headers_on_stderr(monkeypatch, capsys):
    fake = FakeClient()
    monkeypatch.setattr(client_module, "Client", lambda *a, **k: fake)
    assert main(["logs", "mt", "--attempt", "1", "--tail", "5"]) == 0
    assert capsys.readouterr() == ("line\n", "==> attempt 1, node 0 <==\n")
    assert fake.calls == [("mt", 1, {"rank": None, "all_ranks": False, "tail": 5, "timeout": None,
                                     "on_header": fake.calls[0][2]["on_header"]})]
    assert main(["logs", "mt", "--attempt", "1", "--rank", "0", "--pod-running-timeout", "5m"]) == 0
    assert (fake.calls[-1][2]["rank"], fake.calls[-1][2]["timeout"]) == (0, 300.0)


@pytest.mark.parametrize("argv, said", [
    (["--attempt", "1", "-f"], "error: --attempt prints what was kept, once: -f cannot go with it"),
    (["--attempt", "1", "--since", "1m", "-p"], "--since, --previous cannot go with it"),
    (["--attempt", "-1"], "'-1' is not an attempt"),
])
def test_the_verb_refuses_what_a_kept_log_cannot_do(argv, said, monkeypatch, capsys):
    monkeypatch.setattr(client_module, "Client", lambda *a, **k: FakeClient())
    try:
        code = main(["logs", "mt", *argv])
    except SystemExit as exc:  # argparse
        code = exc.code
    assert code == 2 and said in capsys.readouterr().err
