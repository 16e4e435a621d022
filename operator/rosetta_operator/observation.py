"""The status a training should have for what its JobSet, its pods and Kueue say now: what every
handler that mirrors the JobSet (handlers.py) computes before api_calls.write_status writes it.

A failed pod whose termination message is a data error stops the gang at once (DataInvalid): the
same files would fail every restart. That, and a stall under stallAction: fail (progress_round.py),
is failed for good: nothing the suspended JobSet does afterwards changes the status. A succeeded
JobSet's final figures come from rank 0's termination message, as the progress scrapes stop with
the pods.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, cast

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from rosetta_contract.resource import Phase
from rosetta_operator import progress as pr
from rosetta_operator import status as st
from rosetta_operator.api_calls import get_jobset, get_workload, now, set_jobset_suspend


def observe(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str, parent: Mapping[str, Any],
            current: Mapping[str, Any], jobset: Optional[Mapping[str, Any]] = None, workload: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The desired status for what the JobSet says; `jobset` is one the caller already holds
    (None: read it here), `workload` Kueue's for it (None: listed here when the JobSet waits for it)."""
    if st.stopped_for_good(current):
        return dict(current)  # failed for good, its JobSet stopped: nothing it does changes that
    if jobset is None:
        jobset = get_jobset(api, namespace, jobset_name)
    if jobset is None and not current.get("jobSetName"):
        return dict(current)  # never created (invalid spec): nothing to mirror
    stamp = now()
    if jobset is not None and st.shows_failure(jobset, current.get("restarts")):
        message = data_error(api, namespace, jobset_name)
        if message is not None:
            # The same files fail every restart: stop the gang now rather than after maxRestarts.
            if not jobset_finished(jobset):
                set_jobset_suspend(api, namespace, jobset_name, True)
            kopf.warn(cast(kopf.Body, parent), reason=st.Reason.DATA_CHECK_FAILED, message=message)
            failures, preemptions = st.restart_counts(jobset)
            observation = st.observe_data_invalid(message, restarts=failures, preemptions=preemptions,
                                                  start_time=current.get("startTime"), now=stamp)
            return st.merge_status(current, observation, now=stamp,
                                   generation=parent["metadata"].get("generation"))
    if jobset is not None and st.queue_of(jobset):
        # Under a queue the user's hold is Kueue's (hold_in_queue): spec.suspend alone cannot tell
        # a held training from one created with suspend: true that waits for its turn, and a
        # JobSet that runs is one Kueue admitted.
        held = False
        if (jobset.get("spec") or {}).get("suspend"):
            if workload is None:
                workload = get_workload(api, namespace, jobset)
            held = st.workload_inactive(workload)
    else:
        held = bool((parent.get("spec") or {}).get("suspend"))
    observation = st.observe_jobset(jobset, previous_phase=current.get("phase"),
                                    previous_start_time=current.get("startTime"),
                                    previous_restarts=current.get("restarts"),
                                    previous_preemptions=current.get("preemptions"),
                                    held=held, workload=workload, now=stamp, stalled=st.is_stalled(current))
    desired = st.merge_status(current, observation, now=stamp, generation=parent["metadata"].get("generation"))
    if observation.phase == Phase.SUCCEEDED and current.get("phase") != Phase.SUCCEEDED:
        figures = final_figures(api, namespace, jobset_name)
        if figures:
            desired["progress"] = pr.final_progress(current.get("progress"), figures, stamp)
    return desired


def final_figures(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str) -> Optional[dict[str, Any]]:
    """What rank 0 reported as it finished (its termination message): the progress scrapes stop
    with the pods, usually before the last evaluation is seen."""
    pods = jobset_pods(api, namespace, jobset_name, "for the final result")
    return None if pods is None else pr.final_result(pods, jobset_name)


def data_error(api: kubernetes.client.ApiClient, namespace: str, jobset_name: str) -> Optional[str]:
    """The trainer's data error from a failed pod's termination message, if that is why it failed."""
    # Without the pods the JobSet's own failure handling still applies: mirror that.
    pods = jobset_pods(api, namespace, jobset_name, "for a data error")
    return None if pods is None else st.data_invalid_message(pods)


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


def jobset_finished(jobset: Mapping[str, Any]) -> bool:
    return any(c.get("type") in ("Completed", "Failed") and c.get("status") == st.TRUE
               for c in (jobset.get("status") or {}).get("conditions") or [])
