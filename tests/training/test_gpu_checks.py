"""bench/gpu_checks.sh --cpu: the one-shot GPU script's rehearsal, every step at tiny sizes, so that a
lent GPU's few minutes are never spent finding a bug of the script itself.

Each step must end "ok" with its figures in gpu_checks.jsonl and a row in gpu_checks.md; the
compiled variants run through torch.compile's capture (ROSETTA_COMPILE_BACKEND=aot_eager, as the
script sets on a CPU), the peer comparison through Seq2SeqTrainer, the strategies through DDP and
DeepSpeed ZeRO-2, and the BLEU step through a SIGTERM'd training and `rosetta evaluate`.
"""

import json
import os
import subprocess
import sys

import pytest

from support.training import ROOT, SHARED

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = ["device", "step-counts", "transformer-base", "t5-base", "multi30k-bleu", "vs-peer", "strategies"]


def test_every_step_of_the_gpu_script_runs_on_a_cpu(tmp_path):
    results = tmp_path / "results"
    # One thread: the other worker of `make test` holds the second core, and the tiny steps gain nothing from two.
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_checks.sh"), "--cpu", str(SHARED / "data" / "multi30k"),
                           str(results)], capture_output=True, text=True, env=env, timeout=1700)
    records = [json.loads(line) for line in (results / "gpu_checks.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == STEPS, proc.stdout[-3000:]
    failed = {r["step"]: r.get("log_tail", "") for r in records if r["status"] != "ok"}
    assert not failed, failed
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_step = {r["step"]: r for r in records}
    assert by_step["device"]["matmul_flops"] > 0
    counts = {row["variant"]: row for row in by_step["step-counts"]["rows"]}
    assert counts["rosetta (compile none)"]["syncs"] == 0 and counts["seq2seq-trainer"]["syncs"] > 0
    for step in ("t5-base", "transformer-base"):
        assert set(by_step[step]["modes"]) == {"none", "default", "reduce-overhead"}
        assert all(m["ms_per_step"] > 0 for m in by_step[step]["modes"].values())
    assert all(r["ratio"] > 0 for r in by_step["vs-peer"]["runs"].values())
    assert {r["variant"]: r["exit"] for r in by_step["strategies"]["results"]} == {"ddp": 0, "zero2": 0}
    assert by_step["multi30k-bleu"]["steps"] > 0 and by_step["multi30k-bleu"]["scores"]
    table = (results / "gpu_checks.md").read_text()
    assert all(f"| {step} |" in table for step in STEPS)
    assert (results / "logs.tgz").is_file()
