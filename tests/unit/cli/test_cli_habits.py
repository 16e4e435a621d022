"""What kubectl users expect of `rosetta`: its name as invoked, completion, `-f -`, `-o
wide|name|jsonpath`, `get -w` and `-l`, events in `status`, `logs --all-ranks|--since|--previous`,
suspend and resume, and the Python client those verbs call. Without a cluster: the verbs run over a
stand-in Client (or a stand-in Cluster under the real Client); tests/cluster/test_cli_verbs.py runs
them against one."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

import rosetta_operator.client as client_module
from rosetta_cli.main import build_parser, completion_script, invoked_as, main
from rosetta_operator import (
    Client,
    InvalidArgument,
    TrainingEnded,
    TrainingNotFound,
    VerbError,
    WaitTimeout,
    describe,
    pod_logs,
)
from rosetta_operator.client_results import TrainingList, TrainingStatus, WatchEvent
from rosetta_operator.wait_goals import parse_for

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
NOW = datetime(2025, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def training(name: str = "mt", phase: str | None = "Running", **status) -> dict:
    return {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": ago(300), "resourceVersion": "7"},
            "spec": {"nodes": 2, "gpusPerNode": 8},
            "status": {"phase": phase, "jobSetName": name, **status} if phase else {}}


# ---------------------------------------------------------------------- the program's name


@pytest.mark.parametrize("argv0, prog", [("/usr/local/bin/kubectl-rosetta", "kubectl rosetta"),
                                         ("C:\\bin\\kubectl-rosetta.exe", "kubectl rosetta"),
                                         ("/venv/bin/rosetta", "rosetta"), ("-c", "rosetta")])
def test_the_program_is_named_as_it_was_invoked(argv0, prog):
    assert invoked_as(argv0.replace("\\", "/")) == prog


def test_the_kubectl_plugin_help_lists_the_cluster_verbs_first_and_not_the_local_ones(capsys):
    with pytest.raises(SystemExit):
        build_parser("kubectl rosetta").parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl rosetta [-h] [--version] COMMAND ...")
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert listed[:8] == ["submit", "get", "status", "logs", "wait", "suspend", "resume", "delete"]
    assert not {"train", "run", "operator", "prepare", "completion"} & set(listed)
    # Hidden from the help, not from the parser.
    assert build_parser("kubectl rosetta").parse_args(["crd"]).command == "crd"
    with pytest.raises(SystemExit):
        build_parser("kubectl rosetta").parse_args(["get", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl rosetta get") and "  kubectl rosetta get quickstart-cpu -w" in out
    assert "exit status:" in out and "  2    invalid input" in out


def test_rosetta_help_still_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: rosetta") and "train" in out and "suspend" in out


@pytest.mark.parametrize("verb", ["submit", "get", "status", "logs", "wait", "delete", "suspend", "resume",
                                  "tensorboard"])
def test_every_verb_help_has_examples_and_exit_statuses(verb, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([verb, "--help"])
    out = capsys.readouterr().out
    examples = out[out.index("examples:"):out.index("exit status:")]
    assert f"  rosetta {verb} " in examples
    assert "  1    the cluster said no" in out


# ------------------------------------------------------------------------------ completion


def test_the_bash_completion_completes_commands_options_files_and_training_names(tmp_path):
    script = tmp_path / "rosetta.bash"
    script.write_text(completion_script("bash"))

    def complete(*words: str) -> list[str]:
        # A stand-in `rosetta` answers the completion's own `rosetta get -o jsonpath=…`.
        run = subprocess.run(["bash", "-c", f'source {script}; rosetta() {{ echo "alpha beta"; }}; '
                              f'COMP_WORDS=({" ".join(words)}); COMP_CWORD={len(words) - 1}; _shtab_rosetta; '
                              'printf "%s\\n" "${COMPREPLY[@]}"'], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        return run.stdout.split()

    assert complete("rosetta", "su") == ["submit", "suspend"]
    assert complete("rosetta", "logs", "--a") == ["--all-ranks", "--attempt"]
    assert complete("rosetta", "status", "al") == ["alpha"]
    assert complete("rosetta", "submit", "-f", str(tmp_path / "rosetta.b")) == [str(script)]


def test_zsh_and_tcsh_scripts_and_the_command(capsys):
    assert completion_script("zsh").startswith("#compdef rosetta")
    assert "_rosetta_trainings" in completion_script("zsh")
    assert "complete rosetta" in completion_script("tcsh")
    assert main(["completion", "bash"]) == 0
    assert "-F _shtab_rosetta rosetta" in capsys.readouterr().out


# --------------------------------------------------------------------------------- -f -


def test_a_file_from_standard_input(monkeypatch, capsys):
    import rosetta_contract.document_arguments as arguments

    monkeypatch.setattr(arguments, "_stdin_copy", [])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(QUICKSTART.read_bytes())))
    assert main(["validate", "-f", "-", "--skip-data"]) == 0
    assert capsys.readouterr().out.startswith("ok: quickstart-cpu: 2 nodes")
    # Read once: a second command line of the same process gets the same copy.
    assert main(["render", "-f", "-"]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["ConfigMap", "JobSet"]


def test_an_invalid_document_from_standard_input_is_exit_2(monkeypatch, capsys):
    import rosetta_contract.document_arguments as arguments

    monkeypatch.setattr(arguments, "_stdin_copy", [])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"kind: TranslationTraining\n")))
    assert main(["submit", "-f", "-", "--kubeconfig", "/nonexistent"]) == 2
    assert "stdin.yaml" in capsys.readouterr().err


# ----------------------------------------------------------------------------- -o formats


def test_wide_rows_add_size_jobset_checkpoint_and_message():
    obj = training(message="running:  2/2\njobs ready", progress={"lastCheckpointStep": 400})
    out = describe.table([obj], NOW, wide=True).splitlines()
    assert out[0].split()[-5:] == ["NODES", "GPUS/NODE", "JOBSET", "CHECKPOINT", "MESSAGE"]
    assert out[1].endswith("2       8           mt       step 400     running: 2/2 jobs ready")
    assert describe.resource_name(obj) == "translationtraining.rosetta.dev/mt"


@pytest.mark.parametrize("template, text", [
    ("{.items[*].metadata.name}", "a b"),
    ('{range .items[*]}{.metadata.name}{"\\t"}{.status.phase}{"\\n"}{end}', "a\tRunning\nb\tFailed\n"),
    ('{.items[?(@.status.phase=="Running")].metadata.name}', "a"),
    ("{.items[0].spec}", '{"nodes":2,"gpusPerNode":8}'),
    ("phase: {.items[1].status.phase}, missing: {.items[0].nothing}.", "phase: Failed, missing: ."),
    ("{range .items[*]}{$.kind}/{.metadata.name} {end}", "List/a List/b "),
])
def test_jsonpath_templates_as_kubectl_reads_them(template, text):
    data = describe.as_list([training("a"), training("b", "Failed")])
    assert describe.jsonpath(template, data) == text


@pytest.mark.parametrize("template", ["{.items[", "{range .items[*]}", "{end}", '{"unclosed}', "{.a b c]}"])
def test_a_broken_jsonpath_is_refused_before_the_cluster(template, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["get", "-o", f"jsonpath={template}"])
    assert exc.value.code == 2 and "jsonpath" in capsys.readouterr().err


def test_watch_rows_keep_the_header_columns_and_widen_for_a_longer_cell():
    table = describe.WatchTable(["NAME", "PHASE"])
    assert table.lines([["mt", "Pending"]]) == "NAME   PHASE\nmt     Pending\n"
    assert table.lines([["a-much-longer-name", "Running"]]) == "a-much-longer-name   Running\n"
    assert table.lines([["mt", "Running"]]) == "mt                   Running\n"


# ---------------------------------------------------------------------------------- events


def event(reason: str, message: str, *, kind: str = "Pod", name: str = "mt-node-0-0-abcde", count: int = 1,
          first: float = 60, last: float = 60, type_: str = "Warning") -> dict:
    return {"type": type_, "reason": reason, "message": message, "count": count,
            "firstTimestamp": ago(first), "lastTimestamp": ago(last),
            "involvedObject": {"kind": kind, "name": name}, "source": {"component": "default-scheduler"}}


def test_status_ends_with_the_recent_events_oldest_first():
    events = describe.recent_events([
        event("FailedScheduling", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", count=5,
              first=600, last=30),
        event("Created", "created JobSet mt", kind="TranslationTraining", name="mt", first=700, last=700,
              type_="Normal")])
    out = describe.describe(training(), NOW, events=events).splitlines()
    at = out.index("Events:")
    assert [line.split()[:3] for line in out[at + 1:]] == [
        ["TYPE", "REASON", "AGE"], ["Normal", "Created", "11m"], ["Warning", "FailedScheduling", "30s"]]
    assert out[-1].split()[2:9] == ["30s", "(x5", "over", "10m)", "pod/mt-node-0-0-abcde", "default-scheduler", "0/3"]
    assert describe.describe(training(), NOW, events=[]).splitlines()[-1] == "Events:         <none>"
    assert "Events:" not in describe.describe(training(), NOW)


def test_only_the_last_events_are_kept():
    many = [event("Pulled", f"pulled {i}", first=1000 - i, last=1000 - i) for i in range(30)]
    kept = describe.recent_events(many)
    assert len(kept) == describe.EVENTS_SHOWN and kept[-1]["message"] == "pulled 29"


# ------------------------------------------------------------------------- the verbs' output


class FakeClient:
    """The Client's surface the verbs use, over canned trainings."""

    def __init__(self, objects: list[dict], changes: list[dict] = (), namespace: str = "team"):
        self.objects, self.changes, self.namespace = objects, list(changes), namespace
        self.cluster = None
        self.calls: list[tuple] = []

    def get(self, name):
        found = [o for o in self.objects if o["metadata"]["name"] == name]
        if not found:
            raise TrainingNotFound(f'translationtrainings.rosetta.dev "{name}" not found')
        return found[0]

    def list(self, label_selector=None, all_namespaces=False):
        self.calls.append(("list", label_selector, all_namespaces))
        return TrainingList(self.objects, "7")

    def watch(self, name=None, **kwargs):
        self.calls.append(("watch", name, kwargs))
        for obj in self.changes:
            yield WatchEvent("MODIFIED", obj)

    def status(self, name):
        obj = self.get(name)
        s = describe.summary(obj, NOW)
        return TrainingStatus(s["name"], s["namespace"], s["phase"], s["message"], {}, None, 0, 0, None, None, [],
                              [describe.event_summary(event("Evicted", "node drained"))], obj)

    def logs(self, name, **kwargs):
        self.calls.append(("logs", name, kwargs))
        kwargs["on_pod"]("--- node rank 0: pod mt-node-0-0-x ---")
        yield from ["[rank 0] one", "[rank 1] two"]

    def suspend(self, name):
        self.calls.append(("suspend", name))
        return True

    def resume(self, name):
        self.calls.append(("resume", name))
        return False


