"""What a Helm user expects of the chart besides its objects: `helm test`'s pod (and that its check
really tells a serving operator from anything else), NOTES.txt with the next commands, and the
JobSet check staying out of the way offline. The schema: test_values_schema.py; trainer.image:
test_default_image.py; the JobSet check against a cluster: tests/cluster/test_helm_install.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.chart import render, render_files


def helm_test_pod(values: dict | None = None) -> dict:
    (pod,) = [o for o in render(values, tests=True) if o["kind"] == "Pod"]
    return pod


def test_helm_test_pod_checks_the_metrics_service_with_the_operator_image():
    objects = render(tests=True)
    pod = helm_test_pod()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (c,) = pod["spec"]["containers"]
    operator = deploy["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == operator["image"] and c["imagePullPolicy"] == operator["imagePullPolicy"]
    assert c["command"][:2] == ["python3", "-c"]
    assert c["command"][-1] == (f"http://{service['metadata']['name']}.rosetta-system.svc:"
                                f"{service['spec']['ports'][0]['port']}/metrics")
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["automountServiceAccountToken"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # Not an object of the release: `helm install` keeps test hooks for `helm test`.
    assert not [o for o in render() if o["kind"] == "Pod"]


def test_helm_test_pod_follows_values():
    pod = helm_test_pod({"helmTest": {"image": "registry.internal/tools/python:3.11"}, "service": {"port": 9100},
                    "imagePullSecrets": ["pull"]})
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.internal/tools/python:3.11"
    assert c["command"][-1].endswith(".svc:9100/metrics")
    assert pod["spec"]["imagePullSecrets"] == [{"name": "pull"}]
    # Without the Service there is nothing it could reach.
    assert not [o for o in render({"service": {"enabled": False}}, tests=True) if o["kind"] == "Pod"]


class _Page(BaseHTTPRequestHandler):
    body = b""

    def log_message(self, *_):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)


@pytest.mark.parametrize("body, ok", [
    (b"# HELP rosetta_operator_trainings ...\nrosetta_operator_trainings{phase=\"Running\"} 0.0\n", True),
    (b"<html>some other service</html>", False),
], ids=["operator", "something-else"])
def test_helm_test_script_tells_the_operator_from_anything_else(body, ok):
    handler = type("Page", (_Page,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (c,) = helm_test_pod()["spec"]["containers"]
        script = c["command"][2]
        run = subprocess.run([sys.executable, "-c", script, f"http://127.0.0.1:{server.server_port}/metrics"],
                             capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert (run.returncode == 0) == ok, run.stdout + run.stderr
    assert ("serving its metrics" in run.stdout) if ok else ("not the Rosetta operator" in run.stderr)


def notes(values: dict | None = None) -> str:
    return render_files(values)["rosetta/templates/NOTES.txt"]


def test_notes_give_the_next_commands():
    text = notes({"watchNamespaces": ["ml", "nlp"]})
    for line in ("kubectl -n rosetta-system rollout status deploy/rosetta",
                 "helm test rosetta -n rosetta-system",
                 "kubectl apply -n ml -f manifests/examples/quickstart-cpu.yaml",
                 "rosetta submit -n ml -f manifests/examples/quickstart-cpu.yaml --wait",
                 "kubectl get tt -n ml -o wide",
                 "rosetta status quickstart-cpu -n ml",
                 "rosetta logs quickstart-cpu -n ml -f",
                 "Trainings without spec.image run ghcr.io/rosetta-dev/rosetta-trainer:0.1.0"):
        assert line in text, line
    assert "watching ml, nlp only" in text
    # By default the operator watches its own namespace alone: the commands go there.
    assert "watching rosetta-system only" in notes()
    assert "kubectl apply -n rosetta-system -f" in notes()
    assert "watching every namespace" in notes({"clusterWide": True})
    assert "kubectl apply -n default -f" in notes({"clusterWide": True})
    assert "helm test" not in notes({"service": {"enabled": False}})
    skipped = notes({"jobset": {"requireCRD": False}})
    assert "jobset.requireCRD=false" in skipped and "releases/download/v0.12.0/manifests.yaml" in skipped


def test_notes_commands_exist():
    """The rosetta verbs NOTES.txt names take the arguments it gives them."""
    import argparse

    from rosetta_operator.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    for line in notes().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("rosetta "):
            parser.parse_args(line.split()[1:])


def test_jobset_check_lets_an_offline_render_through():
    # `helm template` and `helm lint` have no cluster to ask: lookup answers nothing, nothing fails.
    assert render_files()["rosetta/templates/operator/jobset-check.yaml"].strip() == ""
