"""Rosetta's Python client: the cluster verbs of `rosetta` as typed calls.

    from rosetta_operator import Client

    client = Client()                                   # kubectl's cluster, context and namespace
    training = client.submit("manifests/examples/quickstart-cpu.yaml")
    for line in client.logs("quickstart-cpu", follow=True):
        print(line)
    client.wait("quickstart-cpu", phase="Succeeded", timeout=3600)

`rosetta submit|get|status|logs|wait|delete|suspend|resume` call these methods and print what they
return, so the command line and a script do the same thing. Every failure is a `RosettaError`
(kube.VerbError) carrying the command line's exit status (client_errors.py); an invalid
TranslationTraining is a rosetta_contract `ConfigError` (2), as with `rosetta validate`. What
`wait` waits for is in wait_goals.py, what the calls return in client_results.py.

Module-level imports stay light (no kubernetes): `rosetta_operator` exports this class, and every
`rosetta` command imports that package.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from rosetta_contract.resource import KIND, Phase
from rosetta_operator.client_errors import ClusterError, InvalidArgument, TrainingEnded, TrainingNotFound, WaitTimeout
from rosetta_operator.client_results import TrainingList, TrainingStatus, WatchEvent
from rosetta_operator.kube import FAILED, RESOURCE, Cluster, VerbError, not_found
from rosetta_operator.wait_goals import Deleted, Goal, condition_goal, phase_goal

if TYPE_CHECKING:
    from rosetta_contract.spec import TranslationTraining

# What `submit` takes: a file (`-` for standard input is the command line's), the parsed model, or
# the document as a mapping.
Source = Union[str, "os.PathLike[str]", "TranslationTraining", Mapping[str, Any]]


class Client:
    """The trainings of one namespace of one cluster, found as kubectl finds them: `kubeconfig`, else
    $KUBECONFIG, else ~/.kube/config, else the pod's ServiceAccount; `context`, else the current
    one; `namespace`, else the context's, else `default`."""

    def __init__(self, kubeconfig: Optional[str] = None, context: Optional[str] = None,
                 namespace: Optional[str] = None, *, cluster: Optional[Cluster] = None):
        from rosetta_operator.kubeconfig import connect

        self.cluster = cluster if cluster is not None else connect(kubeconfig, context, namespace)
        self._namespace_given = namespace  # a document's own namespace must match it

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    def __repr__(self) -> str:
        return f"Client(server={self.cluster.server!r}, namespace={self.namespace!r})"

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """An API or connection failure as a ClusterError, in kubectl's words."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from rosetta_operator.cluster_errors import api_error

        try:
            yield
        except (ApiException, HTTPError) as exc:
            error = api_error(exc, self.cluster)
            raise ClusterError(str(error), error.exit_code) from exc

    # ------------------------------------------------------------------------ submit

    def submit(self, source: Source, *, overrides: Iterable[str] = (), allow_host_path: bool = False,
               force_conflicts: bool = False, on_applied: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
        """Validate the TranslationTraining as the operator would, then server-side apply it (with
        the file's other documents, in file order, as `kubectl apply -f` would). Returns the training
        as the server has it. `overrides`: `--set`'s `spec.training.maxSteps=100`. `on_applied`
        hears `KIND/NAME created|configured|unchanged` for each document as it is applied."""
        from rosetta_operator.submit import checked_training, read_documents

        if isinstance(source, (str, os.PathLike)):
            documents = read_documents(os.fspath(source), list(overrides), allow_host_path=allow_host_path)
        else:
            if isinstance(source, Mapping):
                raw: Any = dict(source)
            else:  # as the user set it: the apiserver and the operator default the rest
                raw = source.model_dump(mode="json", by_alias=True, exclude_unset=True)
            documents = [checked_training(raw, list(overrides), None, allow_host_path)]
        training = self.apply(documents, force_conflicts=force_conflicts, on_applied=on_applied)
        assert training is not None  # read_documents and checked_training return one
        return training

    def apply(self, documents: Iterable[dict[str, Any]], *, force_conflicts: bool = False,
              on_applied: Optional[Callable[[str], None]] = None) -> Optional[dict[str, Any]]:
        """Server-side apply documents already checked (submit.read_documents); the training among
        them as the server has it."""
        from rosetta_operator.submit import apply_documents

        training: Optional[dict[str, Any]] = None
        with self._errors():
            for line, obj in apply_documents(self.cluster, builtins.list(documents), force=force_conflicts,
                                             namespace=self._namespace_given):
                if on_applied is not None:
                    on_applied(line)
                if obj.get("kind") == KIND:
                    training = obj
        return training

    # ------------------------------------------------------------------- get, status

    def get(self, name: str) -> dict[str, Any]:
        """The training as the API returns it."""
        with self._errors():
            obj = self.cluster.training(name)
        if obj is None:
            raise TrainingNotFound(str(not_found(name, self.namespace)))
        return obj

    def list(self, label_selector: Optional[str] = None, all_namespaces: bool = False) -> TrainingList:
        """The namespace's trainings (every namespace's with `all_namespaces`), sorted by namespace and
        name; `label_selector` as kubectl's -l (`team=nlp,tier!=test`)."""
        with self._errors():
            items, version = self.cluster.training_list(label_selector=label_selector, all_namespaces=all_namespaces)
        return TrainingList(items, version)

    def watch(self, name: Optional[str] = None, *, label_selector: Optional[str] = None,
              all_namespaces: bool = False, resource_version: Optional[str] = None,
              timeout: Optional[float] = None) -> Iterator[WatchEvent]:
        """Each change of the trainings (or of the one named) after `resource_version` (a list's or
        an object's; None: from now), until `timeout` seconds have passed (None: for ever)."""
        selector = f"metadata.name={name}" if name else None
        if resource_version is None and name:
            resource_version = str(self.get(name)["metadata"].get("resourceVersion", ""))
        elif resource_version is None:
            resource_version = self.list(label_selector, all_namespaces).resource_version
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._errors():
            for type_, obj in self.cluster.watch_trainings(resource_version, label_selector=label_selector,
                                                            field_selector=selector, all_namespaces=all_namespaces,
                                                            deadline=deadline):
                yield WatchEvent(type_, obj)

    def status(self, name: str, *, events: bool = True) -> TrainingStatus:
        """The training in full, as `rosetta status` shows it, with its recent events (`events`)."""
        from datetime import datetime, timezone

        from rosetta_operator import describe

        obj = self.get(name)
        s = describe.summary(obj, datetime.now(timezone.utc))
        return TrainingStatus(
            name=s["name"], namespace=s["namespace"], phase=s["phase"], message=s["message"],
            progress=s["progress"] or {}, eta_seconds=s["etaSeconds"], restarts=s["restarts"],
            preemptions=s["preemptions"], last_checkpoint=s["lastCheckpoint"],
            last_checkpoint_step=s["lastCheckpointStep"], conditions=s["conditions"],
            events=self.events(obj) if events else [], training=obj)

    def events(self, training: Union[str, Mapping[str, Any]]) -> builtins.list[dict[str, Any]]:
        """Recent events of the training, its JobSet and its JobSet's pods, oldest first (the last
        describe.EVENTS_SHOWN). Empty where the user may not list events: status still shows."""
        from kubernetes.client.exceptions import ApiException

        from rosetta_operator import describe

        obj = self.get(training) if isinstance(training, str) else training
        name = obj["metadata"]["name"]
        jobset = (obj.get("status") or {}).get("jobSetName") or name
        with self._errors():
            try:
                pods = {p["metadata"]["name"] for p in self.cluster.pods(jobset)}
                found = self.cluster.events({KIND: {name}, "JobSet": {jobset}, "Pod": pods} if pods else
                                            {KIND: {name}, "JobSet": {jobset}})
            except ApiException as exc:
                if exc.status == 403:
                    return []
                raise
        return describe.recent_events(found)

    # -------------------------------------------------------------------------- logs

    def logs(self, name: str, *, rank: int = 0, all_ranks: bool = False, follow: bool = False,
             tail: Optional[int] = None, since: Optional[float] = None, previous: bool = False,
             pod_running_timeout: Optional[float] = 60.0,
             on_pod: Optional[Callable[[str], None]] = None) -> Iterator[str]:
        """The trainer's log of node rank `rank`'s pod, line by line (no line ends).

        `follow`: go on as it grows, and into the next pod after a gang restart (`on_pod` hears
        which), until the training ends. `all_ranks`: every rank's, each line prefixed `[rank N] `.
        `tail`: the last lines of each pod's log; `since`: seconds back; `previous`: the pod the last
        gang restart replaced, while the cluster still has it. Without `follow`, waits at most
        `pod_running_timeout` seconds for a pod to start."""
        from rosetta_operator import pod_logs

        if rank < 0:
            raise InvalidArgument(f"rank {rank}: node ranks are 0, 1, …")
        if since is not None and since <= 0:
            raise InvalidArgument(f"since {since}: a positive number of seconds")
        with self._errors():
            yield from pod_logs.lines(self.cluster, name, rank=rank, all_ranks=all_ranks, follow=follow, tail=tail,
                                      since=since, previous=previous, wait=pod_running_timeout, on_pod=on_pod)

    def attempt_logs(self, name: str, attempt: int, *, rank: Optional[int] = None, all_ranks: bool = False,
                     tail: Optional[int] = None, timeout: Optional[float] = None,
                     on_header: Optional[Callable[[str], None]] = None) -> Iterator[str]:
        """The log attempt `attempt` (0: the first, N: after N gang restarts) kept on the checkpoints
        volume or in the S3 mirror, line by line, also once its pods are gone.

        Node 0's, and the node whose failure ended the attempt when status.attempts names one;
        `rank`: that node's; `all_ranks`: every node's that has one. Lines are prefixed `[rank N] `
        when more than one node is chosen; `on_header` hears `==> attempt N, node R … <==` before
        each node's lines, and notes. `tail`: the last lines of each node's log. From S3 with this
        machine's AWS credentials, else through a reader pod that mounts the volume (created in the
        training's namespace, deleted after); `timeout` (default 3 minutes) bounds the wait for it."""
        from rosetta_operator import attempt_log_reader

        if attempt < 0:
            raise InvalidArgument(f"attempt {attempt}: attempts are 0, 1, …")
        if rank is not None and rank < 0:
            raise InvalidArgument(f"rank {rank}: node ranks are 0, 1, …")
        if rank is not None and all_ranks:
            raise InvalidArgument("rank and all_ranks: one or the other")
        with self._errors():
            yield from attempt_log_reader.lines(
                self.cluster, name, attempt, rank=rank, all_ranks=all_ranks, tail=tail,
                timeout=attempt_log_reader.READER_TIMEOUT if timeout is None else timeout, on_header=on_header)

    # -------------------------------------------------------------------------- wait

    def wait(self, name: str, phase: Optional[str] = "Succeeded", *, condition: Optional[str] = None,
             timeout: Optional[float] = None,
             on_change: Optional[Callable[[dict[str, Any]], None]] = None) -> dict[str, Any]:
        """Until the training is in `phase`, or has `condition` (`TYPE` or `TYPE=STATUS`) instead;
        returns it then. TrainingEnded when it finishes otherwise, TrainingNotFound when it is not
        there, WaitTimeout after `timeout` seconds. `on_change` sees each version read meanwhile."""
        goal: Goal = condition_goal(condition) if condition else phase_goal(phase or "")
        obj = self.wait_for(name, goal, timeout=timeout, on_change=on_change)
        assert obj is not None
        return obj

    def wait_deleted(self, name: str, timeout: Optional[float] = None) -> None:
        """Until the training is gone (the operator has removed its finalizer)."""
        self.wait_for(name, Deleted(), timeout=timeout)

    def wait_for(self, name: str, goal: Goal, *, timeout: Optional[float] = None,
                 on_change: Optional[Callable[[dict[str, Any]], None]] = None) -> Optional[dict[str, Any]]:
        """`wait` for any Goal (parse_for's `--for` included); the training as it met it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._errors():
            for obj in self.cluster.watch_training(name, deadline):
                if goal.met(obj):
                    return obj
                if obj is None:
                    raise TrainingNotFound(str(not_found(name, self.namespace)))
                if on_change is not None:
                    on_change(obj)
                status = obj.get("status") or {}
                phase = status.get("phase")
                if phase in Phase.TERMINAL and not isinstance(goal, Deleted):
                    message = f": {status['message']}" if status.get("message") else ""
                    raise TrainingEnded(f"{RESOURCE}/{name} ended {phase}{message}; it will not reach {goal}", phase)
        raise WaitTimeout(f"timed out waiting for {goal} on {RESOURCE}/{name}", FAILED)

    # ------------------------------------------------------------------------ delete

    def delete(self, name: str, *, wait: bool = False, timeout: Optional[float] = None,
               ignore_not_found: bool = False) -> bool:
        """Delete the training (the cluster removes its JobSet, pods and ConfigMap); False when there
        was none and `ignore_not_found`. `wait`: return once it is gone."""
        with self._errors():
            deleted = self.cluster.delete_training(name)
        if not deleted:
            if ignore_not_found:
                return False
            raise TrainingNotFound(str(not_found(name, self.namespace)))
        if wait:
            self.wait_deleted(name, timeout)
        return True

    # --------------------------------------------------------------- suspend, resume

    def suspend(self, name: str) -> bool:
        """Hold the training: the operator suspends its JobSet, whose pods stop (a trainer saves a
        checkpoint on SIGTERM), and the phase becomes Suspended. False: it was suspended already."""
        return self._set_suspend(name, True)

    def resume(self, name: str) -> bool:
        """Let a suspended training go on: new pods start from its last checkpoint (under Kueue,
        once the queue admits it again). False: it was not suspended."""
        return self._set_suspend(name, False)

    def _set_suspend(self, name: str, suspend: bool) -> bool:
        # spec.suspend is the one field the operator applies to a running training's JobSet
        # (applied_spec.MUTABLE_FIELDS). A merge patch, not an apply: an apply of that one field
        # by `rosetta` would drop every other field `rosetta submit` applied.
        obj = self.get(name)
        phase = (obj.get("status") or {}).get("phase")
        if phase in Phase.TERMINAL:
            verb = "suspend" if suspend else "resume"
            raise VerbError(f"{RESOURCE}/{name} is {phase}: there is nothing to {verb}")
        if bool((obj.get("spec") or {}).get("suspend")) == suspend:
            return False
        with self._errors():
            patched = self.cluster.patch_training(name, {"spec": {"suspend": suspend}})
        if patched is None:
            raise TrainingNotFound(str(not_found(name, self.namespace)))
        return True

