"""Every panel of the training dashboards returns data from a real Prometheus scraping a real training.

A tiny CPU training (`rosetta train`, the code rank 0 runs in a pod) serves its metrics endpoint;
Debian's `prometheus` scrapes it every second, as the chart's PodMonitor has a cluster's Prometheus
do. Each panel's query, with the dashboard variables set to this training, goes through
Prometheus' HTTP API and must return a finite value. The queries over other exporters' series
(dcgm-exporter's GPU counters, node-exporter's network bytes) run too, so they parse, but cannot
return data here: for them the test checks that the names are exactly those the exporters publish.
About 12 s on two cores: marked slow, as every test over 4 s is (docs/testing.md). The same queries run
against a training in a pod in tests/cluster/test_real_pods.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from control_plane import free_port
from support.dashboards import (
    DCGM_EXPORTER,
    NODE_EXPORTER,
    check_variables,
    metric_names,
    panel_queries,
    split_queries,
    substitute,
    wait_for_data,
)
from support.prometheus import prometheus
from support.training import TINY, deep_update

NAMESPACE, TRAINING = "team", "dash"


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


@pytest.mark.slow  # ~12 s: a training and Prometheus
def test_every_panel_query_returns_data_for_a_real_training(tmp_path):
    port = free_port()
    config = tmp_path / "training.yaml"
    config.write_text(yaml.safe_dump(training_config(port)))
    log = tmp_path / "training.log"
    from_trainer, external, absent_here = split_queries()
    assert len(from_trainer) > 20

    with prometheus({"trainer": [f"127.0.0.1:{port}"]}, tmp_path / "prometheus", interval="1s") as prom, \
            log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rosetta_trainer", "train", "-f", str(config), "--output", str(tmp_path / "out"),
             "--no-progress"], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        try:
            missing = wait_for_data(prom, from_trainer, NAMESPACE, TRAINING, lambda: proc.poll() is None, timeout=150)
            assert not missing, (f"no data for {missing}\n" + log.read_text(errors="replace")[-3000:])
            for _, _, expr in external | absent_here:
                prom.query(substitute(expr, NAMESPACE, TRAINING))  # valid PromQL; no data without the exporter
            check_variables(prom, NAMESPACE, TRAINING)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
