"""The `rosetta` verbs that act on a cluster: submit, get, status, logs, wait, delete, tensorboard.

They follow kubectl: the current kubeconfig, context and namespace (`--kubeconfig`, `--context`,
`-n`), `-o table|json|yaml`, errors as one `error: …` line on stderr. Exit status: 0 done; 1 the
cluster said no or the training did not get there (not found, forbidden, unreachable, timed out,
Failed); 2 the input is wrong (an invalid TranslationTraining, a bad argument). Installed as
`kubectl-rosetta` too, so `kubectl rosetta get NAME` works.

Module-level imports stay light: rosetta_operator.cli registers these for every `rosetta` command.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

if TYPE_CHECKING:
    from datetime import datetime

    from rosetta_operator.kube import Cluster

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def duration_seconds(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` as seconds (kubectl's --timeout); ArgumentTypeError otherwise."""
    match = DURATION.match(text.strip())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration like 90s, 10m or 1h30m")
    h, m, s = match.groups()
    return int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a node rank (0, 1, …)")
    return value


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")


def _output_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table", help="output format")


def add_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rosetta_contract.document_arguments import add_document_arguments

    p = sub.add_parser("submit", help="validate a TranslationTraining file and apply it to the cluster "
                                      "(server-side apply, with the other documents of the file)")
    add_document_arguments(p)
    _cluster_arguments(p)
    p.add_argument("--allow-host-path", action="store_true", help="accept hostPath volumes when validating")
    p.add_argument("--force-conflicts", action="store_true",
                   help="take over fields another manager owns (server-side apply's --force-conflicts)")
    p.add_argument("--wait", action="store_true", help="then wait until the training Succeeded (exit 0) or Failed (1)")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=_cmd_submit)

    p = sub.add_parser("get", help="list trainings, or show one: phase, progress, ETA, BLEU, restarts")
    p.add_argument("name", nargs="?", help="a training (default: every training of the namespace)")
    _cluster_arguments(p)
    p.add_argument("-A", "--all-namespaces", action="store_true", help="trainings of every namespace")
    _output_argument(p)
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser("status", help="one training in full: phase, progress, ETA, BLEU, restarts and "
                                      "preemptions, last checkpoint, conditions")
    p.add_argument("name")
    _cluster_arguments(p)
    _output_argument(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("logs", help="the log of one node's pod (rank 0 by default); -f follows it across "
                                    "gang restarts until the training ends")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("-f", "--follow", action="store_true", help="stream the log, and the next pod's after a restart")
    p.add_argument("--rank", type=_rank, default=0, metavar="N", help="node rank, the pod's completion index (default 0)")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of each pod's log")
    p.add_argument("--pod-running-timeout", type=duration_seconds, default=60.0, metavar="DURATION",
                   help="without -f: how long to wait for the pod to start (default 60s)")
    p.set_defaults(func=_cmd_logs)

    p = sub.add_parser("wait", help="wait until a training reaches a phase or condition, or is deleted")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("--for", dest="condition", required=True, metavar="WHAT",
                   help="phase=PHASE, condition=TYPE[=STATUS] (STATUS default True) or delete")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="give up after this long (default: never)")
    p.set_defaults(func=_cmd_wait)

    p = sub.add_parser("delete", help="delete a training; the cluster removes its JobSet, pods and ConfigMap")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when there is no such training")
    p.add_argument("--wait", action="store_true", help="return once the training is gone")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=_cmd_delete)

    p = sub.add_parser("tensorboard", help="copy the run's event files out of rank 0's pod and serve them "
                                           "with a local TensorBoard")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("--logdir", help="where the copy goes (default: tensorboard/<namespace>/<name>)")
    p.add_argument("--port", type=int, default=6006)
    p.add_argument("--host", default="127.0.0.1", help="address TensorBoard listens on (default 127.0.0.1)")
    p.add_argument("--refresh", type=duration_seconds, default=60.0, metavar="DURATION",
                   help="copy again this often while rank 0 runs; 0: once (default 60s)")
    p.add_argument("--no-serve", action="store_true", help="only copy the files, print nothing else")
    p.set_defaults(func=_cmd_tensorboard)


def _reported(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One `error: …` line and the exit status for every failure a verb can meet."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from rosetta_operator.kube import VerbError, api_error

        try:
            return command(args)
        except VerbError as exc:
            error = exc
        except (ApiException, HTTPError) as exc:
            error = api_error(exc, getattr(args, "_cluster", None))
        except KeyboardInterrupt:
            return 130
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return run


def _connect(args: argparse.Namespace) -> Cluster:
    from rosetta_operator.kube import connect

    cluster = connect(args.kubeconfig, args.context, args.namespace)
    args._cluster = cluster  # for _reported's error message
    return cluster


def _now() -> datetime:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


# ------------------------------------------------------------------------------ submit


@_reported
def _cmd_submit(args: argparse.Namespace) -> int:
    from rosetta_operator.submit import apply_documents, read_documents

    documents = read_documents(args.file, args.overrides, allow_host_path=args.allow_host_path)
    cluster = _connect(args)
    training = None
    for line, obj in apply_documents(cluster, documents, force=args.force_conflicts,
                                         namespace=args.namespace):
        print(line, flush=True)
        if obj.get("kind") == "TranslationTraining":
            training = obj
    if not args.wait or training is None:
        return 0
    return _wait_until(cluster, training["metadata"]["name"], _Phase("Succeeded"), _deadline(args.timeout),
                       progress=True)


# ------------------------------------------------------------------------- get, status


@_reported
def _cmd_get(args: argparse.Namespace) -> int:
    from rosetta_operator import describe

    cluster = _connect(args)
    if args.name:
        objects = [cluster.existing_training(args.name)]
    else:
        objects = cluster.trainings(all_namespaces=args.all_namespaces)
    if args.output != "table":
        data = objects[0] if args.name else describe.as_list(objects)
        sys.stdout.write(describe.dump(data, args.output))
        return 0
    if not objects:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace}"
        print(f"No trainings found in {where}.", file=sys.stderr)
        return 0
    sys.stdout.write(describe.table(objects, _now(), namespaces=args.all_namespaces))
    return 0


