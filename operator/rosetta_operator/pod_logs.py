"""`rosetta logs NAME [-f] [--rank N | --all-ranks]`: the log of a node's pod, found through the training.

Node rank N is completion index N of the JobSet's indexed Job (the pod's
`batch.kubernetes.io/job-completion-index`). A gang restart replaces every pod with one of a new
name; with `-f` the follower notices, says so on stderr, and goes on with the new pod's log until
the training has finished. `rank_pod` and `previous_pod` are pure; `follow` talks to the API and
writes to a stream; `lines` turns one or every rank's `follow` into an iterator of lines (the
Python client's `logs`, which the `logs` verb prints).
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol

from rosetta_operator.kube import Cluster, VerbError
from rosetta_operator.names import COMPLETION_INDEX
from rosetta_operator.progress import JOB_INDEX_LABEL, JOBSET_NAME_LABEL

CONTAINER = "trainer"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
TERMINAL = frozenset({"Succeeded", "Failed"})
POLL = 1.0
# After the container ended, how long its log stream may take to end by itself (a kubelet closes it
# at once; some nodes keep it open) before the follower closes it.
DRAIN = 3.0


class Sink(Protocol):
    """Where a log goes: a text stream (sys.stdout) or a line collector."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def node_rank(pod: Mapping[str, Any]) -> Optional[int]:
    meta = _meta(pod)
    index = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    try:
        return int(index)  # type: ignore[arg-type]  # None and junk land in the except
    except (TypeError, ValueError):
        return None


def container_state(pod: Mapping[str, Any], container: str = CONTAINER) -> Optional[str]:
    """`waiting`, `running` or `terminated` for the trainer container; None before the kubelet says."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            return next((k for k in ("terminated", "running", "waiting") if state.get(k) is not None), None)
    return None


def has_log(pod: Mapping[str, Any]) -> bool:
    """Its container started: the kubelet has a log to give (a waiting container has none)."""
    return container_state(pod) in ("running", "terminated")


def _rank_pods(pods: Iterable[Mapping[str, Any]], jobset: str, rank: int) -> list[Mapping[str, Any]]:
    """Every listed pod of node rank `rank` in the JobSet's trainer job, of any attempt."""
    return [p for p in pods
            if (_meta(p).get("labels") or {}).get(JOBSET_NAME_LABEL) == jobset
            and (_meta(p).get("labels") or {}).get(JOB_INDEX_LABEL, "0") == "0"
            and node_rank(p) == rank]


def rank_pod(pods: Iterable[Mapping[str, Any]], jobset: str, rank: int) -> Optional[Mapping[str, Any]]:
    """Node rank `rank`'s pod of the JobSet: the newest of that index, one not being deleted first
    (after a gang restart the old pods linger a moment beside the new ones)."""
    candidates = _rank_pods(pods, jobset, rank)
    if not candidates:
        return None
    return max(candidates, key=lambda p: (not _meta(p).get("deletionTimestamp"), str(_meta(p).get("creationTimestamp"))))


def _attempt(pod: Mapping[str, Any]) -> int:
    try:
        return int((_meta(pod).get("labels") or {}).get(RESTART_ATTEMPT_LABEL) or 0)
    except ValueError:
        return 0


def previous_pod(pods: Iterable[Mapping[str, Any]], jobset: str, rank: int) -> Optional[Mapping[str, Any]]:
    """Node rank `rank`'s pod of the gang attempt before the newest one still listed (`logs
    --previous`). The trainer's container never restarts in place (restartPolicy: Never): its
    previous instance is the pod a gang restart replaced, which lingers only while it stops."""
    candidates = _rank_pods(pods, jobset, rank)
    if not candidates:
        return None
    newest = max(_attempt(p) for p in candidates)
    older = [p for p in candidates if _attempt(p) < newest]
    return max(older, key=lambda p: (_attempt(p), str(_meta(p).get("creationTimestamp")))) if older else None


def header(pod: Mapping[str, Any], rank: int) -> str:
    attempt = (_meta(pod).get("labels") or {}).get(RESTART_ATTEMPT_LABEL)
    after = f", gang restart {attempt}" if attempt not in (None, "0") else ""
    return f"--- node rank {rank}: pod {_meta(pod).get('name')}{after} ---"


