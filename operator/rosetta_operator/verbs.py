"""The `rosetta` verbs that act on a cluster: submit, get, status, logs, wait, delete, suspend,
resume, tensorboard.

They follow kubectl: the current kubeconfig, context and namespace (`--kubeconfig`, `--context`,
`-n`), `-o table|wide|name|json|yaml|jsonpath=…`, `get -w` and `-l`, errors as one `error: …` line
on stderr. Exit status: 0 done; 1 the cluster said no or the training did not get there (not
found, forbidden, unreachable, timed out, Failed); 2 the input is wrong (an invalid
TranslationTraining, a bad argument). Installed as `kubectl-rosetta` too, so `kubectl rosetta get
NAME` works.

Each verb parses, calls the Python client (client.py) and prints: a script and the command line
do the same thing. Module-level imports stay light: rosetta_operator.cli registers these for
every `rosetta` command.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from rosetta_operator.client import parse_for as parse_for  # `rosetta wait --for`; kept importable here

if TYPE_CHECKING:
    from datetime import datetime

    from rosetta_operator.client import Client
    from rosetta_operator.kube import Cluster

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")

EXIT_STATUS = """\
exit status:
  0    done
  1    the cluster said no, or the training did not get there: not found, forbidden,
       unreachable, timed out, ended in another phase
  2    invalid input: a bad argument, an invalid TranslationTraining
  130  interrupted (Ctrl-C)"""


def duration_seconds(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` as seconds (kubectl's --timeout); ArgumentTypeError otherwise."""
    match = DURATION.match(text.strip())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration like 90s, 10m or 1h30m")
    h, m, s = match.groups()
    return int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)


def _positive_duration(text: str) -> float:
    seconds = duration_seconds(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': a duration longer than 0s")
    return seconds


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a node rank (0, 1, …)")
    return value


def _attempt(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not an attempt (0 for the first, 1 after one gang restart, …)")
    return value


OUTPUTS = ("table", "wide", "name", "json", "yaml")


def output_format(text: str) -> str:
    """-o as kubectl takes it: table (the default), wide, name, json, yaml or jsonpath=TEMPLATE
    (the template is checked here, so that a typo is exit 2 before the cluster is asked)."""
    from rosetta_operator.describe import parse_jsonpath

    if text in OUTPUTS:
        return text
    kind, sep, template = text.partition("=")
    if kind == "jsonpath" and sep:
        try:
            parse_jsonpath(template)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"jsonpath: {exc}") from None
        return text
    raise argparse.ArgumentTypeError(f"'{text}': the formats are {', '.join(OUTPUTS)} and jsonpath=TEMPLATE")


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")


def _output_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=output_format, default="table", metavar="FORMAT",
                   help="table (default), wide, name, json, yaml, or jsonpath=TEMPLATE as kubectl's, "
                        "e.g. jsonpath='{.status.phase}'")


