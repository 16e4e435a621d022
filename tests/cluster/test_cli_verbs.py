"""The `rosetta` verbs that act on a cluster (`submit`, `get`, `status`, `logs`, `wait`, `delete`,
`suspend`, `resume`, `tensorboard`), `kubectl rosetta`, and the Python client they call, against
the live cluster and the real operator.

Logs and exec need a kubelet's API, which the simulated fleet's kwok does not serve. A second kwok
(`log_node`) manages one node of its own and serves it at 127.0.0.1, where the apiserver proxies
`kubectl logs` and `kubectl exec` to it as to a kubelet: a pod's log is a file the test writes (a
kwok `Logs` object names it), and an exec runs on this machine with the pod's $ROSETTA_OUTPUT
pointing at a folder of the test's. Its pods get addresses on the loopback network, so the
operator's progress scraper reaches a metrics page the test serves at rank 0's pod IP: the
progress, ETA, BLEU and checkpoint that `rosetta status` prints went through the real operator.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from workloads import bound_volume, documents, running_pods, status

from control_plane import free_port
from controllers import KWOK_NODE_ANNOTATION, Kwok, NodePool, kwok_stages
from support.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LOG_NODE_TAINT = "rosetta.test/logs"
LOGS_API = ("kwok.x-k8s.io", "v1alpha1", "logs")
WAIT = 90


class LogNode:
    """kwok's kubelet API for one node: pod logs from files, exec as local commands."""

    def __init__(self, cluster, folder: Path):
        self.cluster, self.folder = cluster, folder
        self.output = folder / "output"  # $ROSETTA_OUTPUT of every pod on the node

    def serve_log(self, namespace: str, pod: str, lines: list[str]) -> Path:
        """The pod's log from now on: `lines`, and whatever `append` adds (followed)."""
        path = self.folder / f"{namespace}-{pod}.log"
        self.append(path, lines)
        self.cluster.custom.create_namespaced_custom_object(*LOGS_API[:2], namespace, LOGS_API[2], {
            "apiVersion": "/".join(LOGS_API[:2]), "kind": "Logs", "metadata": {"name": pod, "namespace": namespace},
            "spec": {"logs": [{"containers": ["trainer"], "logsFile": str(path), "follow": True}]}})
        return path

    @staticmethod
    def append(path: Path, lines: list[str]) -> None:
        """In the container runtime's log format, as the kubelet reads it."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with path.open("a") as f:
            f.writelines(f"{stamp} stdout F {line}\n" for line in lines)


@pytest.fixture(scope="module")
def log_node(live_cluster, tmp_path_factory):
    cp = live_cluster.cp
    folder = tmp_path_factory.mktemp("log-node")
    node = LogNode(live_cluster, folder)
    node.output.mkdir()
    try:
        live_cluster.install_crd(yaml.safe_load((cp.assets.manifests / "kwok" / "crd" / "kwok.x-k8s.io_logs.yaml")
                                                .read_text()))
    except Exception as exc:  # the CRD stays for the session: a second module run finds it
        if getattr(exc, "status", None) != 409:
            raise
    execs = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterExec", "metadata": {"name": "local"},
             "spec": {"execs": [{"local": {"workDir": str(folder),
                                           "envs": [{"name": "ROSETTA_OUTPUT", "value": str(node.output)}]}}]}}
    config = folder / "kwok.yaml"
    config.write_text(yaml.safe_dump_all([*kwok_stages(cp.assets), execs]))
    port = free_port()
    certs = cp.workdir / "certs"  # any certificate: the apiserver does not verify a kubelet's here
    cp.spawn("kwok-logs", [
        str(cp.assets.bin("kwok")), f"--kubeconfig={cp.kubeconfig}", f"--config={config}", "--enable-crds=Logs",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=logs",
        "--node-ip=127.0.0.1", f"--node-port={port}", f"--server-address=127.0.0.1:{port}",
        f"--tls-cert-file={certs / 'apiserver.crt'}", f"--tls-private-key-file={certs / 'apiserver.key'}",
        "--cidr=127.88.0.1/16", "--node-lease-duration-seconds=40",
    ])
    pool = NodePool("logs", {"cpu": "16", "memory": "64Gi", "pods": "110"}, {"rosetta.test/pool": "logs"},
                    ({"key": LOG_NODE_TAINT, "value": "true", "effect": "NoSchedule"},))
    body = Kwok(cp).node(pool, "kwok-logs-1")
    body["metadata"]["annotations"][KWOK_NODE_ANNOTATION] = "logs"
    live_cluster.core.create_node(body)
    try:
        wait_for(lambda: any(c.type == "Ready" and c.status == "True"
                             for c in live_cluster.core.read_node("kwok-logs-1").status.conditions or []),
                 f"the log node Ready:\n{cp.logs('kwok-logs')}", 60)
        yield node
    finally:
        live_cluster.core.delete_node("kwok-logs-1")
        cp.stop_process("kwok-logs")


def training_file(tmp_path: Path, name: str, labels: dict | None = None) -> Path:
    """quickstart-cpu (its claim, then the training) placed on the log node."""
    docs = documents(QUICKSTART)
    training = docs["TranslationTraining"]
    training["metadata"]["name"] = name
    if labels:
        training["metadata"]["labels"] = labels
    training["spec"]["scheduling"] = {
        "nodeSelector": {"rosetta.test/pool": "logs"},
        "tolerations": [{"key": LOG_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([docs["PersistentVolumeClaim"], training], sort_keys=False))
    return path


def rosetta(cluster, *args: str) -> tuple[int, str, str]:
    """`rosetta ARGS` in this process (a verb is a function call): (exit status, stdout, stderr)."""
    from rosetta_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*args, "--kubeconfig", cluster.kubeconfig])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def table_rows(out: str) -> list[dict[str, str]]:
    """A `get` table's rows by column name, cut where the header's columns start (a cell may hold
    spaces: `50% 300/600`)."""
    header, *rows = out.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    return [{name: row[a:b].strip() for name, a, b in zip(header.split(), starts, starts[1:] + [None])}
            for row in rows]


class Follower:
    """`rosetta logs -f` (or another streaming verb) as its own process; its output collected as it comes."""

    def __init__(self, cluster, *args: str, verb: tuple[str, ...] = ("logs", "-f")):
        self.proc = subprocess.Popen([sys.executable, "-m", "rosetta_cli", *verb, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "KUBECONFIG": cluster.kubeconfig})
        self.out: list[str] = []
        self.err: list[str] = []
        for pipe, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda p=pipe, s=sink: s.extend(iter(p.readline, "")), daemon=True).start()

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.out + self.err)


@contextlib.contextmanager
def metrics_page(address: str, port: int, text: str):
    """A trainer's /metrics at rank 0's pod IP (on the loopback network, like every pod here)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


