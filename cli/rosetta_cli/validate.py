"""`rosetta validate`: the file as the operator would judge it, then its data files when they are on
this machine (the trainer's own first checks) and whether it fits in memory (`rosetta plan`'s warning)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rosetta_contract.document_arguments import add_document_arguments
from rosetta_operator.cli import add_host_path_argument, add_policy_argument, load_and_render

if TYPE_CHECKING:
    from rosetta_contract.data_fields import DataSpec
    from rosetta_contract.spec import TranslationTrainingSpec


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a TranslationTraining file as the operator would, "
                                         "and its data files when they are on this machine")
    add_document_arguments(p)
    p.add_argument("-n", "--namespace", help="namespace whose policy rules apply (default: metadata.namespace "
                                             "or 'default')")
    add_host_path_argument(p)
    add_policy_argument(p, "check the file against this admin policy (YAML), as the operator would; "
                           "default: the operator's default policy")
    p.add_argument("--skip-data", action="store_true", help="do not read the data files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Rendering too catches what only the names reveal (pod hostnames over 63 characters).
    training, rendered = load_and_render(args)
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


def _warn_if_it_does_not_fit(spec: TranslationTrainingSpec) -> None:
    # Only the warning line of `rosetta plan`; CPU training returns before torch is imported.
    from rosetta_trainer.planning.memory_plan import fit_warnings

    for line in fit_warnings(spec):
        print(line, file=sys.stderr)


def _check_data(data: DataSpec) -> str | None:
    """The data checks the trainer runs first (data_checks.py), when the files are here."""
    from rosetta_trainer.preparation.data_checks import describe_split, needs_checking, read_checked, unreachable

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
