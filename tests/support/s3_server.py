"""A real S3-compatible HTTP server (moto's server mode) and a fault-injecting proxy in front of it.

The proxy is an ordinary HTTP server: each request is forwarded to moto unless
the test's `faults` function decides otherwise, so the client under test sees
real 500/503 answers and real dropped connections, not patched methods.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Union

Fault = Union[None, int, str]  # None: forward; 500/503: answer with that S3 error; "drop": close unanswered

_ERROR_CODES = {500: "InternalError", 503: "SlowDown"}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def isolate_aws_env(monkeypatch, tmp_path) -> None:
    """The standard AWS chain, from env only (moto's test credentials): nothing of the machine's own
    AWS setup leaks in."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                       "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@contextmanager
def moto_s3():
    """An in-process moto S3 server on a free port; yields its base URL.

    moto's backends are process-wide: tests isolate themselves with their own buckets.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


class FaultyProxy:
    """HTTP proxy to `upstream` (http://host:port); `faults(method, path, n)` picks each request's fate.

    `log` records (method, path, outcome) of every request, outcome being the
    upstream status, the injected fault or "unreachable"; `injected` counts the faults.
    """

    def __init__(self, upstream: str, faults: Optional[Callable[[str, str, int], Fault]] = None):
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.faults = faults or (lambda method, path, n: None)
        self.log: list[tuple[str, str, Union[int, str]]] = []
        self._lock = threading.Lock()
        self._count = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

            def log_message(self, *args):
                pass

            def _any(self):
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def injected(self) -> int:
        return sum(1 for *_, outcome in self.log if outcome in ("drop", *_ERROR_CODES))

    def __enter__(self) -> "FaultyProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ----------------------------------------------------------------- internals
    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        body = _read_body(req)
        with self._lock:
            self._count += 1
            fault = self.faults(req.command, req.path, self._count)
        if fault == "drop":
            self._record(req, "drop")
            req.close_connection = True
            try:
                req.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault is not None:
            self._record(req, fault)
            payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{_ERROR_CODES[fault]}</Code>'
                       f"<Message>injected by the test proxy</Message></Error>").encode()
            req.send_response_only(fault)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", str(len(payload)))
            req.end_headers()
            if req.command != "HEAD":
                req.wfile.write(payload)
            return
        headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or "content-length" in {k.lower() for k in headers}:
            headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            # The Host header travels unchanged: it is part of the request's SigV4 signature.
            conn.request(req.command, req.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError:  # upstream down: the client sees a connection closed without an answer
            self._record(req, "unreachable")
            req.close_connection = True
            return
        finally:
            conn.close()
        self._record(req, resp.status)
        req.send_response_only(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in _HOP_BY_HOP and (key.lower() != "content-length" or req.command == "HEAD"):
                req.send_header(key, value)
        if req.command != "HEAD":
            req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)

    def _record(self, req, outcome) -> None:
        with self._lock:
            self.log.append((req.command, req.path, outcome))


def _read_body(req: BaseHTTPRequestHandler) -> bytes:
    if req.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(req.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while req.rfile.readline().strip():  # trailers, then the blank line
                    pass
                return bytes(out)
            out += req.rfile.read(size)
            req.rfile.readline()
    length = int(req.headers.get("Content-Length") or 0)
    return req.rfile.read(length) if length else b""
