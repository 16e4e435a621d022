"""The progress scrape against hostile endpoints: redirects, huge and endless bodies, trickles.

A local HTTP server plays rank 0; progress_round.update_progress scrapes it for real (the Kubernetes
API around it is faked: the training, rank 0's pod at 127.0.0.1 and the status write). Nothing
may be followed, read past 1 MiB, or take longer than the scrape's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from rosetta_operator import progress_round, scrape
from rosetta_operator.names import COMPLETION_INDEX

METRICS = "# TYPE rosetta_step gauge\nrosetta_step 120\n# TYPE rosetta_total_steps gauge\nrosetta_total_steps 600\n"
MiB = 1 << 20


class Rank0(BaseHTTPRequestHandler):
    """GET /<behaviour>; `hits` records every path asked for, so a followed redirect shows."""

    hits: list[str] = []
    sent: dict[str, int] = {}

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, length: bool = True) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        Rank0.hits.append(self.path)
        path = self.path
        try:
            if path == "/metrics":
                self._send(200, METRICS.encode())
            elif path == "/redirect":
                self._send(302, headers={"Location": "/metrics"})
            elif path == "/redirect-away":
                self._send(301, headers={"Location": "http://169.254.169.254/latest/meta-data/"})
            elif path == "/huge":  # announced
                self._send(200, b"x" * (2 * MiB))
            elif path == "/huge-unannounced":  # read until the server closes
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"# " + b"x" * (2 * MiB))
            elif path == "/endless":
                self.send_response(200)
                self.end_headers()
                chunk = b"# " + b"x" * 65534 + b"\n"
                sent = 0
                while sent < 512 * MiB:  # endless as far as a scrape can tell; stops if nobody reads
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    Rank0.sent["/endless"] = sent
            elif path == "/endless-chunked":
                self.protocol_version = "HTTP/1.1"
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 65536
                for _ in range(8192):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            elif path == "/trickle":  # a byte every 0.2 s, forever: each read alone would be quick
                self.send_response(200)
                self.end_headers()
                for _ in range(10_000):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif path == "/trickle-headers":
                self.wfile.write(b"HTTP/1.0 200 OK\r\n")
                for _ in range(10_000):
                    self.wfile.write(b"X: y\r\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            else:
                self._send(404)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scrape hung up: what it should do


@pytest.fixture(scope="module")
def rank0() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Rank0)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _fresh_hits():
    Rank0.hits.clear()
    Rank0.sent.clear()


def failure(url: str, **kwargs) -> tuple[scrape.ScrapeFailed, float]:
    started = time.monotonic()
    with pytest.raises(scrape.ScrapeFailed) as info:
        scrape.get(url, **kwargs)
    return info.value, time.monotonic() - started


def test_the_trainers_page_is_read(rank0):
    assert scrape.get(f"{rank0}/metrics") == METRICS


@pytest.mark.parametrize("path, status", [("/redirect", 302), ("/redirect-away", 301)])
def test_a_redirect_is_not_followed(rank0, path, status):
    failed, _ = failure(f"{rank0}{path}")
    assert (failed.outcome, failed.notable) == ("unreachable", True)
    assert failed.reason == f"{rank0}{path} answered {status}; redirects are not followed"
    assert Rank0.hits == [path]  # /metrics (or the metadata server) was never asked


@pytest.mark.parametrize("path, reason", [
    ("/huge", "announced 2097152 bytes, more than the 1048576 a scrape reads; not read"),
    ("/huge-unannounced", "sent more than the 1048576 bytes a scrape reads; the rest was not read"),
    ("/endless", "sent more than the 1048576 bytes a scrape reads; the rest was not read"),
    ("/endless-chunked", "sent more than the 1048576 bytes a scrape reads; the rest was not read"),
])
def test_a_body_over_1_mib_is_refused_after_at_most_1_mib(rank0, path, reason):
    failed, seconds = failure(f"{rank0}{path}")
    assert (failed.outcome, failed.reason) == ("too_large", f"{rank0}{path} {reason}")
    assert seconds < scrape.TIMEOUT


@pytest.mark.parametrize("path", ["/trickle", "/trickle-headers"])
def test_a_trickle_cannot_hold_the_scrape_past_its_deadline(rank0, path):
    failed, seconds = failure(f"{rank0}{path}", timeout=1.0)
    assert (failed.outcome, failed.notable) == ("unreachable", False)
    assert 0.9 < seconds < 1.6


def test_nothing_listening_is_unreachable_quietly():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the scrape: refused
    failed, _ = failure(f"http://127.0.0.1:{port}/metrics")
    assert (failed.outcome, failed.notable) == ("unreachable", False)


def test_proxies_are_not_used(rank0, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9/")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9/")
    assert scrape.get(f"{rank0}/metrics") == METRICS


# ------------------------------------------------------------- through update_progress


class FakeApi:
    """What update_progress asks of the Kubernetes client: the training and rank 0's pod."""

    def __init__(self, port: int, path: str):
        self.training = {"metadata": {"name": "mt", "namespace": "ml", "uid": "u1", "resourceVersion": "1"},
                         "spec": {"metrics": {"port": port}}, "status": {"jobSetName": "mt"}}
        self.pod = {"metadata": {"name": "mt-node-0-0-abcde", "creationTimestamp": "2024-01-01T00:00:00Z",
                                 "labels": {"jobset.sigs.k8s.io/jobset-name": "mt", COMPLETION_INDEX: "0"}},
                    "status": {"phase": "Running", "podIP": "127.0.0.1"}}
        self.path = path

    def sanitize_for_serialization(self, obj):
        return obj