@pytest.fixture
def fake(monkeypatch):
    holder: dict = {}

    def install(objects, changes=()):
        holder["client"] = FakeClient(objects, changes)
        monkeypatch.setattr(client_module, "Client", lambda *a, **k: holder["client"])
        return holder["client"]
    return install


def test_an_empty_get_says_so_on_stderr_as_kubectl_does(fake, capsys):
    fake([])
    assert main(["get"]) == 0
    assert capsys.readouterr() == ("", "No resources found in team namespace.\n")
    assert main(["get", "-A"]) == 0
    assert capsys.readouterr().err == "No resources found\n"
    assert main(["get", "-o", "json"]) == 0  # a List, for scripts
    assert '"items": []' in capsys.readouterr().out


def test_get_with_a_label_selector_name_and_jsonpath(fake, capsys):
    client = fake([training("a"), training("b", "Failed")])
    assert main(["get", "-l", "team=nlp", "-o", "name"]) == 0
    assert capsys.readouterr().out == "translationtraining.rosetta.dev/a\ntranslationtraining.rosetta.dev/b\n"
    assert client.calls[-1] == ("list", "team=nlp", False)
    assert main(["get", "-o", "jsonpath={.items[*].status.phase}"]) == 0
    assert capsys.readouterr().out == "Running Failed\n"
    assert main(["get", "a", "-l", "team=nlp"]) == 2
    assert "selector" in capsys.readouterr().err


