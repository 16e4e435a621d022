"""The Grafana dashboards' queries, for the tests that run them against a real Prometheus scraping a
real training (tests/training/test_dashboard_queries.py on this machine, tests/cluster/test_real_pods.py
in a pod): which queries the trainer answers, which need another exporter, and polling for data."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Callable

from support.prometheus import Prometheus
from support.training import ROOT

BOARDS = [ROOT / "charts" / "rosetta" / "dashboards" / name
          for name in ("training-overview.json", "gpu-and-network.json")]

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
NOT_FROM_A_CPU_TRAINING = {
    "rosetta_gpu_memory_bytes": "reported on GPUs only",
    "rosetta_eval_gender_gap_bleu": "needs an MT-GenEval evaluation set with gendered variants",
    "rosetta_eval_gender_bleu": "needs an MT-GenEval evaluation set with gendered variants",
    "rosetta_eval_gender_accuracy_by_gender": "needs an MT-GenEval evaluation set with gendered variants",
}

Query = tuple[str, str, str]  # (dashboard file, panel title, expression)


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\{", expr))
    assert names, f"no metric selector in {expr!r}"
    return names


def substitute(expr: str, namespace: str, training: str) -> str:
    variables = {"$namespace": namespace, "$training": training, "$node": ".*", "$__rate_interval": "1m"}
    for variable in sorted(variables, key=len, reverse=True):
        expr = expr.replace(variable, variables[variable])
    assert "$" not in expr, expr
    return expr


def panel_queries() -> list[Query]:
    """(dashboard file, panel title, query) of every target."""
    return [(board.name, panel["title"], target["expr"])
            for board in BOARDS for panel in json.loads(board.read_text())["panels"] for target in panel["targets"]]


def split_queries() -> tuple[list[Query], set[Query], set[Query]]:
    """(the trainer's own, other exporters', trainer series a CPU training lacks)."""
    queries = panel_queries()
    external = {q for q in queries if metric_names(q[2]) & (DCGM_EXPORTER | NODE_EXPORTER)}
    absent = {q for q in queries if metric_names(q[2]) & set(NOT_FROM_A_CPU_TRAINING)}
    for _, title, expr in external:
        assert all(not n.startswith("rosetta_") for n in metric_names(expr)), \
            f"{title}: one query per exporter, so the trainer's part is checked on its own"
    return [q for q in queries if q not in external and q not in absent], external, absent


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def wait_for_data(prom: Prometheus, queries: list[Query], namespace: str, training: str,
                  running: Callable[[], bool], timeout: float) -> list[str]:
    """Poll until every query has a finite value; the ones still without one when time is up or
    the training stopped."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [f"{board}: {title}: {expr}" for board, title, expr in queries
                   if not finite(prom.query(substitute(expr, namespace, training)))]
        if not missing or time.monotonic() > deadline or not running():
            return missing
        time.sleep(1)


def check_variables(prom: Prometheus, namespace: str, training: str) -> None:
    """The namespace and training variables offer this training (label_values over Prometheus' API)."""
    expected = {"namespace": namespace, "training": training}
    for board in BOARDS:
        for variable in json.loads(board.read_text())["templating"]["list"]:
            found = re.fullmatch(r"label_values\((.+), (\w+)\)", variable.get("definition", ""))
            if not found or variable["name"] not in expected:
                continue
            selector, label = found.groups()
            values = {series["metric"].get(label) for series in prom.query(substitute(selector, namespace, training))}
            assert expected[variable["name"]] in values, (board.name, variable["name"], values)
