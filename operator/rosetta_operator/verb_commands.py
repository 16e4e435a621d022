"""What each `rosetta` cluster verb does once its arguments are parsed (verbs.py): call the Python
client (client.py) and print what it returns, kubectl's way; every failure one `error: …` line on
stderr and the verb's exit status. A script and the command line do the same thing.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from rosetta_operator.wait_goals import parse_for

if TYPE_CHECKING:
    from datetime import datetime

    from rosetta_operator.client import Client
    from rosetta_operator.kube import Cluster


def _reported(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One `error: …` line and the exit status for every failure a verb can meet."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from rosetta_operator.cluster_errors import api_error
        from rosetta_operator.kube import VerbError

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


def _client(args: argparse.Namespace) -> Client:
    from rosetta_operator.client import Client

    client = Client(args.kubeconfig, args.context, args.namespace)
    args._cluster = client.cluster  # for _reported's error message
    return client


def _connect(args: argparse.Namespace) -> Cluster:
    from rosetta_operator.kubeconfig import connect

    cluster = connect(args.kubeconfig, args.context, args.namespace)
    args._cluster = cluster  # for _reported's error message
    return cluster


def _now() -> datetime:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _condition_met(name: str) -> None:
    from rosetta_operator.kube import RESOURCE

    print(f"{RESOURCE}/{name} condition met", flush=True)


def _progress_printer(name: str) -> Callable[[Mapping[str, Any]], None]:
    """Each new phase and progress figure of a training being waited for, on stderr."""
    last: list[tuple[Any, Any]] = []

    def show(obj: Mapping[str, Any]) -> None:
        status = obj.get("status") or {}
        seen = (status.get("phase"), (status.get("progress") or {}).get("display"))
        if seen[0] and seen not in last[-1:]:
            print(f"{name}: {seen[0]}{f' {seen[1]}' if seen[1] else ''}", file=sys.stderr, flush=True)
        last[:] = [seen]
    return show


# ------------------------------------------------------------------------------ submit


@_reported
def run_submit(args: argparse.Namespace) -> int:
    from rosetta_operator.submit import read_documents

    # Validated before the cluster is asked: an invalid file is exit 2 anywhere.
    documents = read_documents(args.file, args.overrides, allow_host_path=args.allow_host_path)
    client = _client(args)
    training = client.apply(documents, force_conflicts=args.force_conflicts, on_applied=lambda line: print(line, flush=True))
    if args.wait and training is not None:
        name = training["metadata"]["name"]
        client.wait(name, "Succeeded", timeout=args.timeout, on_change=_progress_printer(name))
        _condition_met(name)
    return 0


# ------------------------------------------------------------------------- get, status


class _Printer:
    """`get`'s output: the list (or the one named) at once, then with -w each change."""

    def __init__(self, output: str, namespaces: bool):
        from rosetta_operator import describe

        self.describe, self.output, self.namespaces = describe, output, namespaces
        self.human = output in ("table", "wide")
        self.table = describe.WatchTable(describe.header(namespaces=namespaces, wide=output == "wide"))
        self.rows: dict[tuple[str, str], list[str]] = {}  # the last row printed of each training
        self.documents = 0

    def objects(self, objects: list[dict[str, Any]], *, single: bool, watching: bool) -> str:
        d = self.describe
        if self.human:
            return self._rows(objects)
        if self.output == "name":
            return "".join(d.resource_name(o) + "\n" for o in objects)
        if watching:  # kubectl -w prints objects one by one, never as a List
            return "".join(self._one(o) for o in objects)
        return self._one(objects[0] if single else d.as_list(objects))

    def _one(self, data: Mapping[str, Any]) -> str:
        if self.output.startswith("jsonpath="):
            text = self.describe.jsonpath(self.output.partition("=")[2], data)
            return text + ("\n" if text and not text.endswith("\n") else "")
        text = self.describe.dump(data, self.output)
        if self.output == "yaml" and self.documents:
            text = "---\n" + text  # one YAML stream, as kubectl -w -o yaml prints
        self.documents += 1
        return text

    def _rows(self, objects: list[dict[str, Any]]) -> str:
        rows = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            row = self.describe.cells(obj, _now(), namespaces=self.namespaces, wide=self.output == "wide")
            age = len(self.describe.COLUMNS) - 1 + (1 if self.namespaces else 0)
            if key in self.rows and self.rows[key][:age] + self.rows[key][age + 1:] == row[:age] + row[age + 1:]:
                continue  # nothing but its age changed
            self.rows[key] = row
            rows.append(row)
        return self.table.lines(rows) if rows else ""


def _no_resources(all_namespaces: bool, namespace: str) -> str:
    return "No resources found" if all_namespaces else f"No resources found in {namespace} namespace."