METRICS = """\
rosetta_step 300
rosetta_total_steps 600
rosetta_step_seconds 0.5
rosetta_loss 2.25
rosetta_bleu 12.5
rosetta_best_bleu 12.5
rosetta_last_checkpoint_step 200
rosetta_last_checkpoint_info{path="/checkpoints/cli/step-200"} 1
"""


def write_events(folder: Path) -> None:
    """A TensorBoard event file with one scalar, as the trainer's SummaryWriter leaves it."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    writer.add_event(Event(wall_time=time.time(), step=300,
                           summary=Summary(value=[Summary.Value(tag="loss/train", simple_value=2.25)])))
    writer.close()


def by_rank(pods) -> dict[int, object]:
    return {int(p.metadata.annotations[COMPLETION_INDEX]): p for p in pods}


def wait_gang(cluster, namespace: str, name: str, exclude: set = frozenset()) -> dict[int, object]:
    pods = wait_for(lambda: (p := [x for x in running_pods(cluster, namespace, name) if x.metadata.uid not in exclude])
                    and len(p) == 2 and p, f"2 running pods of {name}", WAIT)
    return by_rank(pods)


def test_a_training_from_submit_to_delete(live_cluster, live_namespace, live_operator, log_node, tmp_path):
    ns, name = live_namespace, "cli"
    path = training_file(tmp_path, name)
    bound_volume(live_cluster, ns, "quickstart-cpu-checkpoints")

    code, out, err = rosetta(live_cluster, "submit", "-f", str(path), "-n", ns)
    assert code == 0, err
    assert out.splitlines() == ["persistentvolumeclaim/quickstart-cpu-checkpoints created",
                                f"translationtraining.rosetta.dev/{name} created"]
    applied = live_cluster.custom.get_namespaced_custom_object("rosetta.dev", "v1alpha1", ns, "translationtrainings",
                                                               name)
    assert any(f["manager"] == "rosetta" and f["operation"] == "Apply" for f in applied["metadata"]["managedFields"])
    code, out, err = rosetta(live_cluster, "submit", "-f", str(path), "-n", ns)
    assert code == 0 and f"translationtraining.rosetta.dev/{name} " in out, (out, err)

    code, out, err = rosetta(live_cluster, "wait", name, "-n", ns, "--for", "phase=Running", "--timeout", "90s")
    assert (code, out) == (0, f"translationtraining.rosetta.dev/{name} condition met\n"), err
    gang = wait_gang(live_cluster, ns, name)

    # The operator scrapes rank 0's metrics page into status.progress; the verbs print it.
    with metrics_page(gang[0].status.pod_ip, 9400, METRICS):
        wait_for(lambda: (status(live_cluster, ns, name).get("progress") or {}).get("lastCheckpointStep") == 200,
                 "the scraped progress in the status", WAIT)
    code, out, err = rosetta(live_cluster, "get", "-n", ns)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "PHASE", "PROGRESS", "ETA", "BLEU", "RESTARTS", "PREEMPTIONS", "AGE"]
    assert row.split()[:3] == [name, "Running", "50%"] and row.split()[5:7] == ["12.5", "0"], row
    code, out, err = rosetta(live_cluster, "status", name, "-n", ns)
    assert code == 0, err
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line and not line.startswith(" "))
    assert lines["Phase"].strip() == "Running"
    assert lines["Progress"].strip().startswith("50% 300/600 (loss 2.2500)")
    assert lines["BLEU"].strip() == "12.50 (best 12.50)"
    assert lines["Last checkpoint"].strip() == "step 200 /checkpoints/cli/step-200"
    assert lines["Restarts"].strip() == "0 (preemptions 0)"
    conditions = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.startswith("  ")}
    assert conditions["Running"] == ["True", "AllJobsReady"] and conditions["Valid"] == ["True", "SpecValid"], out
    code, out, err = rosetta(live_cluster, "status", name, "-n", ns, "-o", "json")
    figures = json.loads(out)
    assert figures["phase"] == "Running" and 0 < figures["etaSeconds"] <= 150 and figures["lastCheckpointStep"] == 200
    code, out, err = rosetta(live_cluster, "get", name, "-n", ns, "-o", "yaml")
    assert yaml.safe_load(out)["status"]["progress"]["bleu"] == 12.5

    # Logs, by node rank.
    logs = {rank: log_node.serve_log(ns, pod.metadata.name, [f"rank {rank} gang 0 step {s}" for s in (1, 2)])
            for rank, pod in gang.items()}
    code, out, err = rosetta(live_cluster, "logs", name, "-n", ns)
    assert (code, out) == (0, "rank 0 gang 0 step 1\nrank 0 gang 0 step 2\n"), err
    code, out, err = rosetta(live_cluster, "logs", name, "-n", ns, "--rank", "1", "--tail", "1")
    assert (code, out) == (0, "rank 1 gang 0 step 2\n"), err
    code, out, err = rosetta(live_cluster, "logs", name, "-n", ns, "--rank", "2")
    assert code == 2 and "ranks 0 to 1" in err, err
    code, out, err = rosetta(live_cluster, "logs", name, "-n", ns, "--all-ranks", "--since", "1h")
    assert code == 0 and sorted(out.splitlines()) == [f"[rank {r}] rank {r} gang 0 step {s}" for r in (0, 1)
                                                      for s in (1, 2)], err

    # kubectl's other habits: -o wide|name|jsonpath, and status ends with the recent events.
    code, out, err = rosetta(live_cluster, "get", "-n", ns, "-o", "wide")
    wide = table_rows(out)[0]
    assert (wide["NAME"], wide["NODES"], wide["JOBSET"], wide["CHECKPOINT"]) == (name, "2", name, "step 200"), out
    code, out, err = rosetta(live_cluster, "get", "-n", ns, "-o", "name")
    assert (code, out) == (0, f"translationtraining.rosetta.dev/{name}\n"), err
    code, out, err = rosetta(live_cluster, "get", name, "-n", ns, "-o", "jsonpath={.status.progress.lastCheckpointStep}")
    assert (code, out) == (0, "200\n"), err
    code, out, err = rosetta(live_cluster, "status", name, "-n", ns)
    events = out[out.index("\nEvents:\n"):].splitlines()[3:]
    assert any(line.split()[:2] == ["Normal", "Scheduled"] and f"pod/{gang[0].metadata.name}" in line
               for line in events), out

    # TensorBoard: rank 0's event files copied out through the exec API, then served.
    write_events(log_node.output / "tensorboard")
    copy = tmp_path / "tb"
    code, out, err = rosetta(live_cluster, "tensorboard", name, "-n", ns, "--logdir", str(copy), "--no-serve")
    assert code == 0 and "copied 1 file from pod" in err, err
    assert [p.name for p in copy.iterdir()] == [p.name for p in (log_node.output / "tensorboard").iterdir()]
    serve_tensorboard(live_cluster, ns, name, tmp_path / "tb-served")

    # -f follows rank 0 across a gang restart, and ends when the training does.
    follower = Follower(live_cluster, name, "-n", ns)
    try:
        wait_for(lambda: follower.saw("rank 0 gang 0 step 2"), "the follower's first lines", 30)
        LogNode.append(logs[0], ["rank 0 gang 0 step 3"])
        wait_for(lambda: follower.saw("rank 0 gang 0 step 3"), "a line appended while following", 30)
        live_cluster.end_pod(ns, gang[1].metadata.name, 1)  # a crash: the JobSet restarts the gang
        gang = wait_gang(live_cluster, ns, name, exclude={p.metadata.uid for p in gang.values()})
        for rank, pod in gang.items():
            log_node.serve_log(ns, pod.metadata.name, [f"rank {rank} gang 1 resumed"])
        wait_for(lambda: follower.saw("rank 0 gang 1 resumed"), "the new rank 0's log", 60)
        assert any(f"pod {gang[0].metadata.name}, gang restart 1" in line for line in follower.err), follower.err
        for pod in gang.values():
            live_cluster.end_pod(ns, pod.metadata.name, 0)
        code, out, err = rosetta(live_cluster, "wait", name, "-n", ns, "--for", "phase=Succeeded", "--timeout", "90s")
        assert code == 0, err
        assert follower.proc.wait(30) == 0, follower.err
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()
    assert [line for line in follower.out if "rank 1" in line] == [], "rank 0 only"
    assert follower.out.index("rank 0 gang 0 step 3\n") < follower.out.index("rank 0 gang 1 resumed\n")

    code, out, err = rosetta(live_cluster, "wait", name, "-n", ns, "--for", "phase=Failed", "--timeout", "10s")
    assert code == 1 and "ended Succeeded" in err, err
    code, out, err = rosetta(live_cluster, "get", name, "-n", ns)
    assert out.splitlines()[1].split()[1] == "Succeeded" and out.splitlines()[1].split()[-3:-1] == ["1", "0"], out

    code, out, err = rosetta(live_cluster, "delete", name, "-n", ns, "--wait", "--timeout", "60s")
    assert (code, out) == (0, f'translationtraining.rosetta.dev "{name}" deleted\n'), err
    code, out, err = rosetta(live_cluster, "get", name, "-n", ns)
    assert code == 1 and "not found" in err, err
    assert rosetta(live_cluster, "delete", name, "-n", ns)[0] == 1
    assert rosetta(live_cluster, "delete", name, "-n", ns, "--ignore-not-found")[0] == 0


def serve_tensorboard(cluster, namespace: str, name: str, logdir: Path) -> None:
    """`rosetta tensorboard NAME` until TensorBoard answers with the copied scalar."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rosetta_cli", "tensorboard", name, "-n", namespace,
                             "--logdir", str(logdir), "--port", str(port), "--refresh", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "KUBECONFIG": cluster.kubeconfig})

    def tags():
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=2) as resp:
                return json.load(resp)
        except OSError:
            return None
    try:
        got = wait_for(tags, "TensorBoard serving the copied event files", 120)
        assert "loss/train" in json.dumps(got), got
    finally:
        proc.terminate()
        proc.wait(20)
    with pytest.raises(OSError):  # stopping `rosetta tensorboard` stopped TensorBoard
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)


