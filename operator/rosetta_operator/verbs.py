"""The `rosetta` verbs that act on a cluster: submit, get, status, logs, wait, delete, suspend,
resume, tensorboard.

They follow kubectl: the current kubeconfig, context and namespace (`--kubeconfig`, `--context`,
`-n`), `-o table|wide|name|json|yaml|jsonpath=…`, `get -w` and `-l`, errors as one `error: …` line
on stderr. Exit status: 0 done; 1 the cluster said no or the training did not get there (not
found, forbidden, unreachable, timed out, Failed); 2 the input is wrong (an invalid
TranslationTraining, a bad argument). Installed as `kubectl-rosetta` too, so `kubectl rosetta get
NAME` works.

This module declares the verbs and their arguments (verb_arguments.py holds the shared ones); each
verb's run_* (verb_commands.py) calls the Python client (client.py) and prints. Module-level imports
stay light: rosetta_operator.cli registers these for every `rosetta` command.
"""

from __future__ import annotations

import argparse

from rosetta_operator.verb_arguments import (
    attempt_number,
    cluster_arguments,
    duration_seconds,
    node_rank,
    output_argument,
    positive_duration,
    verb_parser,
)
from rosetta_operator.verb_commands import (
    run_delete,
    run_get,
    run_logs,
    run_status,
    run_submit,
    run_suspend,
    run_tensorboard,
    run_wait,
)


