"""The cluster verbs when the cluster cannot be used: one `error:` line on stderr that names the cause
and what to do, the documented exit status (1: the cluster or the credentials; 2: a kubeconfig that
cannot be used as written), and nothing else: no traceback, no urllib3 retries or warnings, no log
line of the client library.

Most commands run as a user runs them, in a process of their own: there a stray warning or log record
reaches stderr, where in pytest's process it would be captured out of sight. The servers are local:
a closed port, a TLS server with a self-signed certificate, a port that never finishes a handshake.
tests/integration/test_cli_without_crd.py asks a real apiserver that has no TranslationTraining CRD.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from rosetta_cli.main import main
from rosetta_operator import kube, kubeconfig

LIST = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTrainingList", "metadata": {}, "items": []}
TRAININGS = "/apis/rosetta.dev/v1alpha1/namespaces/default/translationtrainings"


# ----------------------------------------------------------------------------------- helpers


def write_kubeconfig(path: Path, server: str, *, user: dict | None = None, **cluster: Any) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def exec_user(command: str, *args: str, **extra: Any) -> dict:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": command,
                     "args": list(args), **extra}}


def rosetta(*argv: str, home: Path, path: str | None = None) -> tuple[int, str]:
    """`rosetta ARGV` in its own process, with nothing of the user's cluster settings; (status, stderr)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "PYTHONWARNINGS")}
    env["HOME"] = str(home)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run([sys.executable, "-m", "rosetta_cli", *argv], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stderr


def one_error(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeApiserver(http.server.ThreadingHTTPServer):
    """HTTPS with a self-signed certificate; `routes` maps a path to (status, content type, body), and
    anything else gets what an apiserver says of a resource it does not serve."""

    def __init__(self, cert: Path, key: Path):
        super().__init__(("127.0.0.1", 0), _Answer)
        self.routes: dict[str, tuple[int, str, str]] = {}
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}"


class _Answer(http.server.BaseHTTPRequestHandler):
    server: FakeApiserver

    def do_GET(self) -> None:
        status, kind, body = self.server.routes.get(self.path.split("?")[0],
                                                    (404, "text/plain; charset=utf-8", "404 page not found\n"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_DELETE = do_GET

    def log_message(self, *_: Any) -> None:
        pass


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key."""
    pytest.importorskip("cryptography", reason="makes the local TLS server's certificate")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = datetime.now(timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "server.crt", folder / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[FakeApiserver]:
    server = FakeApiserver(*self_signed(tmp_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------ (a) exec plugins


@pytest.mark.parametrize("command, args, install", [
    ("aws", ["eks", "get-token", "--cluster-name", "prod"], "install the AWS CLI v2"),
    ("gke-gcloud-auth-plugin", [], "gcloud components install gke-gcloud-auth-plugin"),
    ("kubelogin", ["get-token", "--login", "azurecli"], "az aks install-cli"),
])
def test_a_missing_exec_plugin_is_named_with_where_it_comes_from(tmp_path, command, args, install):
    config = write_kubeconfig(tmp_path / "config", f"https://127.0.0.1:{closed_port()}",
                              user=exec_user(command, *args))
    empty = tmp_path / "bin"
    empty.mkdir()
    code, err = rosetta("get", "--kubeconfig", config, home=tmp_path, path=str(empty))
    line = one_error(err)
    assert code == 1
    assert f'context "dev" of kubeconfig {config}' in line
    assert f"`{command}`, which is not installed (not on PATH)" in line and install in line
    # Not the errno the client library logs, nor the unreachable server it would then blame.
    assert "Errno" not in line and "reach" not in line


def test_the_kubeconfigs_install_hint_wins(tmp_path):
    config = write_kubeconfig(tmp_path / "config", "https://127.0.0.1:6443", user=exec_user(
        "acme-login", installHint="Install acme-login from\nhttps://acme.example/cli."))
    with pytest.raises(kube.VerbError) as exc:
        kubeconfig.connect(config)
    assert exc.value.exit_code == 1
    assert str(exc.value).endswith("(not on PATH): Install acme-login from https://acme.example/cli; "
                                   "or choose another context with --context")


def test_a_failing_exec_plugin_is_reported_with_its_stderr(tmp_path):
    plugin = tmp_path / "bin" / "corp-login"
    plugin.parent.mkdir()
    plugin.write_text("#!/bin/sh\necho 'token expired: run corp-login --refresh' >&2\nexit 3\n")
    plugin.chmod(0o755)
    config = write_kubeconfig(tmp_path / "config", f"https://127.0.0.1:{closed_port()}",
                              user=exec_user("corp-login", "--cluster", "prod"))
    code, err = rosetta("get", "--kubeconfig", config, home=tmp_path, path=str(plugin.parent))
    line = one_error(err)
    assert code == 1
    assert "its credential plugin failed (exec: process returned 3. token expired: run corp-login --refresh)" in line
    assert "run `corp-login --cluster prod` to see why" in line


# ------------------------------------------------------------------- (b) malformed kubeconfigs


GOOD = {"apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}]}


def with_context(**context: Any) -> str:
    return yaml.safe_dump({**GOOD, "contexts": [{"name": "dev", "context": context}]})


@pytest.mark.parametrize("text, args, says", [
    ("clusters: [\n  - name: c\n", [], "is not valid YAML (expected the node content, but found '-' at line 2): "
                                        "fix it, or point --kubeconfig or KUBECONFIG at another file"),
    ("- just\n- a list\n", [], "is a YAML list, not a kubeconfig (a mapping with clusters, contexts and users)"),
    ("", [], "is empty, not a kubeconfig"),
    ("apiVersion: v1\nkind: Config\n", [], "has no contexts: `aws eks update-kubeconfig --name CLUSTER`"),
    (yaml.safe_dump({**GOOD, "clusters": {"c": {}}}), [], ": clusters must be a list of entries, each with a name"),
    (with_context(cluster="gone", user="u"), [], 'context "dev" of kubeconfig {path} names cluster "gone", '
                                                 "which the kubeconfig does not define; its clusters: c"),
    (with_context(cluster="c", user="gone"), [], 'names user "gone", which the kubeconfig does not define; '
                                                 "its users: u"),
    (with_context(user="u"), [], 'context "dev" of kubeconfig {path} names no cluster'),
    (yaml.safe_dump({**GOOD, "clusters": [{"name": "c", "cluster": {}}]}), [],
     'cluster "c" of kubeconfig {path} has no server address'),
    (yaml.safe_dump({**GOOD, "current-context": "prod"}), [],
     'has no context "prod" (its current-context); its contexts: dev'),
    (yaml.safe_dump({k: v for k, v in GOOD.items() if k != "current-context"}), [],
     "has no current context: pass --context (one of dev)"),
    (yaml.safe_dump(GOOD), ["--context", "staging"], 'has no context "staging" (--context); its contexts: dev'),
    (yaml.safe_dump({**GOOD, "clusters": [{"name": "c", "cluster": {
        "server": "https://127.0.0.1:6443", "certificate-authority": "/nonexistent/ca.crt"}}]}), [],
     'context "dev" of kubeconfig {path}: File does not exist: /nonexistent/ca.crt'),
], ids=["invalid-yaml", "a-list", "empty", "no-clusters-or-contexts", "clusters-not-a-list", "missing-cluster",
        "missing-user", "no-cluster-named", "no-server", "missing-current-context", "no-current-context",
        "unknown-context", "missing-ca-file"])
def test_a_kubeconfig_that_cannot_be_used_is_input_exit_2(tmp_path, capsys, text, args, says):
    path = tmp_path / "config"
    path.write_text(text)
    assert main(["get", "--kubeconfig", str(path), *args]) == 2
    line = one_error(capsys.readouterr().err)
    assert str(path) in line and says.format(path=path) in line


def test_a_kubeconfig_that_is_not_there(tmp_path, capsys, monkeypatch):
    assert main(["get", "--kubeconfig", str(tmp_path / "nope")]) == 2
    assert one_error(capsys.readouterr().err) == f"error: --kubeconfig {tmp_path / 'nope'}: no such file"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert main(["get"]) == 2
    assert one_error(capsys.readouterr().err) == f"error: KUBECONFIG {tmp_path / 'a'}:{tmp_path / 'b'}: no such file"


def test_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path):
    # The first file to set current-context, or to name an entry, wins.
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(yaml.safe_dump({**GOOD, "contexts": [{"name": "dev", "context": {
        "cluster": "c", "user": "u", "namespace": "mine"}}]}))
    second.write_text(yaml.safe_dump({**GOOD, "current-context": "other", "contexts": [
        {"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "theirs"}},
        {"name": "other", "context": {"cluster": "c", "user": "u"}}]}))
    got = kubeconfig.connect(f"{first}:{second}")
    assert (got.context, got.namespace) == ("dev", "mine")


# ---------------------------------------------------------- (c) unreachable: one attempt, fast


def test_a_refused_connection_fails_at_once_in_one_line(tmp_path):
    server = f"https://127.0.0.1:{closed_port()}"
    config = write_kubeconfig(tmp_path / "config", server)
    started = time.monotonic()
    code, err = rosetta("get", "--kubeconfig", config, home=tmp_path)
    assert time.monotonic() - started < 20  # start-up of the process included
    assert code == 1
    assert one_error(err) == (f"error: cannot reach the cluster at {server} (context dev, kubeconfig {config}): "
                              "the connection was refused; is the cluster running, and is that its API server's "
                              "address (`kubectl cluster-info` asks the same server)?")
    for noise in ("Max retries", "ConnectionPool", "Retrying", "Traceback", "WARNING"):
        assert noise not in err


def test_a_server_that_drops_the_connection_is_tried_once(tmp_path, capsys):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def drop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=drop, daemon=True).start()
    server = f"https://127.0.0.1:{listener.getsockname()[1]}"
    try:
        config = write_kubeconfig(tmp_path / "config", server)
        assert main(["get", "--kubeconfig", config]) == 1
        time.sleep(0.2)  # a retry, if there were one, would have connected by now
    finally:
        listener.close()
    line = one_error(capsys.readouterr().err)
    assert len(accepted) == 1
    assert line.startswith(f"error: cannot reach the cluster at {server} (context dev, kubeconfig {config}): ")
    assert "Max retries" not in line and "ConnectionPool" not in line, line


def test_connecting_gives_up_after_the_connect_timeout(tmp_path, capsys, monkeypatch):
    # Listening but never accepting: the TCP handshake completes (the kernel's backlog), TLS never does.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    monkeypatch.setattr(kube, "CONNECT_TIMEOUT", 0.5)
    try:
        config = write_kubeconfig(tmp_path / "config", f"https://127.0.0.1:{listener.getsockname()[1]}")
        started = time.monotonic()
        assert main(["get", "--kubeconfig", config]) == 1
        assert time.monotonic() - started < 5
    finally:
        listener.close()
    assert "no answer within 0.5 s; a firewall or VPN may be in the way" in one_error(capsys.readouterr().err)


# ----------------------------------------------------------------------------------- (d) TLS


def test_insecure_skip_tls_verify_is_honoured_without_warnings(tmp_path, apiserver):
    apiserver.routes[TRAININGS] = (200, "application/json", json.dumps(LIST))
    config = write_kubeconfig(tmp_path / "config", apiserver.url, **{"insecure-skip-tls-verify": True})
    code, err = rosetta("get", "--kubeconfig", config, home=tmp_path)
    assert code == 0, err
    assert "InsecureRequestWarning" not in err and "Unverified HTTPS" not in err, err
    assert len(err.splitlines()) <= 1, err  # at most the note that the namespace has no trainings


def test_an_untrusted_certificate_is_named(tmp_path, apiserver):
    config = write_kubeconfig(tmp_path / "config", apiserver.url)
    code, err = rosetta("get", "--kubeconfig", config, home=tmp_path)
    assert code == 1
    assert one_error(err) == (
        f"error: cannot reach the cluster at {apiserver.url} (context dev, kubeconfig {config}): its TLS "
        "certificate is not trusted (self-signed certificate); the kubeconfig's certificate-authority must be "
        "the cluster's CA: fetch the kubeconfig again")


# ------------------------------------------------------------- (e) no CRD, next to not found


def test_a_cluster_without_the_crd_is_told_apart_from_a_missing_training(tmp_path, capsys, apiserver):
    # What a real apiserver answers (tests/integration/test_cli_without_crd.py asks one): a bare
    # `404 page not found` for a resource it does not serve, a Status naming the object otherwise.
    config = write_kubeconfig(tmp_path / "config", apiserver.url, **{"insecure-skip-tls-verify": True})
    where = f"at {apiserver.url} (context dev, kubeconfig {config})"
    for argv in (["get"], ["get", "q"], ["status", "q"], ["delete", "q"], ["logs", "q"]):
        assert main([*argv, "--kubeconfig", config]) == 1, argv
        assert one_error(capsys.readouterr().err) == (
            f"error: the cluster {where} has no TranslationTraining resource (rosetta.dev/v1alpha1): install the "
            "CRD (how: `kubectl apply -f manifests/crd.yaml` or the Helm chart)")
    gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": 'translationtrainings.rosetta.dev "q" not found',
            "details": {"name": "q", "group": "rosetta.dev", "kind": "translationtrainings"}}
    apiserver.routes[f"{TRAININGS}/q"] = (404, "application/json", json.dumps(gone))
    assert main(["get", "q", "--kubeconfig", config]) == 1
    assert one_error(capsys.readouterr().err) == \
        'error: translationtrainings.rosetta.dev "q" not found in namespace "default"'