class _Stream:
    """One pod's log, copied line by line to `out` from a thread, so that the follower can look at
    the cluster meanwhile and stop the copy when the pod is replaced."""

    def __init__(self, cluster: Cluster, pod: str, follow: bool, tail: Optional[int], out: Sink,
                 announce: Callable[[], None], since: Optional[float] = None):
        kwargs: dict[str, Any] = {"container": CONTAINER, "follow": follow, "_preload_content": False}
        if tail is not None:
            kwargs["tail_lines"] = tail
        if since is not None:
            kwargs["since_seconds"] = max(1, math.ceil(since))  # the API counts whole seconds
        self.response = cluster.core.read_namespaced_pod_log(pod, cluster.namespace, **kwargs)
        announce()  # the log is there: say whose it is before its first line
        self.out, self.stopping = out, False
        self.error: Optional[Exception] = None
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        try:
            for chunk in self.response.stream(4096, decode_content=True):
                self.out.write(chunk.decode("utf-8", errors="replace"))
                self.out.flush()
        except Exception as exc:  # stop() shut the connection, or it broke
            if not self.stopping:
                self.error = exc

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self) -> None:
        self.stopping = True
        if not self.done:
            try:
                self.response.shutdown()  # urllib3 ≥ 2.3: interrupts the thread's blocked read
            except (AttributeError, RuntimeError, ValueError, OSError):
                self.response.close()
            self.thread.join(5)
        self.response.release_conn()


def node_count(training: Mapping[str, Any]) -> int:
    nodes = (training.get("spec") or {}).get("nodes")
    return nodes if isinstance(nodes, int) and nodes > 0 else 1  # the CRD's default


