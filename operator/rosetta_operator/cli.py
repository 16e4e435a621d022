"""Operator subcommands of `rosetta`: crd, render, run, operator and the kubectl-like verbs
(`rosetta validate`, which also checks data and memory, is rosetta_cli's).

Module-level imports stay light (no kopf, no kubernetes) because rosetta_cli imports this
module for every command, `rosetta train` included.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rosetta_contract.spec import TranslationTraining
    from rosetta_operator.render import Rendered


def add_host_path_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-host-path", action="store_true", help="accept hostPath volumes in specs")


def add_policy_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--policy", metavar="FILE", help=help)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rosetta_contract.document_arguments import add_document_arguments
    from rosetta_operator.verb_arguments import positive_duration

    p = sub.add_parser("crd", help="print the TranslationTraining CustomResourceDefinition (YAML)")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser("render", help="print the ConfigMap and JobSet the operator would create")
    add_document_arguments(p)
    p.add_argument("-n", "--namespace", help="namespace (default: metadata.namespace or 'default')")
    add_host_path_argument(p)
    add_policy_argument(p, "refuse, as the operator would, what this admin policy (YAML) does not allow; "
                           "default: the operator's default policy")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("run", help="run a TranslationTraining's pods as local processes (no cluster needed)")
    add_document_arguments(p)
    p.add_argument("-o", "--output", help="run directory (default: runs/<metadata.name>)")
    p.add_argument("--volume", action="append", default=[], metavar="NAME=LOCAL_DIR",
                   help="mount the pod volume NAME from this directory (repeatable; default: under the output)")
    add_host_path_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--quiet", action="store_true", help="pod logs only to the log files, not the terminal")
    p.set_defaults(func=_cmd_run)

    from rosetta_operator.main import LOG_FORMATS, LOG_LEVELS  # kopf itself only once it runs

    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    p.add_argument("--namespace", action="append", default=[], dest="namespaces", metavar="NS",
                   help="watch this namespace (repeatable); default: the whole cluster")
    p.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--liveness-port", type=int, default=8080, help="port of the /healthz endpoint")
    add_host_path_argument(p)
    p.add_argument("--metrics-port", type=int, default=8000, help="port of the operator's Prometheus metrics")
    add_policy_argument(p, "admin policy (YAML), cluster-wide and per namespace: registries, ServiceAccounts, "
                            "priority classes, queues, tolerations, nodes, host paths, GPUs, CPU and memory a "
                            "training may use (docs/operator.md, Security); default: the default policy")
    p.add_argument("--peering", metavar="NAME",
                   help="coordinate replicas through this KopfPeering (installed by the Helm chart); "
                        "default: standalone, one replica")
    # No defaults here: the startup hook's apply (DEFAULT_PROGRESS_INTERVAL, QUOTA_RETRY_DELAY), or the
    # environment's. Zero is refused rather than read as "unset".
    p.add_argument("--progress-interval", type=positive_duration, metavar="SECONDS",
                   help="how often each active training's rank 0 is scraped into status.progress (default: "
                        "15, or $ROSETTA_PROGRESS_INTERVAL)")
    p.add_argument("--quota-retry", type=positive_duration, metavar="SECONDS",
                   help="how soon a JobSet that a ResourceQuota refused is created again (default: 30, "
                        "or $ROSETTA_QUOTA_RETRY)")
    p.add_argument("--default-image", metavar="IMAGE",
                   help="trainer image of a training without spec.image (default: $ROSETTA_DEFAULT_IMAGE, "
                        "else the spec's own default)")
    p.add_argument("--log-level", choices=list(LOG_LEVELS), default="info",
                   help="the least severe log records written")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text lines, or one JSON object per line (time, level, logger, message, and the "
                        "object a record is about)")
    p.set_defaults(func=_cmd_operator)

    from rosetta_operator.verbs import add_verbs

    add_verbs(sub)  # submit, get, status, logs, wait, delete, tensorboard


def load_and_render(args: argparse.Namespace) -> tuple[TranslationTraining, Rendered]:
    """The file's training, refused as the operator would refuse it (without --policy: as one with
    the default policy), and what the operator would create."""
    from rosetta_contract.documents import apply_overrides, read_yaml
    from rosetta_contract.spec import parse_training
    from rosetta_operator.policy import PolicyViolation, load_policy, rules_for, violations
    from rosetta_operator.render import render

    policy = load_policy(args.policy) if args.policy else None
    raw = apply_overrides(read_yaml(args.file), args.overrides, args.file)
    # The namespace picks the policy's rules, whether hostPath volumes may be read at all included.
    metadata = raw.get("metadata") if isinstance(raw, dict) else None
    written = metadata.get("namespace") if isinstance(metadata, dict) else None
    namespace = getattr(args, "namespace", None) or (written if isinstance(written, str) and written else "default")
    allow_host_path = args.allow_host_path or rules_for(policy, namespace).allows_host_path
    training = parse_training(raw, args.file, allow_host_path=allow_host_path)
    forbidden = violations(training.spec, policy, namespace)
    if forbidden:
        raise PolicyViolation(forbidden, args.file, args.policy, default=policy is None)
    return training, render(training.metadata.name, namespace, training.spec)


def _cmd_crd(args: argparse.Namespace) -> int:
    import yaml

    from rosetta_operator.crd import build_crd

    sys.stdout.write(yaml.safe_dump(build_crd(), sort_keys=False, width=120))
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    import yaml

    from rosetta_operator.evaluation_job import required_evaluation_job

    training, rendered = load_and_render(args)
    objects = rendered.objects()
    if training.spec.mode == "evaluate":  # what the operator creates then: no JobSet, the evaluation Job
        meta = rendered.configmap["metadata"]
        objects = [rendered.configmap, required_evaluation_job(training.metadata.name, meta["namespace"], training.spec)]
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=120))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from rosetta_operator.local.pods import LocalRunError
    from rosetta_operator.local.runner import run

    try:
        return run(args.file, output=args.output, volumes=args.volume, overrides=args.overrides,
                   allow_host_path=args.allow_host_path, progress=not args.no_progress and sys.stderr.isatty(),
                   quiet=args.quiet)
    except LocalRunError as exc:
        print(f"rosetta run: {exc}", file=sys.stderr)
        return 2


def _cmd_operator(args: argparse.Namespace) -> int:
    from rosetta_operator.main import run

    return run(args) or 0
