"""A trainer that stops stepping, on the real node: the trainer image's own trainer hangs after a step
(the FAULT_HANG_AFTER_STEP test hook: no step, no heartbeat, SIGTERM ignored, as a hung collective or
storage would), and nothing else is simulated. The operator, scraping rank 0's real endpoint, finds the
heartbeat stopped, marks the training Stalled, ends the attempt through its Job; the JobSet controller
restarts the gang, which resumes from the last checkpoint on the shared volume and finishes.

Marked slow: two starts of a real training (about three minutes on two CPUs).
"""

from __future__ import annotations

import json
import time

import pytest
from test_real_pods import one_pod_training, pod_log
from workloads import bound_claim, condition, status

from rosetta_operator.conditions import ConditionType, Reason
from support.cluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HANG_AFTER = 14
CHECKPOINT_EVERY = 10
# Far above what a tiny model on two shared cores takes between two heartbeats (its slowest gap is
# start-up: from the metrics endpoint up to the first step), far below the default hour.
STALL_TIMEOUT = 30


def test_a_trainer_that_stops_stepping_is_stalled_restarted_and_resumes(node_cluster, node_namespace, node_operator,
                                                                        tmp_path):
    ns, name = node_namespace, "stalls"
    doc = one_pod_training(ns, name)
    spec = doc["spec"]
    storage = tmp_path / "rwx"  # the restarted pod must find the first attempt's checkpoints
    bound_claim(node_cluster, ns, "stalls-checkpoints", folder=storage)
    spec["volumes"] = [{"name": "checkpoints", "mountPath": "/checkpoints", "purpose": "checkpoints",
                        "persistentVolumeClaim": {"claimName": "stalls-checkpoints"}}]
    spec["data"]["test"] = [{"format": "generated", "size": 40, "seed": 3}]
    # The restart must run long enough for the operator's 2-second scrapes to see rank 0 beat again:
    # a step of this model takes about 0.2 s on the node.
    spec["training"].update(maxSteps=8 * CHECKPOINT_EVERY, logInterval=2)
    spec["checkpoint"]["interval"] = spec["evaluation"]["interval"] = CHECKPOINT_EVERY
    spec["evaluation"]["maxSamples"] = 8
    spec["faultTolerance"] = {"stallTimeoutSeconds": STALL_TIMEOUT}
    spec["terminationGracePeriodSeconds"] = 5  # the hung trainer ignores SIGTERM: SIGKILL comes after this
    spec["env"] = [{"name": "FAULT_HANG_AFTER_STEP", "value": str(HANG_AFTER)}]
    started = time.monotonic()
    node_cluster.create_training(ns, doc)

    wait_for(lambda: (status(node_cluster, ns, name).get("progress") or {}).get("step", 0) >= HANG_AFTER,
             f"step {HANG_AFTER} in the status", timeout=300)
    hung = time.monotonic()
    stalled = wait_for(lambda: (c := condition(node_cluster, ns, name, ConditionType.STALLED)) and c, "Stalled",
                       timeout=STALL_TIMEOUT + 60)
    found_after = time.monotonic() - hung
    assert (stalled["status"], stalled["reason"]) == ("True", Reason.NO_HEARTBEAT), stalled
    assert f"no heartbeat from rank 0 for {STALL_TIMEOUT} s" in stalled["message"], stalled
    assert f"last logged step {HANG_AFTER}, rank 0 training" in stalled["message"], stalled
    assert "(stallAction: restart)" in stalled["message"], stalled
    # Not before the timeout (the hang came at most one log line after step 14 was seen), nor long after.
    assert STALL_TIMEOUT - 5 <= found_after <= STALL_TIMEOUT + 30, found_after

    def stall_events() -> list[tuple[str, str]]:
        listed = node_cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return [(e.type, e.message) for e in listed if e.reason == Reason.STALLED]

    assert wait_for(stall_events, "the Warning event", timeout=30) == [("Warning", stalled["message"])]

    # The Job of the stalled attempt is ended, the JobSet restarts the gang, and the restart says why.
    messages: set[str] = set()

    def finished():
        now = status(node_cluster, ns, name)
        messages.add(now.get("message") or "")
        return now.get("phase") in ("Succeeded", "Failed") and now

    done = wait_for(finished, f"{name} to finish", timeout=480)
    pods = node_cluster.pods(ns, name)
    assert done["phase"] == "Succeeded", (done, [pod_log(node_cluster, ns, p.metadata.name) for p in pods])
    assert (done["restarts"], done["stalls"], done.get("preemptions", 0)) == (1, 1, 0), done
    assert any(m.startswith("restart 1 after a stall:") for m in messages), messages
    beats = next(c for c in done["conditions"] if c["type"] == ConditionType.STALLED)
    assert (beats["status"], beats["reason"]) == ("False", Reason.HEARTBEAT), beats

    summary = json.loads((storage / name / "summary.json").read_text())
    assert summary["restart_attempt"] == 1
    assert summary["resumed_from_step"] == CHECKPOINT_EVERY, summary  # the newest checkpoint before the hang
    assert summary["steps"] == spec["training"]["maxSteps"] and summary["completed"]
    print(f"\nstall found {found_after:.0f} s after step {HANG_AFTER} was seen (timeout {STALL_TIMEOUT} s); "
          f"whole test {time.monotonic() - started:.0f} s")