def _verb(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str,
          examples: str) -> argparse.ArgumentParser:
    """A verb's parser: its help says what it does, then examples (with the program's name as it was
    invoked: `rosetta` or `kubectl rosetta`) and the exit statuses."""
    import textwrap

    # Raw, for the examples' layout; so the description is wrapped here.
    return sub.add_parser(name, help=help, description=textwrap.fill(description, 80),
                          epilog=f"examples:\n{examples}\n\n{EXIT_STATUS}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rosetta_contract.document_arguments import add_document_arguments

    p = _verb(sub, "submit", "validate a TranslationTraining file and apply it to the cluster "
                             "(server-side apply, with the other documents of the file)",
              "Validate the file's TranslationTraining as the operator would (nothing is applied when it "
              "is invalid), then server-side apply every document of the file in order, with field "
              "manager rosetta.",
              "  %(prog)s -f manifests/examples/quickstart-cpu.yaml\n"
              "  %(prog)s -f training.yaml --set spec.training.maxSteps=100 --wait --timeout 2h\n"
              "  envsubst < training.yaml | %(prog)s -f -       # '-': the file from standard input")
    add_document_arguments(p)
    _cluster_arguments(p)
    p.add_argument("--allow-host-path", action="store_true", help="accept hostPath volumes when validating")
    p.add_argument("--force-conflicts", action="store_true",
                   help="take over fields another manager owns (server-side apply's --force-conflicts)")
    p.add_argument("--wait", action="store_true", help="then wait until the training Succeeded (exit 0) or Failed (1)")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=_cmd_submit)

    p = _verb(sub, "get", "list trainings, or show one: phase, progress, ETA, BLEU, restarts",
              "One row per training of the namespace, or the one named; -w then prints a row each time "
              "one changes.",
              "  %(prog)s                                   # the namespace's trainings\n"
              "  %(prog)s -A -l team=nlp -o wide            # every namespace's, with this label, more columns\n"
              "  %(prog)s quickstart-cpu -w                 # a row at each change, until Ctrl-C\n"
              "  %(prog)s quickstart-cpu -o jsonpath='{.status.progress.display}'\n"
              "  %(prog)s -o jsonpath='{range .items[*]}{.metadata.name}{\"\\n\"}{end}'")
    p.add_argument("name", nargs="?", help="a training (default: every training of the namespace)")
    _cluster_arguments(p)
    p.add_argument("-A", "--all-namespaces", action="store_true", help="trainings of every namespace")
    p.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="only trainings with these labels, as kubectl's -l: key=value, key!=value, key in (a,b)")
    p.add_argument("-w", "--watch", action="store_true", help="after the list, print each change as it happens")
    p.add_argument("--request-timeout", type=_positive_duration, metavar="DURATION",
                   help="with -w: stop watching after this long (default: never)")
    _output_argument(p)
    p.set_defaults(func=_cmd_get)

    p = _verb(sub, "status", "one training in full: phase, progress, ETA, BLEU, restarts and "
                             "preemptions, last checkpoint, conditions, recent events",
              "One training in full, then its conditions and, as kubectl describe shows them, the recent "
              "events of the training, its JobSet and its pods.",
              "  %(prog)s quickstart-cpu\n"
              "  %(prog)s quickstart-cpu -o json | jq .etaSeconds")
    p.add_argument("name")
    _cluster_arguments(p)
    _output_argument(p)
    p.set_defaults(func=_cmd_status)

    p = _verb(sub, "logs", "the log of one node's pod (rank 0 by default) or of all; -f follows it "
                           "across gang restarts until the training ends; --attempt N reads an attempt's "
                           "kept log after its pods are gone",
              "The trainer container's log of node rank N's pod, found through the training's JobSet. "
              "With --attempt N: the log each node kept of attempt N (0: the first; N: after N gang "
              "restarts) on the checkpoints volume (read by a short-lived pod that mounts it) or in "
              "the S3 mirror (read with this machine's AWS credentials).",
              "  %(prog)s quickstart-cpu                    # rank 0\n"
              "  %(prog)s quickstart-cpu -f --since 10m     # the last 10 minutes, then as it grows\n"
              "  %(prog)s quickstart-cpu --all-ranks -f     # every rank, each line prefixed [rank N]\n"
              "  %(prog)s quickstart-cpu --rank 1 --previous   # the pod the last gang restart replaced\n"
              "  %(prog)s quickstart-cpu --attempt 0        # node 0 and the failing node, pods gone")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("-f", "--follow", action="store_true", help="stream the log, and the next pod's after a restart")
    ranks = p.add_mutually_exclusive_group()
    ranks.add_argument("--rank", type=_rank, metavar="N",
                       help="node rank, the pod's completion index (default 0; with --attempt, 0 and the "
                            "node whose failure ended it)")
    ranks.add_argument("--all-ranks", action="store_true",
                       help="every node's log, each line prefixed with its rank, as kubectl's --prefix")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of each pod's log")
    p.add_argument("--since", type=_positive_duration, metavar="DURATION",
                   help="only lines newer than this, e.g. 10m (kubectl's --since)")
    p.add_argument("-p", "--previous", action="store_true",
                   help="the log of the rank's pod before the last gang restart, while the cluster still has it")
    p.add_argument("--attempt", type=_attempt, metavar="N",
                   help="the log kept of attempt N (0: the first), read from the checkpoints volume or S3 "
                        "after its pods are gone")
    p.add_argument("--pod-running-timeout", type=duration_seconds, metavar="DURATION",
                   help="without -f: how long to wait for the pod to start (default 60s; with --attempt, "
                        "for the log reader pod to finish, default 3m)")
    p.set_defaults(func=_cmd_logs)

    p = _verb(sub, "wait", "wait until a training reaches a phase or condition, or is deleted",
              "Wait until the training is in a phase, has a condition, or is gone; exit 1 when it ends "
              "elsewhere or the time runs out.",
              "  %(prog)s quickstart-cpu --for phase=Succeeded --timeout 1h\n"
              "  %(prog)s quickstart-cpu --for condition=Running\n"
              "  %(prog)s quickstart-cpu --for delete --timeout 60s")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("--for", dest="condition", required=True, metavar="WHAT",
                   help="phase=PHASE, condition=TYPE[=STATUS] (STATUS default True) or delete")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="give up after this long (default: never)")
    p.set_defaults(func=_cmd_wait)

    p = _verb(sub, "delete", "delete a training; the cluster removes its JobSet, pods and ConfigMap",
              "Delete the training; the garbage collector removes its JobSet, pods and ConfigMap.",
              "  %(prog)s quickstart-cpu --wait\n"
              "  %(prog)s quickstart-cpu --ignore-not-found")
    p.add_argument("name")
    _cluster_arguments(p)
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when there is no such training")
    p.add_argument("--wait", action="store_true", help="return once the training is gone")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=_cmd_delete)

    for verb, doing, about, example in (
            ("suspend", "suspend", "pause a training: its pods stop (saving a checkpoint) until it is resumed",
             "  %(prog)s quickstart-cpu --wait          # until its phase is Suspended"),
            ("resume", "resume", "let a suspended training go on from its last checkpoint",
             "  %(prog)s quickstart-cpu --wait          # until it has left phase Suspended")):
        p = _verb(sub, verb, about,
                  f"Set the training's spec.suspend to {str(verb == 'suspend').lower()}; the operator "
                  f"{doing}s its JobSet (under Kueue: holds it in, or gives it back to, its queue).",
                  example)
        p.add_argument("name")
        _cluster_arguments(p)
        p.add_argument("--wait", action="store_true",
                       help="return once the operator has " + ("suspended it" if verb == "suspend" else "resumed it"))
        p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
        p.set_defaults(func=_cmd_suspend, suspend=verb == "suspend")

    p = _verb(sub, "tensorboard", "copy the run's event files out of rank 0's pod and serve them "
                                  "with a local TensorBoard",
              "Copy the run's TensorBoard event files out of rank 0's running pod (as kubectl cp does) "
              "and serve them with a local TensorBoard, copying again while rank 0 runs.",
              "  %(prog)s quickstart-cpu                    # then open http://127.0.0.1:6006\n"
              "  %(prog)s quickstart-cpu --no-serve --logdir runs/tb")
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