@_reported
def _cmd_status(args: argparse.Namespace) -> int:
    from rosetta_operator import describe

    cluster = _connect(args)
    obj = cluster.existing_training(args.name)
    if args.output == "table":
        sys.stdout.write(describe.describe(obj, _now()))
    else:
        sys.stdout.write(describe.dump(describe.summary(obj, _now()), args.output))
    return 0


# -------------------------------------------------------------------------------- logs


@_reported
def _cmd_logs(args: argparse.Namespace) -> int:
    from rosetta_operator.pod_logs import follow

    cluster = _connect(args)
    return follow(cluster, args.name, rank=args.rank, follow=args.follow, tail=args.tail,
                  wait=args.pod_running_timeout)


# -------------------------------------------------------------------------------- wait


class _Goal(Protocol):
    """What `rosetta wait --for` waits for: met by the training as read (None: it is gone)."""

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool: ...


class _Phase:
    def __init__(self, phase: str):
        self.phase = phase

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        return obj is not None and (obj.get("status") or {}).get("phase") == self.phase

    def __str__(self) -> str:
        return f"phase {self.phase}"


class _Condition:
    def __init__(self, type_: str, status: str):
        self.type, self.status = type_, status

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == self.type and str(c.get("status")).lower() == self.status.lower()
                   for c in conditions)

    def __str__(self) -> str:
        return f"condition {self.type}={self.status}"


class _Deleted:
    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        return obj is None

    def __str__(self) -> str:
        return "deletion"


def parse_for(text: str) -> _Goal:
    """`--for` as kubectl wait takes it: phase=Succeeded, condition=Running[=False], delete."""
    from rosetta_contract.resource import PHASES
    from rosetta_operator.kube import INVALID, VerbError

    key, _, value = text.partition("=")
    if key == "delete" and not value:
        return _Deleted()
    if key == "phase":
        phase = next((p for p in PHASES if p.lower() == value.lower()), None)
        if phase is None:
            raise VerbError(f"--for {text}: the phases are {', '.join(PHASES)}", INVALID)
        return _Phase(phase)
    if key == "condition" and value:
        type_, _, status = value.partition("=")
        if status and status.lower() not in ("true", "false", "unknown"):
            raise VerbError(f"--for {text}: a condition's status is True, False or Unknown", INVALID)
        return _Condition(type_, status or "True")
    raise VerbError(f"--for {text}: expected phase=PHASE, condition=TYPE[=STATUS] or delete", INVALID)


def _wait_until(cluster: Cluster, name: str, goal: _Goal, deadline: float | None, *, progress: bool = False, quiet: bool = False) -> int:
    """0 when `goal` is met; VerbError when the training ends elsewhere, is gone, or time runs out.
    `progress`: each new phase and progress figure on stderr."""
    from rosetta_operator.kube import RESOURCE, VerbError, not_found

    last = None
    for obj in cluster.watch_training(name, deadline):
        if goal.met(obj):
            if not quiet:
                print(f"{RESOURCE}/{name} condition met", flush=True)
            return 0
        if obj is None:
            raise not_found(name, cluster.namespace)
        status = obj.get("status") or {}
        phase = status.get("phase")
        if progress:
            seen = (phase, (status.get("progress") or {}).get("display"))
            if seen != last and phase:
                print(f"{name}: {phase}{f' {seen[1]}' if seen[1] else ''}", file=sys.stderr, flush=True)
            last = seen
        if phase in ("Succeeded", "Failed") and not isinstance(goal, _Deleted):
            message = f": {status['message']}" if status.get("message") else ""
            raise VerbError(f"{RESOURCE}/{name} ended {phase}{message}; it will not reach {goal}")
    raise VerbError(f"timed out waiting for {goal} on {RESOURCE}/{name}")


@_reported
def _cmd_wait(args: argparse.Namespace) -> int:
    goal = parse_for(args.condition)
    cluster = _connect(args)
    return _wait_until(cluster, args.name, goal, _deadline(args.timeout))


# ------------------------------------------------------------------------------ delete


@_reported
def _cmd_delete(args: argparse.Namespace) -> int:
    from rosetta_operator.kube import RESOURCE, not_found

    cluster = _connect(args)
    if not cluster.delete_training(args.name):
        if args.ignore_not_found:
            return 0
        raise not_found(args.name, cluster.namespace)
    print(f'{RESOURCE} "{args.name}" deleted', flush=True)
    if args.wait:
        return _wait_until(cluster, args.name, _Deleted(), _deadline(args.timeout), quiet=True)
    return 0


# ------------------------------------------------------------------------- tensorboard


@_reported
def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rosetta_operator.event_files import default_dest, serve

    cluster = _connect(args)
    dest = Path(args.logdir) if args.logdir else default_dest(args.name, cluster.namespace)
    return serve(cluster, args.name, dest, port=args.port, host=args.host, refresh=args.refresh,
                 serve=not args.no_serve)