@_reported
def run_get(args: argparse.Namespace) -> int:
    from rosetta_operator.client_errors import InvalidArgument

    if args.name and args.selector:
        raise InvalidArgument("name cannot be provided when a selector is specified")
    if args.request_timeout is not None and not args.watch:
        raise InvalidArgument("--request-timeout is for -w: a plain get asks once")
    client = _client(args)
    printer = _Printer(args.output, namespaces=args.all_namespaces)
    if args.name:
        objects = [client.get(args.name)]
        version = str(objects[0]["metadata"].get("resourceVersion", ""))
    else:
        listed = client.list(args.selector, args.all_namespaces)
        objects, version = list(listed), listed.resource_version
    sys.stdout.write(printer.objects(objects, single=bool(args.name), watching=args.watch))
    sys.stdout.flush()
    if not objects and printer.human:
        print(_no_resources(args.all_namespaces, client.namespace), file=sys.stderr, flush=True)
    if not args.watch:
        return 0
    for event in client.watch(args.name, label_selector=args.selector, all_namespaces=args.all_namespaces,
                              resource_version=version, timeout=args.request_timeout):
        sys.stdout.write(printer.objects([event.training], single=True, watching=True))
        sys.stdout.flush()
    return 0


@_reported
def run_status(args: argparse.Namespace) -> int:
    from rosetta_operator import describe

    client = _client(args)
    status = client.status(args.name)
    now = _now()
    if args.output in ("table", "wide"):
        sys.stdout.write(describe.describe(status.training, now, events=status.events))
    elif args.output == "name":
        print(describe.resource_name(status.training))
    else:
        data = {**describe.summary(status.training, now), "events": status.events}
        if args.output.startswith("jsonpath="):
            text = describe.jsonpath(args.output.partition("=")[2], data)
            sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))
        else:
            sys.stdout.write(describe.dump(data, args.output))
    return 0


# -------------------------------------------------------------------------------- logs


@_reported
def run_logs(args: argparse.Namespace) -> int:
    if args.attempt is not None:
        return _attempt_logs(args)
    client = _client(args)
    timeout = 60.0 if args.pod_running_timeout is None else args.pod_running_timeout
    for line in client.logs(args.name, rank=args.rank or 0, all_ranks=args.all_ranks, follow=args.follow,
                            tail=args.tail, since=args.since, previous=args.previous, pod_running_timeout=timeout,
                            on_pod=lambda header: print(header, file=sys.stderr, flush=True)):
        sys.stdout.write(line + "\n")
        if args.follow:
            sys.stdout.flush()
    return 0


def _attempt_logs(args: argparse.Namespace) -> int:
    """`logs --attempt N`: the kept files, node after node; each node's `==> … <==` header on stderr."""
    from rosetta_operator.kube import INVALID, VerbError

    given = [flag for flag, on in (("-f", args.follow), ("--since", args.since is not None),
                                   ("--previous", args.previous)) if on]
    if given:
        raise VerbError(f"--attempt prints what was kept, once: {', '.join(given)} cannot go with it", INVALID)

    def header(line: str) -> None:
        sys.stdout.flush()  # the lines before it first, when both streams go to one place
        print(line, file=sys.stderr, flush=True)

    client = _client(args)
    for line in client.attempt_logs(args.name, args.attempt, rank=args.rank, all_ranks=args.all_ranks,
                                    tail=args.tail, timeout=args.pod_running_timeout, on_header=header):
        sys.stdout.write(line + "\n")
    return 0


# -------------------------------------------------------------------------------- wait


@_reported
def run_wait(args: argparse.Namespace) -> int:
    goal = parse_for(args.condition)  # before the cluster: a bad --for is exit 2 anywhere
    client = _client(args)
    client.wait_for(args.name, goal, timeout=args.timeout)
    _condition_met(args.name)
    return 0


# ------------------------------------------------------------------------------ delete


@_reported
def run_delete(args: argparse.Namespace) -> int:
    from rosetta_operator.kube import RESOURCE

    client = _client(args)
    if not client.delete(args.name, ignore_not_found=args.ignore_not_found):
        return 0
    print(f'{RESOURCE} "{args.name}" deleted', flush=True)
    if args.wait:
        client.wait_deleted(args.name, args.timeout)
    return 0


# --------------------------------------------------------------------- suspend, resume


class _Left:
    """Resumed: the training is in a phase again, and not Suspended."""

    def met(self, obj: Optional[Mapping[str, Any]]) -> bool:
        phase = ((obj or {}).get("status") or {}).get("phase")
        return bool(phase) and phase != "Suspended"

    def __str__(self) -> str:
        return "a phase other than Suspended"


@_reported
def run_suspend(args: argparse.Namespace) -> int:
    from rosetta_operator.kube import RESOURCE
    from rosetta_operator.wait_goals import PhaseGoal

    client = _client(args)
    changed = client.suspend(args.name) if args.suspend else client.resume(args.name)
    verb = "suspended" if args.suspend else "resumed"
    print(f"{RESOURCE}/{args.name} {verb}{'' if changed else ' (no change)'}", flush=True)
    if args.wait:
        client.wait_for(args.name, PhaseGoal("Suspended") if args.suspend else _Left(), timeout=args.timeout)
    return 0


# ------------------------------------------------------------------------- tensorboard


@_reported
def run_tensorboard(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rosetta_operator.event_files import default_dest, serve

    cluster = _connect(args)
    dest = Path(args.logdir) if args.logdir else default_dest(args.name, cluster.namespace)
    return serve(cluster, args.name, dest, port=args.port, host=args.host, refresh=args.refresh,
                 serve=not args.no_serve)
