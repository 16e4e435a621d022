"""A Hugging Face hub stand-in on loopback (the real one is out of reach here): the four requests
`huggingface_hub.snapshot_download` makes against HF_ENDPOINT, served from a dict of repositories.

    with fake_hub({("model", "org/tiny"): {"config.json": b"{}"}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)

Repository info at a revision, the file tree at its commit, and each file's metadata (HEAD) and
bytes (GET) under /resolve/; anything else is the hub's 404 for a repository it does not have.
`hub.requests` records (method, path) of each request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

Repos = dict[tuple[str, str], dict[str, bytes]]  # (model | dataset, org/name) -> {path: bytes}
PLURAL = {"model": "models", "dataset": "datasets"}


def commit_of(kind: str, repo: str, revision: str) -> str:
    return hashlib.sha1(f"{kind}/{repo}@{revision}".encode()).hexdigest()


class FakeHub:
    def __init__(self, repos: Repos):
        self.repos, self.requests = repos, []
        self.commits: dict[str, tuple[str, str]] = {}  # commit -> (kind, repo)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._route(self)

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _route(self, req: BaseHTTPRequestHandler) -> None:
        self.requests.append((req.command, req.path))
        path = req.path.split("?")[0]
        for (kind, repo), files in self.repos.items():
            api = f"/api/{PLURAL[kind]}/{repo}/"
            if path.startswith(api + "revision/"):
                revision = path[len(api + "revision/"):]
                commit = commit_of(kind, repo, revision)
                self.commits[commit] = (kind, repo)
                return _send(req, 200, {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]})
            if path.startswith(api + "tree/"):
                return _send(req, 200, [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                                        for f, b in files.items()])
            resolve = f"/{'datasets/' if kind == 'dataset' else ''}{repo}/resolve/"
            if path.startswith(resolve):
                commit, _, name = path[len(resolve):].partition("/")
                if name in files and self.commits.get(commit) == (kind, repo):
                    body = files[name]
                    return _send(req, 200, body, {"X-Repo-Commit": commit,
                                                  "ETag": f'"{hashlib.sha1(body).hexdigest()}"'})
        _send(req, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})


def _send(req: BaseHTTPRequestHandler, code: int, body, headers: dict | None = None) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req.send_response(code)
    req.send_header("Content-Type", "application/octet-stream" if isinstance(body, bytes) else "application/json")
    for key, value in (headers or {}).items():
        req.send_header(key, value)
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    if req.command != "HEAD":
        req.wfile.write(data)


@contextmanager
def fake_hub(repos: Repos) -> Iterator[FakeHub]:
    hub = FakeHub(repos)
    thread = threading.Thread(target=hub._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub._server.shutdown()
        hub._server.server_close()