def add_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rosetta_contract.document_arguments import add_document_arguments

    p = verb_parser(sub, "submit", "validate a TranslationTraining file and apply it to the cluster "
                             "(server-side apply, with the other documents of the file)",
              "Validate the file's TranslationTraining as the operator would (nothing is applied when it "
              "is invalid), then server-side apply every document of the file in order, with field "
              "manager rosetta.",
              "  %(prog)s -f manifests/examples/quickstart-cpu.yaml\n"
              "  %(prog)s -f training.yaml --set spec.training.maxSteps=100 --wait --timeout 2h\n"
              "  envsubst < training.yaml | %(prog)s -f -       # '-': the file from standard input")
    add_document_arguments(p)
    cluster_arguments(p)
    p.add_argument("--allow-host-path", action="store_true", help="accept hostPath volumes when validating")
    p.add_argument("--force-conflicts", action="store_true",
                   help="take over fields another manager owns (server-side apply's --force-conflicts)")
    p.add_argument("--wait", action="store_true", help="then wait until the training Succeeded (exit 0) or Failed (1)")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=run_submit)

    p = verb_parser(sub, "get", "list trainings, or show one: phase, progress, ETA, BLEU, restarts",
              "One row per training of the namespace, or the one named; -w then prints a row each time "
              "one changes.",
              "  %(prog)s                                   # the namespace's trainings\n"
              "  %(prog)s -A -l team=nlp -o wide            # every namespace's, with this label, more columns\n"
              "  %(prog)s quickstart-cpu -w                 # a row at each change, until Ctrl-C\n"
              "  %(prog)s quickstart-cpu -o jsonpath='{.status.progress.display}'\n"
              "  %(prog)s -o jsonpath='{range .items[*]}{.metadata.name}{\"\\n\"}{end}'")
    p.add_argument("name", nargs="?", help="a training (default: every training of the namespace)")
    cluster_arguments(p)
    p.add_argument("-A", "--all-namespaces", action="store_true", help="trainings of every namespace")
    p.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="only trainings with these labels, as kubectl's -l: key=value, key!=value, key in (a,b)")
    p.add_argument("-w", "--watch", action="store_true", help="after the list, print each change as it happens")
    p.add_argument("--request-timeout", type=positive_duration, metavar="DURATION",
                   help="with -w: stop watching after this long (default: never)")
    output_argument(p)
    p.set_defaults(func=run_get)

    p = verb_parser(sub, "status", "one training in full: phase, progress, ETA, BLEU, restarts and "
                             "preemptions, last checkpoint, conditions, recent events",
              "One training in full, then its conditions and, as kubectl describe shows them, the recent "
              "events of the training, its JobSet and its pods.",
              "  %(prog)s quickstart-cpu\n"
              "  %(prog)s quickstart-cpu -o json | jq .etaSeconds")
    p.add_argument("name")
    cluster_arguments(p)
    output_argument(p)
    p.set_defaults(func=run_status)

    p = verb_parser(sub, "logs", "the log of one node's pod (rank 0 by default) or of all; -f follows it "
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
    cluster_arguments(p)
    p.add_argument("-f", "--follow", action="store_true", help="stream the log, and the next pod's after a restart")
    ranks = p.add_mutually_exclusive_group()
    ranks.add_argument("--rank", type=node_rank, metavar="N",
                       help="node rank, the pod's completion index (default 0; with --attempt, 0 and the "
                            "node whose failure ended it)")
    ranks.add_argument("--all-ranks", action="store_true",
                       help="every node's log, each line prefixed with its rank, as kubectl's --prefix")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of each pod's log")
    p.add_argument("--since", type=positive_duration, metavar="DURATION",
                   help="only lines newer than this, e.g. 10m (kubectl's --since)")
    p.add_argument("-p", "--previous", action="store_true",
                   help="the log of the rank's pod before the last gang restart, while the cluster still has it")
    p.add_argument("--attempt", type=attempt_number, metavar="N",
                   help="the log kept of attempt N (0: the first), read from the checkpoints volume or S3 "
                        "after its pods are gone")
    p.add_argument("--pod-running-timeout", type=duration_seconds, metavar="DURATION",
                   help="without -f: how long to wait for the pod to start (default 60s; with --attempt, "
                        "for the log reader pod to finish, default 3m)")
    p.set_defaults(func=run_logs)

    p = verb_parser(sub, "wait", "wait until a training reaches a phase or condition, or is deleted",
              "Wait until the training is in a phase, has a condition, or is gone; exit 1 when it ends "
              "elsewhere or the time runs out.",
              "  %(prog)s quickstart-cpu --for phase=Succeeded --timeout 1h\n"
              "  %(prog)s quickstart-cpu --for condition=Running\n"
              "  %(prog)s quickstart-cpu --for delete --timeout 60s")
    p.add_argument("name")
    cluster_arguments(p)
    p.add_argument("--for", dest="condition", required=True, metavar="WHAT",
                   help="phase=PHASE, condition=TYPE[=STATUS] (STATUS default True) or delete")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="give up after this long (default: never)")
    p.set_defaults(func=run_wait)

    p = verb_parser(sub, "delete", "delete a training; the cluster removes its JobSet, pods and ConfigMap",
              "Delete the training; the garbage collector removes its JobSet, pods and ConfigMap.",
              "  %(prog)s quickstart-cpu --wait\n"
              "  %(prog)s quickstart-cpu --ignore-not-found")
    p.add_argument("name")
    cluster_arguments(p)
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when there is no such training")
    p.add_argument("--wait", action="store_true", help="return once the training is gone")
    p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
    p.set_defaults(func=run_delete)

    for verb, doing, about, example in (
            ("suspend", "suspend", "pause a training: its pods stop (saving a checkpoint) until it is resumed",
             "  %(prog)s quickstart-cpu --wait          # until its phase is Suspended"),
            ("resume", "resume", "let a suspended training go on from its last checkpoint",
             "  %(prog)s quickstart-cpu --wait          # until it has left phase Suspended")):
        p = verb_parser(sub, verb, about,
                  f"Set the training's spec.suspend to {str(verb == 'suspend').lower()}; the operator "
                  f"{doing}s its JobSet (under Kueue: holds it in, or gives it back to, its queue).",
                  example)
        p.add_argument("name")
        cluster_arguments(p)
        p.add_argument("--wait", action="store_true",
                       help="return once the operator has " + ("suspended it" if verb == "suspend" else "resumed it"))
        p.add_argument("--timeout", type=duration_seconds, metavar="DURATION", help="with --wait: give up after this long")
        p.set_defaults(func=run_suspend, suspend=verb == "suspend")

    p = verb_parser(sub, "tensorboard", "copy the run's event files out of rank 0's pod and serve them "
                                  "with a local TensorBoard",
              "Copy the run's TensorBoard event files out of rank 0's running pod (as kubectl cp does) "
              "and serve them with a local TensorBoard, copying again while rank 0 runs.",
              "  %(prog)s quickstart-cpu                    # then open http://127.0.0.1:6006\n"
              "  %(prog)s quickstart-cpu --no-serve --logdir runs/tb")
    p.add_argument("name")
    cluster_arguments(p)
    p.add_argument("--logdir", help="where the copy goes (default: tensorboard/<namespace>/<name>)")
    p.add_argument("--port", type=int, default=6006)
    p.add_argument("--host", default="127.0.0.1", help="address TensorBoard listens on (default 127.0.0.1)")
    p.add_argument("--refresh", type=duration_seconds, default=60.0, metavar="DURATION",
                   help="copy again this often while rank 0 runs; 0: once (default 60s)")
    p.add_argument("--no-serve", action="store_true", help="only copy the files, print nothing else")
    p.set_defaults(func=run_tensorboard)