def test_what_the_verbs_refuse(live_cluster, live_namespace, tmp_path):
    ns = live_namespace
    bad = tmp_path / "bad.yaml"
    bad.write_text(training_file(tmp_path, "bad").read_text().replace("nodes: 2", "nodes: 0"))
    code, out, err = rosetta(live_cluster, "submit", "-f", str(bad), "-n", ns)
    assert code == 2 and "spec.nodes" in err and not out, err
    assert live_cluster.trainings(ns) == {} and not live_cluster.core.list_namespaced_persistent_volume_claim(ns).items

    code, out, err = rosetta(live_cluster, "submit", "-f", str(training_file(tmp_path, "x")), "-n", "other")
    assert code == 1 and "other" in err, err  # no such namespace: the server says so
    # No operator in this namespace: the training never gets a phase.
    code, out, err = rosetta(live_cluster, "submit", "-f", str(training_file(tmp_path, "idle")), "-n", ns,
                             "--wait", "--timeout", "3s")
    assert code == 1 and "translationtraining.rosetta.dev/idle created" in out, (out, err)
    assert err.strip() == "error: timed out waiting for phase Succeeded on translationtraining.rosetta.dev/idle"
    code, out, err = rosetta(live_cluster, "status", "missing", "-n", ns)
    assert code == 1 and err.strip() == f'error: translationtrainings.rosetta.dev "missing" not found in namespace "{ns}"'
    code, out, err = rosetta(live_cluster, "wait", "missing", "-n", ns, "--for", "phase=Done")
    assert code == 2 and "the phases are" in err
    code, out, err = rosetta(live_cluster, "logs", "missing", "-n", ns)
    assert code == 1 and "not found" in err
    code, out, err = rosetta(live_cluster, "get", "-n", ns, "--context", "nowhere")
    assert code == 2 and "nowhere" in err, err  # a kubeconfig that cannot be used as written is input


