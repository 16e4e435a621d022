"""Gather: what the cluster says about one training's JobSet, read into one plain value (`Seen`) that
decide.py turns into the status and the actions. The only module of the three steps (gather, decide,
act) that reads: the JobSet, its pods when they have something to tell (why an attempt ended, a
finished run's final figures) and Kueue's Workload of a held, queued JobSet.

What is read depends on the status the handler holds: a training failed for good reads nothing,
and the pods are listed only when the JobSet shows a failure the status has not counted yet, or has
just succeeded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator.api_calls import get_jobset, get_workload
from rosetta_operator.jobset_status import jobset_succeeded, queue_of, shows_failure
from rosetta_operator.status import stopped_for_good


@dataclass(frozen=True)
class Seen:
    """One look at a training's JobSet. None stands for not there, or not read because the status
    needed none of it; `pods` is also None when the API refused the list."""

    jobset_name: str
    jobset: Optional[Mapping[str, Any]] = None
    workload: Optional[Mapping[str, Any]] = None
    pods: Optional[tuple[Mapping[str, Any], ...]] = None


def gather(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, training: Mapping[str, Any],
           jobset: Optional[Mapping[str, Any]] = None, workload: Optional[Mapping[str, Any]] = None) -> Seen:
    """What the cluster says now about `training`'s JobSet; `jobset` is one the caller already holds
    (None: read it here), `workload` Kueue's for it (None: listed here when the JobSet waits for it)."""
    current = training.get("status") or {}
    if stopped_for_good(current):
        return Seen(jobset_name, jobset, workload)  # failed for good: nothing the JobSet does changes that
    if jobset is None:
        jobset = get_jobset(api, namespace, jobset_name)
    if jobset is None:
        return Seen(jobset_name)
    pods = None
    if shows_failure(jobset, current.get("restarts")):
        pods = jobset_pods(api, namespace, jobset_name, "to say why the attempt ended")
    elif jobset_succeeded(jobset) and current.get("phase") != Phase.SUCCEEDED:
        pods = jobset_pods(api, namespace, jobset_name, "for the final result")
    if workload is None and queue_of(jobset) and (jobset.get("spec") or {}).get("suspend"):
        workload = get_workload(api, namespace, jobset)
    return Seen(jobset_name, jobset, workload, None if pods is None else tuple(pods))


def jobset_pods(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str,
                purpose: str) -> Optional[list[dict[str, Any]]]:
    """The JobSet's pods as plain dicts; None (logged) when the API refuses the list."""
    try:
        pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{pr.JOBSET_NAME_LABEL}={jobset_name}")
    except ApiException as exc:
        logging.getLogger(__name__).warning("cannot list the pods of JobSet %s/%s %s: %s",
                                            namespace, jobset_name, purpose, exc.reason)
        return None
    return [api.sanitize_for_serialization(p) for p in pods.items]
