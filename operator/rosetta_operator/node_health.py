"""Bad nodes kept out of a training's next attempts.

A rank whose pre-flight check fails (spec.faultTolerance.preflight) exits with NodeUnhealthy; the
operator records the pod's node in status.excludedNodes, up to preflight.maxExcludedNodes. With the
pre-flight on, every gang pod is created behind the scheduling gate pod_template.NODE_HEALTH_GATE: the
JobSet's pod template cannot change its affinity between restarts, but a gated pod may gain node
affinity terms. The operator adds `metadata.name NotIn [excluded nodes]` to each of the pod's
required node selector terms (or one term of its own) and lifts its gate, in one patch.

`exclude` and `release_patch` are pure; `release` reads the training and patches the pod.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Optional

import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.failures import FailureClass
from rosetta_operator.api_calls import get_training, jobset_and_training
from rosetta_operator.attempts import Failure, pod_attempt
from rosetta_operator.pod_template import NODE_HEALTH_GATE
from rosetta_operator.progress import JOBSET_NAME_LABEL

log = logging.getLogger(__name__)

DEFAULT_MAX_EXCLUDED = 4
# How long a pod of attempt N waits for attempt N-1's end to be recorded before its gate is lifted
# anyway: the JobSet restarts the gang as soon as a pod fails, often before the operator has written
# why, and a pod released too early could land on the node that just failed.
RECORD_WAIT_SECONDS = 15.0
_AFFINITY = "/spec/affinity"
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def max_excluded(parent: Mapping[str, Any]) -> int:
    preflight = (((parent.get("spec") or {}).get("faultTolerance") or {}).get("preflight") or {})
    value = preflight.get("maxExcludedNodes", DEFAULT_MAX_EXCLUDED)
    return int(value) if isinstance(value, int) else DEFAULT_MAX_EXCLUDED


def exclude(excluded: list[Mapping[str, Any]], failure: Failure, *, limit: int, now: str) -> Optional[list[dict[str, Any]]]:
    """status.excludedNodes with the failing pod's node added, or None when nothing changes (not a
    NodeUnhealthy failure, no node known, already excluded, or the limit reached)."""
    if failure.failure_class != FailureClass.NODE_UNHEALTHY or not failure.node:
        return None
    if any(e.get("node") == failure.node for e in excluded) or len(excluded) >= limit:
        return None
    entry: dict[str, Any] = {"node": failure.node, "reason": failure.failure_class, "message": failure.message,
                             "time": now}
    if failure.attempt is not None:
        entry["attempt"] = failure.attempt
    return [dict(e) for e in excluded] + [entry]


def gated(pod: Mapping[str, Any]) -> bool:
    """The pod waits behind the operator's gate (and is not going away)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(g.get("name") == NODE_HEALTH_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def release_patch(pod: Mapping[str, Any], nodes: list[str]) -> list[dict[str, Any]]:
    """The JSON patch that keeps the pod off `nodes` and lifts the operator's gate (other gates,
    Kueue's, stay). A gated pod's required node affinity may only gain requirements inside its
    existing terms (apiserver validation), so each term gets the same matchFields entry."""
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    if nodes:
        keep_off = {"key": "metadata.name", "operator": "NotIn", "values": sorted(set(nodes))}
        affinity = spec.get("affinity") or {}
        terms = (((affinity.get("nodeAffinity") or {}).get(_REQUIRED) or {}).get("nodeSelectorTerms")) or []
        if terms:
            base = f"{_AFFINITY}/nodeAffinity/{_REQUIRED}/nodeSelectorTerms"
            for i, term in enumerate(terms):
                if term.get("matchFields"):
                    ops.append({"op": "add", "path": f"{base}/{i}/matchFields/-", "value": keep_off})
                else:
                    ops.append({"op": "add", "path": f"{base}/{i}/matchFields", "value": [keep_off]})
        else:
            required = {_REQUIRED: {"nodeSelectorTerms": [{"matchFields": [keep_off]}]}}
            if not affinity:
                ops.append({"op": "add", "path": _AFFINITY, "value": {"nodeAffinity": required}})
            elif not affinity.get("nodeAffinity"):
                ops.append({"op": "add", "path": f"{_AFFINITY}/nodeAffinity", "value": required})
            else:
                ops.append({"op": "add", "path": f"{_AFFINITY}/nodeAffinity/{_REQUIRED}", "value": required[_REQUIRED]})
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != NODE_HEALTH_GATE]
    ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": gates})
    return ops


def _previous_recorded(status: Mapping[str, Any], attempt: Optional[int]) -> bool:
    if not attempt:
        return True
    return any(a.get("attempt") == attempt - 1 and a.get("reason") for a in status.get("attempts") or [])


def release(api: kubernetes.client.ApiClient, namespace: str, pod: Mapping[str, Any]) -> Optional[list[str]]:
    """Lift the gate of one gang pod, keeping it off the training's excluded nodes; the nodes it
    was kept off, or None when the pod is not one of a training of ours."""
    jobset_name = ((pod.get("metadata") or {}).get("labels") or {}).get(JOBSET_NAME_LABEL)
    if not jobset_name:
        return None
    _, owner = jobset_and_training(api, namespace, jobset_name)
    if owner is None:
        return None
    attempt = pod_attempt(pod)
    deadline = time.monotonic() + RECORD_WAIT_SECONDS
    while True:
        training = get_training(api, namespace, owner["name"])
        if training is None:
            return None
        status = training.get("status") or {}
        if _previous_recorded(status, attempt) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    nodes = [str(e["node"]) for e in status.get("excludedNodes") or [] if e.get("node")]
    name = pod["metadata"]["name"]
    try:
        kubernetes.client.CoreV1Api(api).patch_namespaced_pod(name, namespace, release_patch(pod, nodes))
    except ApiException as exc:
        if exc.status in (404, 409, 422):  # gone, or the gate already lifted: nothing to do
            log.info("pod %s/%s: gate not lifted (%s)", namespace, name, exc.reason)
            return None
        raise
    return nodes