def test_kubectl_finds_the_plugin(live_cluster, live_namespace, tmp_path):
    scripts = Path(sys.executable).parent
    plugin = scripts / "kubectl-rosetta"
    assert plugin.exists(), f"{plugin} is missing: reinstall the package (pip install -e .) for its console scripts"
    kubectl_dir = Path(live_cluster.kubectl).parent
    env = {**os.environ, "PATH": f"{kubectl_dir}:{scripts}:/usr/bin:/bin", "KUBECONFIG": live_cluster.kubeconfig}
    listed = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert str(plugin) in listed.stdout, listed.stdout + listed.stderr
    got = subprocess.run(["kubectl", "rosetta", "get", "-n", live_namespace, "-o", "json"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert got.returncode == 0 and json.loads(got.stdout)["items"] == [], got.stderr
    version = subprocess.run(["kubectl", "rosetta", "--version"], capture_output=True, text=True, env=env, timeout=60)
    from rosetta_trainer import __version__
    assert version.stdout.strip() == f"rosetta {__version__}", version
    # Named as the user typed it, with the cluster's verbs and without the local ones.
    helped = subprocess.run(["kubectl", "rosetta", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert helped.stdout.startswith("usage: kubectl rosetta ") and "    suspend " in helped.stdout, helped
    assert "    train " not in helped.stdout and "    operator " not in helped.stdout
    empty = subprocess.run(["kubectl", "rosetta", "get", "-n", live_namespace], capture_output=True, text=True,
                           env=env, timeout=60)
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", f"No resources found in {live_namespace} namespace.\n")


def test_the_python_client_and_suspend_resume(live_cluster, live_namespace, live_operator, log_node, tmp_path):
    """The Client that the verbs call, used as a script would use it; suspend and resume through the
    operator, seen by `rosetta get -w`."""
    from rosetta_operator import Client, TrainingNotFound

    ns, name = live_namespace, "sdk"
    bound_volume(live_cluster, ns, "quickstart-cpu-checkpoints")
    client = Client(kubeconfig=live_cluster.kubeconfig, namespace=ns)
    applied: list[str] = []
    submitted = client.submit(training_file(tmp_path, name, labels={"team": "nlp"}), on_applied=applied.append)
    assert submitted["metadata"]["name"] == name and applied[-1] == f"translationtraining.rosetta.dev/{name} created"
    assert client.wait(name, "Running", timeout=WAIT)["status"]["phase"] == "Running"
    assert [o["metadata"]["name"] for o in client.list(label_selector="team=nlp")] == [name]
    assert client.list(label_selector="team=other") == []
    code, out, err = rosetta(live_cluster, "get", "-n", ns, "-l", "team=nlp", "-o", "name")
    assert (code, out) == (0, f"translationtraining.rosetta.dev/{name}\n"), err

    gang = wait_gang(live_cluster, ns, name)
    for rank, pod in gang.items():
        log_node.serve_log(ns, pod.metadata.name, [f"rank {rank} says hello"])
    assert list(client.logs(name)) == ["rank 0 says hello"]
    assert sorted(client.logs(name, all_ranks=True)) == ["[rank 0] rank 0 says hello", "[rank 1] rank 1 says hello"]

    # `get -w` prints a row at each change: the suspension, then the resumption.
    watcher = Follower(live_cluster, name, "-n", ns, "--request-timeout", "180s", verb=("get", "-w"))
    try:
        wait_for(lambda: watcher.saw(" Running "), "get -w's first row", 30)
        code, out, err = rosetta(live_cluster, "suspend", name, "-n", ns, "--wait", "--timeout", f"{WAIT}s")
        assert (code, out) == (0, f"translationtraining.rosetta.dev/{name} suspended\n"), err
        wait_for(lambda: not live_cluster.pods(ns, name), "the suspended training's pods to be gone", WAIT)
        wait_for(lambda: watcher.saw(" Suspended "), "get -w's row for the suspension", 30)
        assert client.status(name).phase == "Suspended" and client.suspend(name) is False
        code, out, err = rosetta(live_cluster, "resume", name, "-n", ns, "--wait", "--timeout", f"{WAIT}s")
        assert (code, out) == (0, f"translationtraining.rosetta.dev/{name} resumed\n"), err
        wait_gang(live_cluster, ns, name, exclude={p.metadata.uid for p in gang.values()})
        phases = [line.split()[1] for line in watcher.out if line.startswith(f"{name} ")]
        assert phases[0] == "Running" and "Suspended" in phases and phases.index("Suspended") > 0, watcher.out
        assert watcher.out[0].split()[:2] == ["NAME", "PHASE"] and watcher.err == [], watcher.err
    finally:
        watcher.proc.kill()
        watcher.proc.wait(10)

    assert client.delete(name, wait=True, timeout=60) is True
    with pytest.raises(TrainingNotFound):
        client.get(name)
    assert client.delete(name, ignore_not_found=True) is False
