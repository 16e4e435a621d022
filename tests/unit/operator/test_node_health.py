"""Bad nodes kept out (node_health.py): which nodes are excluded, and the patch that lifts a gang
pod's gate with them kept out, in the only form the apiserver accepts for a gated pod."""

from __future__ import annotations

import jsonpatch
import pytest

from rosetta_contract.failures import FailureClass
from rosetta_operator.attempts import Failure
from rosetta_operator.node_health import exclude, gated, max_excluded, release_patch
from rosetta_operator.pod_template import NODE_HEALTH_GATE

KUEUE_GATE = {"name": "kueue.x-k8s.io/topology"}


def unhealthy(node="gpu-7", attempt=0):
    return Failure(FailureClass.NODE_UNHEALTHY, f"pod p on node {node}: GPU 0 failed", "p", node, 1, attempt, 81)


def test_a_node_unhealthy_failure_excludes_its_node_once_and_up_to_the_limit():
    excluded = exclude([], unhealthy(), limit=2, now="t0")
    assert excluded == [{"node": "gpu-7", "reason": "NodeUnhealthy", "message": "pod p on node gpu-7: GPU 0 failed",
                         "time": "t0", "attempt": 0}]
    assert exclude(excluded, unhealthy(attempt=1), limit=2, now="t1") is None  # already out
    excluded = exclude(excluded, unhealthy("gpu-8", 1), limit=2, now="t1")
    assert [e["node"] for e in excluded] == ["gpu-7", "gpu-8"]
    assert exclude(excluded, unhealthy("gpu-9", 2), limit=2, now="t2") is None  # the limit
    # Only NodeUnhealthy, and only with a node.
    assert exclude([], Failure(FailureClass.OOM_KILLED, "m", "p", "gpu-7"), limit=2, now="t") is None
    assert exclude([], unhealthy(node=None), limit=2, now="t") is None


def test_the_limit_comes_from_the_spec():
    assert max_excluded({"spec": {"faultTolerance": {"preflight": {"maxExcludedNodes": 1}}}}) == 1
    assert max_excluded({"spec": {}}) == 4


def pod(affinity=None, gates=(NODE_HEALTH_GATE,), deleting=False):
    spec = {"schedulingGates": [{"name": g} if isinstance(g, str) else g for g in gates]}
    if affinity is not None:
        spec["affinity"] = affinity
    meta = {"name": "p", "deletionTimestamp": "t"} if deleting else {"name": "p"}
    return {"metadata": meta, "spec": spec}


def test_only_a_live_pod_behind_our_gate_is_released():
    assert gated(pod()) and not gated(pod(gates=[KUEUE_GATE])) and not gated(pod(deleting=True))


KEEP_OFF = {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-7", "gpu-8"]}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize("affinity, expected", [
    (None, {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [KEEP_OFF]}]}}}),
    ({"podAntiAffinity": {"x": 1}},
     {"podAntiAffinity": {"x": 1}, "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [KEEP_OFF]}]}}}),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
     {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [],
                       REQUIRED: {"nodeSelectorTerms": [{"matchFields": [KEEP_OFF]}]}}}),
])
def test_a_pod_without_required_node_affinity_gets_one_term(affinity, expected):
    patched = jsonpatch.apply_patch(pod(affinity, gates=[NODE_HEALTH_GATE, KUEUE_GATE]),
                                    release_patch(pod(affinity, gates=[NODE_HEALTH_GATE, KUEUE_GATE]), ["gpu-8", "gpu-7"]))
    assert patched["spec"]["affinity"] == expected
    assert patched["spec"]["schedulingGates"] == [KUEUE_GATE]  # Kueue's stays


def test_a_users_required_terms_each_gain_the_requirement_and_keep_theirs_first():
    """The apiserver lets a gated pod's required node affinity only gain requirements within its
    existing terms (validateNodeAffinityMutation): each term is ANDed with the exclusion."""
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    own_field = {"key": "metadata.name", "operator": "NotIn", "values": ["old"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zone]},
                                                                 {"matchExpressions": [zone], "matchFields": [own_field]}]}}}
    patched = jsonpatch.apply_patch(pod(affinity), release_patch(pod(affinity), ["gpu-7", "gpu-8"]))
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [zone], "matchFields": [KEEP_OFF]},
                     {"matchExpressions": [zone], "matchFields": [own_field, KEEP_OFF]}]
    assert patched["spec"]["schedulingGates"] == []


def test_with_no_node_excluded_the_gate_is_all_that_changes():
    assert release_patch(pod(), []) == [{"op": "replace", "path": "/spec/schedulingGates", "value": []}]