def follow(cluster: Cluster, name: str, *, rank: int = 0, follow: bool = False, tail: Optional[int] = None,
           since: Optional[float] = None, previous: bool = False, wait: Optional[float] = 60.0,
           out: Optional[Sink] = None, err: Optional[Sink] = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print rank `rank`'s log; with `follow`, every pod that rank has until the training ends;
    with `previous`, the log of the pod the last gang restart replaced, if it is still there.

    Waits for the pod to start (at most `wait` seconds without `follow`; None: for ever). Returns
    the exit status; a training or rank that does not exist is a VerbError.
    """
    out, err = out or sys.stdout, err or sys.stderr
    training = cluster.existing_training(name)
    nodes = node_count(training)
    if not 0 <= rank < nodes:
        raise VerbError(f"--rank {rank}: {name} has {nodes} node{'s' * (nodes != 1)}, ranks 0 to {nodes - 1}", 2)
    if previous:
        return _previous(cluster, training, name, rank, tail=tail, since=since, out=out, sleep=sleep)
    deadline = None if follow or wait is None else time.monotonic() + wait
    seen: set[str] = set()
    while True:
        status = training.get("status") or {}
        jobset = status.get("jobSetName") or name
        pod = rank_pod(cluster.pods(jobset), jobset, rank)
        if pod is not None and _meta(pod).get("uid") not in seen and has_log(pod):
            if _print_log(cluster, pod, follow=follow, tail=tail, since=since, out=out, sleep=sleep,
                          announce=lambda: _say(err, header(pod, rank)) if follow else None):
                seen.add(_meta(pod)["uid"])
                if not follow:
                    return 0
                continue
        if status.get("phase") in TERMINAL and (pod is None or _meta(pod).get("uid") in seen or not has_log(pod)):
            if seen:
                return 0
            raise VerbError(f"{name} is {status['phase']} and node rank {rank} has no pod left to read "
                            f"(the JobSet's pods are removed ttlSecondsAfterFinished after the end)")
        if deadline is not None and time.monotonic() > deadline:
            what = f"pod {_meta(pod).get('name')} to start" if pod is not None else f"a pod of node rank {rank}"
            raise VerbError(f"timed out after {wait:.0f} s waiting for {what} of {name} "
                            f"(phase {status.get('phase') or 'unknown'}); -f waits for ever")
        sleep(POLL)
        training = cluster.existing_training(name)


follow_log = follow  # for `lines`, whose parameter of that name hides it


def _say(err: Sink, line: str) -> None:
    err.write(line + "\n")
    err.flush()


def _previous(cluster: Cluster, training: Mapping[str, Any], name: str, rank: int, *, tail: Optional[int],
              since: Optional[float], out: Sink, sleep: Callable[[float], None]) -> int:
    jobset = (training.get("status") or {}).get("jobSetName") or name
    pod = previous_pod(cluster.pods(jobset), jobset, rank)
    if pod is None or not _print_log(cluster, pod, follow=False, tail=tail, since=since, out=out, sleep=sleep,
                                     announce=lambda: None):
        restarts = (training.get("status") or {}).get("restarts") or 0
        why = ("it has not restarted" if not restarts else
               "the JobSet deletes a gang's pods when it restarts it, and they are gone")
        raise VerbError(f"--previous: node rank {rank} of {name} has no earlier pod left to read ({why}); "
                        "earlier attempts' logs are in the cluster's log store, if it has one")
    return 0


def _print_log(cluster: Cluster, pod: Mapping[str, Any], *, follow: bool, tail: Optional[int], out: Sink,
               sleep: Callable[[float], None], announce: Callable[[], None], since: Optional[float] = None) -> bool:
    """Copy the pod's log; while following, until the stream ends, the pod is gone, or DRAIN
    seconds after its container ended. A pod being deleted is followed to its end: a trainer
    stopped by SIGTERM still says where it saved its checkpoint. False: the kubelet had no log
    to give yet (the caller looks again)."""
    from kubernetes.client.exceptions import ApiException

    pod_name = _meta(pod)["name"]
    try:
        stream = _Stream(cluster, pod_name, follow, tail, out, announce, since)
    except ApiException as exc:
        if exc.status in (400, 404):  # gone, or its container not started after all
            return False
        raise
    ended_at: Optional[float] = None
    try:
        while not stream.done and not follow:
            stream.thread.join(POLL)
        while not stream.done:
            sleep(POLL)
            try:
                current = cluster.api.sanitize_for_serialization(
                    cluster.core.read_namespaced_pod(pod_name, cluster.namespace))
            except ApiException as exc:
                if exc.status == 404:
                    break
                raise
            if _meta(current).get("uid") != _meta(pod).get("uid"):
                break  # a new pod of the same name
            if container_state(current) == "terminated":
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > DRAIN:
                    break
    finally:
        stream.stop()
    if stream.error is not None:
        raise VerbError(f"the log of pod {pod_name} broke off: {stream.error}")
    return True


# ------------------------------------------------------------------------------- lines


class _Stopped(Exception):
    """The reader of `lines` went away: the followers stop at their next write or poll."""


class _LineSink:
    """A Sink that hands each complete line (prefixed) to `put`; `close` hands over a last partial one."""

    def __init__(self, put: Callable[[str], None], prefix: str, stop: threading.Event):
        self.put, self.prefix, self.stop = put, prefix, stop
        self.partial = ""

    def write(self, text: str, /) -> int:
        if self.stop.is_set():
            raise _Stopped()
        *complete, self.partial = (self.partial + text).split("\n")
        for line in complete:
            self.put(self.prefix + line)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.partial:
            self.put(self.prefix + self.partial)
            self.partial = ""


def rank_prefix(rank: int) -> str:
    """What `--all-ranks` puts before each line, as kubectl's --prefix puts `[pod/NAME/CONTAINER] `."""
    return f"[rank {rank}] "


def lines(cluster: Cluster, name: str, *, rank: int = 0, all_ranks: bool = False, follow: bool = False,
          tail: Optional[int] = None, since: Optional[float] = None, previous: bool = False,
          wait: Optional[float] = 60.0, on_pod: Optional[Callable[[str], None]] = None) -> Iterator[str]:
    """The log as lines (no line ends): rank `rank`'s, or with `all_ranks` every rank's, each line
    prefixed with `rank_prefix` (one rank after the other; with `follow`, all at once, interleaved
    line by line). `on_pod` hears the `--- node rank N: pod … ---` line when following moves to a
    new pod. A failure (VerbError, an API error) is raised here, where the lines are read.

    The pods are read by threads, so that a following reader can be left at any time: closing the
    iterator (or dropping it) stops them at their next line or poll."""
    ranks = range(node_count(cluster.existing_training(name))) if all_ranks else [rank]
    stop = threading.Event()
    found: queue.Queue[tuple[str, Any]] = queue.Queue()

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise _Stopped()

    def announce(line: str) -> None:
        if on_pod is not None and line.strip():
            on_pod(line.strip())

    def read(of: Iterable[int]) -> None:
        try:
            for r in of:
                sink = _LineSink(lambda line: found.put(("line", line)), rank_prefix(r) if all_ranks else "", stop)
                err = _LineSink(announce, "", stop)
                try:
                    follow_rank(r, sink, err)
                finally:
                    sink.close()
            found.put(("done", None))
        except _Stopped:
            found.put(("done", None))
        except BaseException as exc:  # handed to the reader, raised there
            found.put(("error", exc))

    def follow_rank(r: int, sink: _LineSink, err: _LineSink) -> None:
        follow_log(cluster, name, rank=r, follow=follow, tail=tail, since=since, previous=previous, wait=wait,
                   out=sink, err=err, sleep=sleep)

    groups: list[Iterable[int]] = [[r] for r in ranks] if follow else [ranks]
    for group in groups:
        threading.Thread(target=read, args=(group,), daemon=True, name=f"rosetta-logs-{name}").start()
    running = len(groups)
    try:
        while running:
            kind, value = found.get()
            if kind == "line":
                yield value
            elif kind == "done":
                running -= 1
            else:
                raise value
    finally:
        stop.set()