def test_get_watch_prints_a_row_at_each_change_but_not_for_its_age(fake, capsys):
    running = training("mt", "Running")
    client = fake([training("mt", "Pending")], changes=[running, running, training("mt", "Suspended")])
    assert main(["get", "mt", "-w", "--request-timeout", "5s"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert rows == [["NAME", "PHASE"], ["mt", "Pending"], ["mt", "Running"], ["mt", "Suspended"]]
    assert client.calls[-1] == ("watch", "mt", {"label_selector": None, "all_namespaces": False,
                                                "resource_version": "7", "timeout": 5.0})


def test_get_watch_as_yaml_is_one_stream(fake, capsys):
    fake([training("mt", "Pending")], changes=[training("mt", "Running")])
    assert main(["get", "-w", "-o", "yaml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["status"]["phase"] for d in docs] == ["Pending", "Running"]


def test_status_shows_events_and_gives_them_as_data(fake, capsys):
    fake([training()])
    assert main(["status", "mt"]) == 0
    out = capsys.readouterr().out
    assert "Events:" in out and "Evicted" in out and "node drained" in out
    assert main(["status", "mt", "-o", "jsonpath={.events[0].reason}"]) == 0
    assert capsys.readouterr().out == "Evicted\n"


def test_logs_prints_lines_and_announces_pods_on_stderr(fake, capsys):
    client = fake([training()])
    assert main(["logs", "mt", "--all-ranks", "--since", "10m", "-p"]) == 0
    assert capsys.readouterr() == ("[rank 0] one\n[rank 1] two\n", "--- node rank 0: pod mt-node-0-0-x ---\n")
    kwargs = client.calls[-1][2]
    assert (kwargs["all_ranks"], kwargs["since"], kwargs["previous"], kwargs["rank"]) == (True, 600.0, True, 0)


def test_suspend_and_resume_say_what_changed(fake, capsys):
    client = fake([training()])
    assert main(["suspend", "mt"]) == 0 and main(["resume", "mt"]) == 0
    assert capsys.readouterr().out == ("translationtraining.rosetta.dev/mt suspended\n"
                                       "translationtraining.rosetta.dev/mt resumed (no change)\n")
    assert client.calls[-2:] == [("suspend", "mt"), ("resume", "mt")]


# -------------------------------------------------------------------------------- the client


class FakeCluster:
    """What Client asks of kube.Cluster for suspend and resume."""

    namespace, server = "team", "https://127.0.0.1:6443"

    def __init__(self, obj: dict | None):
        self.obj, self.patches = obj, []

    def training(self, name):
        return self.obj

    def patch_training(self, name, patch):
        self.patches.append(patch)
        return self.obj


def test_suspend_and_resume_set_spec_suspend_once():
    cluster = FakeCluster(training())
    client = Client(cluster=cluster)
    assert client.suspend("mt") is True and cluster.patches == [{"spec": {"suspend": True}}]
    cluster.obj["spec"]["suspend"] = True
    assert client.suspend("mt") is False and len(cluster.patches) == 1
    assert client.resume("mt") is True and cluster.patches[-1] == {"spec": {"suspend": False}}


def test_a_finished_or_missing_training_cannot_be_suspended():
    with pytest.raises(VerbError, match="Succeeded: there is nothing to suspend") as exc:
        Client(cluster=FakeCluster(training(phase="Succeeded"))).suspend("mt")
    assert exc.value.exit_code == 1
    with pytest.raises(TrainingNotFound, match='"mt" not found in namespace "team"'):
        Client(cluster=FakeCluster(None)).resume("mt")


class WatchedCluster(FakeCluster):
    def __init__(self, versions):
        super().__init__(None)
        self.versions = versions

    def watch_training(self, name, deadline):
        yield from self.versions


def test_wait_returns_the_training_or_says_why_not():
    pending, done = training(phase="Pending"), training(phase="Succeeded")
    seen = []
    assert Client(cluster=WatchedCluster([pending, done])).wait("mt", on_change=seen.append) is done
    assert seen == [pending]
    with pytest.raises(TrainingEnded) as exc:
        Client(cluster=WatchedCluster([pending, training(phase="Failed", message="OOM")])).wait("mt")
    assert exc.value.phase == "Failed" and "ended Failed: OOM" in str(exc.value) and exc.value.exit_code == 1
    with pytest.raises(TrainingNotFound):
        Client(cluster=WatchedCluster([None])).wait("mt")
    with pytest.raises(WaitTimeout):
        Client(cluster=WatchedCluster([pending])).wait("mt", timeout=1)
    assert Client(cluster=WatchedCluster([pending, None])).wait_deleted("mt") is None
    ready = training(conditions=[{"type": "Running", "status": "True"}])
    assert Client(cluster=WatchedCluster([pending, ready])).wait("mt", condition="Running") is ready


@pytest.mark.parametrize("call", [lambda c: c.wait("mt", phase="Done"), lambda c: c.wait("mt", condition="A=maybe"),
                                  lambda c: next(c.logs("mt", rank=-1)), lambda c: next(c.logs("mt", since=0)),
                                  lambda c: parse_for("phase=Done")])
def test_what_no_cluster_could_do_is_exit_2(call):
    with pytest.raises(InvalidArgument) as exc:
        call(Client(cluster=FakeCluster(training())))
    assert exc.value.exit_code == 2


def test_submit_takes_a_model_or_a_mapping_and_validates_it_first():
    from rosetta_contract.spec import load_training
    from rosetta_contract.strict_model import ConfigError

    client = Client(cluster=FakeCluster(None))
    applied = []
    client.apply = lambda documents, **_: applied.extend(documents) or documents[0]
    model = load_training(QUICKSTART)
    assert client.submit(model)["metadata"]["name"] == "quickstart-cpu"
    assert "launcher" not in applied[0]["spec"]  # as set, not as defaulted: the server and operator default
    doc = yaml.safe_load(yaml.safe_dump(applied[0]))
    assert client.submit(doc, overrides=["spec.training.maxSteps=50"])["spec"]["training"]["maxSteps"] == 50
    with pytest.raises(ConfigError, match="spec.nodes"):
        client.submit(doc, overrides=["spec.nodes=0"])


# ---------------------------------------------------------------------------------- logs


def pod(name: str, index: int, attempt: int, created: float, deleting: bool = False) -> dict:
    meta = {"name": name, "uid": name, "creationTimestamp": ago(created),
            "labels": {"jobset.sigs.k8s.io/jobset-name": "mt", "jobset.sigs.k8s.io/job-index": "0",
                       "jobset.sigs.k8s.io/restart-attempt": str(attempt)},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}}
    if deleting:
        meta["deletionTimestamp"] = ago(1)
    return {"metadata": meta, "status": {}}


def test_the_previous_pod_of_a_rank_is_the_one_a_gang_restart_replaced():
    old, new = pod("mt-0-old", 0, 0, 300, deleting=True), pod("mt-0-new", 0, 1, 10)
    assert pod_logs.previous_pod([old, new, pod("mt-1-new", 1, 1, 10)], "mt", 0) is old
    assert pod_logs.previous_pod([new], "mt", 0) is None
    assert pod_logs.previous_pod([old, new], "mt", 1) is None


def test_lines_prefixes_every_rank_and_follows_them_at_once(monkeypatch):
    def fake_follow(cluster, name, *, rank, follow, out, err, sleep, **_):
        if follow:
            err.write(f"--- node rank {rank}: pod p{rank} ---\n")
        out.write(f"rank {rank} first\nrank {rank} sec")
        out.write("ond\nno newline at the end")
        return 0

    class Training:
        def existing_training(self, name):
            return training()
    monkeypatch.setattr(pod_logs, "follow_log", fake_follow)
    heard = []
    got = list(pod_logs.lines(Training(), "mt", all_ranks=True, follow=True, on_pod=heard.append))
    for rank in (0, 1):
        mine = [line for line in got if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] rank {rank} first", f"[rank {rank}] rank {rank} second",
                        f"[rank {rank}] no newline at the end"]
    assert sorted(heard) == ["--- node rank 0: pod p0 ---", "--- node rank 1: pod p1 ---"]
    assert list(pod_logs.lines(Training(), "mt", rank=1)) == ["rank 1 first", "rank 1 second", "no newline at the end"]


def test_lines_raises_the_readers_error_and_stops_the_readers_when_left(monkeypatch):
    def failing(cluster, name, **_):
        raise VerbError("the log of pod p broke off")
    monkeypatch.setattr(pod_logs, "follow_log", failing)
    with pytest.raises(VerbError, match="broke off"):
        list(pod_logs.lines(None, "mt"))

    stopped = threading.Event()

    def endless(cluster, name, *, out, sleep, **_):
        try:
            while True:
                out.write("tick\n")
                sleep(0.01)
        finally:
            stopped.set()
    monkeypatch.setattr(pod_logs, "follow_log", endless)
    lines = pod_logs.lines(None, "mt", follow=True)
    assert next(lines) == "tick"
    lines.close()
    assert stopped.wait(5)


# ------------------------------------------------------------------------- the SDK's example


def test_the_sdk_example_calls_the_client_as_it_is():
    """examples/sdk_quickstart.py needs a cluster to run; its calls are checked against the client's
    signatures instead: every method exists and takes the arguments given, every name imported from
    rosetta_operator is exported, every attribute read of a status is a field."""
    import ast
    import dataclasses
    import inspect

    import rosetta_operator

    tree = ast.parse((REPO / "examples" / "sdk_quickstart.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rosetta_operator":
            assert all(a.name in rosetta_operator.__all__ for a in node.names), ast.unparse(node)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "client"]
    assert {c.func.attr for c in calls} >= {"submit", "wait", "list", "logs", "suspend", "resume", "watch",
                                            "status", "delete"}
    for call in calls:
        method = getattr(Client, call.func.attr, None)
        assert callable(method), f"Client has no {call.func.attr}()"
        args = [None] * len(call.args)
        kwargs = {k.arg: None for k in call.keywords if k.arg}
        try:
            inspect.signature(method).bind(None, *args, **kwargs)
        except TypeError as exc:
            pytest.fail(f"{ast.unparse(call)}: {exc}", pytrace=False)
    fields = {f.name for f in dataclasses.fields(TrainingStatus)}
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "status"}
    assert read and read <= fields, read - fields
