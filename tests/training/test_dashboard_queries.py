"""Every panel of the training dashboards returns data from a real Prometheus scraping a real training.

A tiny CPU training (`rosetta train`, the code rank 0 runs in a pod) serves its metrics endpoint;
Debian's `prometheus` scrapes it every second, as the chart's PodMonitor has a cluster's Prometheus
do. Each panel's query, with the dashboard variables set to this training, goes through
Prometheus' HTTP API and must return a finite value. The queries over other exporters' series
(dcgm-exporter's GPU counters, node-exporter's network bytes) run too, so they parse, but cannot
return data here: for them the test checks that the names are exactly those the exporters publish.
About 12 s on two cores, so not marked slow: `make test-fast` runs it too.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import yaml

from control_plane import free_port
from support.prometheus import Prometheus, prometheus
from support.training import ROOT, TINY, deep_update

BOARDS = [ROOT / "charts" / "rosetta" / "dashboards" / name
          for name in ("training-overview.json", "gpu-and-network.json")]
NAMESPACE, TRAINING = "team", "dash"
VARIABLES = {"$namespace": NAMESPACE, "$training": TRAINING, "$node": ".*", "$__rate_interval": "1m"}

# The series other exporters publish, by the names they publish them under (dcgm-exporter's
# default and DCP counter lists; node-exporter's netdev and infiniband collectors).
DCGM_EXPORTER = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
}
NODE_EXPORTER = {
    "node_network_transmit_bytes_total", "node_network_receive_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total", "node_infiniband_port_data_received_bytes_total",
}
# Trainer series a tiny CPU training cannot have, and why.
NOT_FROM_THIS_TRAINING = {
    "rosetta_gpu_memory_bytes": "reported on GPUs only",
    "rosetta_eval_gender_gap_bleu": "needs an MT-GenEval evaluation set with gendered variants",
}


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\{", expr))
    assert names, f"no metric selector in {expr!r}"
    return names


def substitute(expr: str) -> str:
    for variable in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, VARIABLES[variable])
    assert "$" not in expr, expr
    return expr


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, query) of every target."""
    return [(board.name, panel["title"], target["expr"])
            for board in BOARDS for panel in json.loads(board.read_text())["panels"] for target in panel["targets"]]


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def training_config(port: int) -> dict:
    """Long enough to be stopped once every panel has data: evaluations and checkpoints early."""
    return deep_update(TINY, {"metadata": {"name": TRAINING, "namespace": NAMESPACE}, "spec": {
        "training": {"maxSteps": 100000},
        "checkpoint": {"interval": 20, "keep": 2},
        "evaluation": {"interval": 20, "maxSamples": 8, "maxNewTokens": 8},
        # A made-up CPU peak, so MFU is a figure rather than NaN.
        "metrics": {"port": port, "tensorboard": False, "peakFlops": 1e11},
    }})


def test_exporter_names_are_the_exporters_own():
    used = {name for _, _, expr in panel_queries() for name in metric_names(expr) if not name.startswith("rosetta_")}
    assert used == DCGM_EXPORTER | NODE_EXPORTER


def test_every_panel_query_returns_data_for_a_real_training(tmp_path):
    port = free_port()
    config = tmp_path / "training.yaml"
    config.write_text(yaml.safe_dump(training_config(port)))
    log = tmp_path / "training.log"
    queries = panel_queries()
    external = {(b, t, e) for b, t, e in queries if metric_names(e) & (DCGM_EXPORTER | NODE_EXPORTER)}
    absent_here = {(b, t, e) for b, t, e in queries if metric_names(e) & set(NOT_FROM_THIS_TRAINING)}
    from_trainer = [q for q in queries if q not in external and q not in absent_here]
    for _, title, expr in external:
        assert all(not n.startswith("rosetta_") for n in metric_names(expr)), \
            f"{title}: one query per exporter, so the trainer's part is checked on its own"
    assert len(from_trainer) > 20

    with prometheus({"trainer": [f"127.0.0.1:{port}"]}, tmp_path / "prometheus", interval="1s") as prom, \
            log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rosetta_trainer", "train", "-f", str(config), "--output", str(tmp_path / "out"),
             "--no-progress"], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        try:
            missing = wait_for_data(prom, from_trainer, proc, timeout=150)
            assert not missing, (f"no data for {missing}\n" + log.read_text(errors="replace")[-3000:])
            for _, _, expr in external | absent_here:
                prom.query(substitute(expr))  # valid PromQL; no data without the exporter or a GPU
            check_variables(prom)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def wait_for_data(prom: Prometheus, queries, proc: subprocess.Popen, timeout: float) -> list[str]:
    """Poll until every query has a finite value; the ones still without one when time is up."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [f"{board}: {title}: {expr}" for board, title, expr in queries
                   if not finite(prom.query(substitute(expr)))]
        if not missing or time.monotonic() > deadline or proc.poll() is not None:
            return missing
        time.sleep(1)


def check_variables(prom: Prometheus) -> None:
    """The namespace and training variables offer this training (label_values over Prometheus' API)."""
    for board in BOARDS:
        for variable in json.loads(board.read_text())["templating"]["list"]:
            found = re.fullmatch(r"label_values\((.+), (\w+)\)", variable.get("definition", ""))
            if not found or variable["name"] not in ("namespace", "training"):
                continue
            selector, label = found.groups()
            values = {series["metric"].get(label) for series in prom.query(substitute(selector))}
            assert VARIABLES[f"${variable['name']}"] in values, (board.name, variable["name"], values)