def _client(args: argparse.Namespace) -> Client:
    from rosetta_operator.client import Client

    client = Client(args.kubeconfig, args.context, args.namespace)
    args._cluster = client.cluster  # for _reported's error message
    return client


def _connect(args: argparse.Namespace) -> Cluster:
    from rosetta_operator.kube import connect

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
def _cmd_submit(args: argparse.Namespace) -> int:
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
def _cmd_get(args: argparse.Namespace) -> int:
    from rosetta_operator.client import InvalidArgument

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
def _cmd_status(args: argparse.Namespace) -> int:
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
def _cmd_logs(args: argparse.Namespace) -> int:
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
def _cmd_wait(args: argparse.Namespace) -> int:
    goal = parse_for(args.condition)  # before the cluster: a bad --for is exit 2 anywhere
    client = _client(args)
    client.wait_for(args.name, goal, timeout=args.timeout)
    _condition_met(args.name)
    return 0


# ------------------------------------------------------------------------------ delete


@_reported
def _cmd_delete(args: argparse.Namespace) -> int:
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
def _cmd_suspend(args: argparse.Namespace) -> int:
    from rosetta_operator.client import PhaseGoal
    from rosetta_operator.kube import RESOURCE

    client = _client(args)
    changed = client.suspend(args.name) if args.suspend else client.resume(args.name)
    verb = "suspended" if args.suspend else "resumed"
    print(f"{RESOURCE}/{args.name} {verb}{'' if changed else ' (no change)'}", flush=True)
    if args.wait:
        client.wait_for(args.name, PhaseGoal("Suspended") if args.suspend else _Left(), timeout=args.timeout)
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
