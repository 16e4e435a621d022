"""Operator subcommands of `rosetta`: crd, render, validate, run, operator.

Module-level imports stay light (no kopf, no kubernetes) because rosetta_trainer.cli
imports this module for every command, `rosetta train` included.
"""

from __future__ import annotations

import argparse
import sys


def _add_host_path_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-host-path", action="store_true", help="accept hostPath volumes in specs")


def _add_policy_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--policy", metavar="FILE", help=help)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from rosetta_contract.document_arguments import add_document_arguments

    p = sub.add_parser("crd", help="print the TranslationTraining CustomResourceDefinition (YAML)")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser("render", help="print the ConfigMap and JobSet the operator would create")
    add_document_arguments(p)
    p.add_argument("-n", "--namespace", help="namespace (default: metadata.namespace or 'default')")
    _add_host_path_argument(p)
    _add_policy_argument(p, "refuse, as the operator would, what this admin policy (YAML) does not allow")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("validate", help="check a TranslationTraining file as the operator would, "
                                         "and its data files when they are on this machine")
    add_document_arguments(p)
    _add_host_path_argument(p)
    _add_policy_argument(p, "check the file against this admin policy (YAML), as the operator would")
    p.add_argument("--skip-data", action="store_true", help="do not read the data files")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("run", help="run a TranslationTraining's pods as local processes (no cluster needed)")
    add_document_arguments(p)
    p.add_argument("-o", "--output", help="run directory (default: runs/<metadata.name>)")
    p.add_argument("--volume", action="append", default=[], metavar="NAME=LOCAL_DIR",
                   help="mount the pod volume NAME from this directory (repeatable; default: under the output)")
    _add_host_path_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--quiet", action="store_true", help="pod logs only to the log files, not the terminal")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    p.add_argument("--namespace", action="append", default=[], dest="namespaces", metavar="NS",
                   help="watch this namespace (repeatable); default: the whole cluster")
    p.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--liveness-port", type=int, default=8080, help="port of the /healthz endpoint")
    _add_host_path_argument(p)
    p.add_argument("--metrics-port", type=int, default=8000, help="port of the operator's Prometheus metrics")
    _add_policy_argument(p, "admin policy (YAML): registries, ServiceAccounts, priority classes, tolerations, "
                            "host paths, nodes and GPUs a training may use (docs/operator.md, Security)")
    p.add_argument("--peering", metavar="NAME",
                   help="coordinate replicas through this KopfPeering (installed by the Helm chart); "
                        "default: standalone, one replica")
    p.add_argument("--progress-interval", type=float, default=15.0, metavar="SECONDS",
                   help="how often each active training's rank 0 is scraped into status.progress")
    p.add_argument("--default-image", metavar="IMAGE",
                   help="trainer image of a training without spec.image (default: $ROSETTA_DEFAULT_IMAGE, "
                        "else the spec's own default)")
    p.set_defaults(func=_cmd_operator)

    from rosetta_operator.verbs import add_verbs

    add_verbs(sub)  # submit, get, status, logs, wait, delete, tensorboard


def _load_and_render(args):
    from rosetta_contract.spec import load_training
    from rosetta_operator.policy import PolicyViolation, load_policy, violations
    from rosetta_operator.render import render

    policy = load_policy(args.policy) if args.policy else None
    allow_host_path = args.allow_host_path or bool(policy and policy.allows_host_path)
    training = load_training(args.file, args.overrides, allow_host_path=allow_host_path)
    forbidden = violations(training.spec, policy) if policy else []
    if forbidden:
        raise PolicyViolation(forbidden, args.file, args.policy)
    namespace = getattr(args, "namespace", None) or training.metadata.namespace or "default"
    return training, render(training.metadata.name, namespace, training.spec)


def _policy_errors(command):
    """A policy file that cannot be used: one line and exit status 2, as a bad spec gets."""
    def run(args) -> int:
        from rosetta_operator.policy import PolicyError

        try:
            return command(args)
        except PolicyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return run


def _cmd_crd(args) -> int:
    import yaml

    from rosetta_operator.crd import build_crd

    sys.stdout.write(yaml.safe_dump(build_crd(), sort_keys=False, width=120))
    return 0


@_policy_errors
def _cmd_render(args) -> int:
    import yaml

    from rosetta_operator.render import render_evaluation_job

    training, rendered = _load_and_render(args)
    objects = rendered.objects()
    if training.spec.mode == "evaluate":  # what the operator creates then: no JobSet, the evaluation Job
        meta = rendered.configmap["metadata"]
        objects = [rendered.configmap, render_evaluation_job(training.metadata.name, meta["namespace"], training.spec)]
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=120))
    return 0


@_policy_errors
def _cmd_validate(args) -> int:
    # Rendering too catches what only the names reveal (pod hostnames over 63 characters).
    training, rendered = _load_and_render(args)
    spec = training.spec
    data_report = None if args.skip_data else _check_data(spec.data)  # a DataError exits 65
    per_node = _count(spec.gpus_per_node, "GPU") if spec.gpus_per_node else _count(spec.procs, "CPU process", "es")
    print(f"ok: {training.metadata.name}: {_count(spec.nodes, 'node')} x {per_node} per node "
          f"(world size {spec.world_size}), {spec.launcher}, network {spec.network.profile}, "
          f"image {spec.image}, JobSet {rendered.names.jobset}{', suspended' if spec.suspend else ''}")
    if data_report:
        print(data_report)
    _warn_if_it_does_not_fit(spec)
    return 0


def _warn_if_it_does_not_fit(spec) -> None:
    # Only the warning line of `rosetta plan`; CPU training returns before torch is imported.
    from rosetta_trainer.memory_plan import fit_warnings

    for line in fit_warnings(spec):
        print(line, file=sys.stderr)


def _check_data(data) -> str | None:
    """The data checks the trainer runs first (data_checks.py), when the files are here."""
    from rosetta_trainer.data_checks import describe_split, needs_checking, read_checked, unreachable

    if not needs_checking(data):
        return None  # only the generated demo corpus: nothing to check
    missing = unreachable(data)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return (f"data: not checked: {missing[0]} is not on this machine{more}; "
                "the trainer checks it in the pod before training")
    checked = read_checked(data, keep=False)
    lines = [f"data: {split}: {describe_split(split, report)}"
             for split, report in checked.reports.items() if report.read]
    return "\n".join(lines + [f"warning: {warning}" for warning in checked.warnings])


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{plural * (n != 1)}"


def _cmd_run(args) -> int:
    from rosetta_operator.local.pods import LocalRunError
    from rosetta_operator.local.runner import run

    try:
        return run(args.file, output=args.output, volumes=args.volume, overrides=args.overrides,
                   allow_host_path=args.allow_host_path, progress=not args.no_progress and sys.stderr.isatty(),
                   quiet=args.quiet)
    except LocalRunError as exc:
        print(f"rosetta run: {exc}", file=sys.stderr)
        return 2


@_policy_errors
def _cmd_operator(args) -> int:
    from rosetta_operator.main import run

    return run(args) or 0