@pytest.fixture
def fake_cluster(monkeypatch):
    """Patches the client classes progress_round uses; returns a function (port, path) -> (api, written)."""
    written: list[dict] = []

    def install(port: int, path: str):
        api = FakeApi(port, path)

        class Custom:
            def __init__(self, _api):
                pass

            def get_namespaced_custom_object(self, *args):
                return api.training

        class Core:
            def __init__(self, _api):
                pass

            def list_namespaced_pod(self, namespace, label_selector):
                return type("Pods", (), {"items": [api.pod]})()

        def write_status(_api, namespace, name, uid, compute, parent=None, **_):
            current = (parent or api.training).get("status") or {}
            written.append(compute(parent or api.training, current))

        monkeypatch.setattr(progress_round.kubernetes.client, "CustomObjectsApi", Custom)
        monkeypatch.setattr(progress_round.kubernetes.client, "CoreV1Api", Core)
        monkeypatch.setattr(progress_round, "write_status", write_status)
        # The pod's /metrics is where the test says: the scrape's URL is rank 0's IP, port and path.
        monkeypatch.setattr(progress_round.pr, "metrics_url", lambda pod, p: f"http://127.0.0.1:{p}{path}")
        return api, written

    return install


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_update_progress_reads_a_real_endpoint(rank0, fake_cluster):
    api, written = fake_cluster(port_of(rank0), "/metrics")
    assert progress_round.update_progress(api, "ml", "mt", "u1") == "updated"
    assert written[0]["progress"]["display"] == "20% 120/600"


CUT = "sent more than the 1048576 bytes a scrape reads; the rest was not read"


@pytest.mark.parametrize("path, outcome, logged", [
    ("/redirect", "unreachable", "answered 302; redirects are not followed"),
    ("/endless", "too_large", CUT),
    ("/huge", "too_large", "announced 2097152 bytes, more than the 1048576 a scrape reads; not read"),
    ("/huge-unannounced", "too_large", CUT),
])
def test_update_progress_counts_and_logs_a_hostile_endpoint(rank0, fake_cluster, caplog, path, outcome, logged):
    api, written = fake_cluster(port_of(rank0), path)
    with caplog.at_level(logging.WARNING, logger=progress_round.__name__):
        started = time.monotonic()
        assert progress_round.update_progress(api, "ml", "mt", "u1") == outcome
        assert time.monotonic() - started < progress_round.SCRAPE_TIMEOUT + 0.5
    assert written == []  # the last progress stays
    assert [r.getMessage() for r in caplog.records] == [f"progress of ml/mt: {rank0}{path} {logged}"]
    assert Rank0.hits == [path]
    if path == "/endless":  # the server wrote until its socket buffers were full, then was cut off
        assert Rank0.sent.get(path, 0) < 64 * MiB


def test_update_progress_does_not_log_what_a_hostile_reply_says(rank0, fake_cluster, caplog, monkeypatch):
    api, _ = fake_cluster(port_of(rank0), "/metrics")
    monkeypatch.setattr(scrape, "get", lambda *a, **k: "rosetta_step{le=\"SECRET-TEXT\n")
    with caplog.at_level(logging.WARNING, logger=progress_round.__name__):
        assert progress_round.update_progress(api, "ml", "mt", "u1") == "unreachable"
    assert caplog.records and all("SECRET-TEXT" not in r.getMessage() for r in caplog.records)


def test_too_large_is_a_counted_outcome():
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("rosetta_operator_progress_scrapes_total", {"outcome": "too_large"}) is not None
