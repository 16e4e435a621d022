"""A Prometheus server (Debian's `prometheus` package) scraping a cluster's metrics endpoints from the host,
through their Services' cluster IPs (kube-proxy's rules route the host's connections too)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from control_plane import free_port
from support.servers import server

NODE_PACKAGES = Path(__file__).resolve().parents[1] / "envtest" / "node-packages.sh"


def scrape_config(jobs: dict[str, list[str]], interval: str = "2s") -> dict:
    """One static job per name. (Debian builds Prometheus without Kubernetes service discovery; the
    tests name Service addresses instead, which kube-proxy routes as it would an in-cluster scrape.)"""
    return {"global": {"scrape_interval": interval, "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": name, "static_configs": [{"targets": targets}]}
                               for name, targets in jobs.items()]}


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                                    timeout=5) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


@contextlib.contextmanager
def prometheus(jobs: dict[str, list[str]], folder: Path, interval: str = "2s") -> Iterator[Prometheus]:
    """Prometheus scraping `jobs` ({job name: ["host:port", ...]}) every `interval`."""
    if shutil.which("prometheus") is None:  # node-packages.sh installs what is missing (as root)
        subprocess.run(["bash", str(NODE_PACKAGES)], capture_output=True, text=True, timeout=900)
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus binary: run tests/envtest/node-packages.sh as root (Debian's package)",
                    pytrace=False)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(jobs, interval)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    with server(argv, folder / "prometheus.log", f"{url}/-/ready", "prometheus"):
        yield Prometheus(url)
