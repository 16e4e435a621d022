"""`rosetta` (and `kubectl rosetta`): every command, one exit-code table (rosetta_contract.exits)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rosetta_cli import validate
from rosetta_contract import __version__
from rosetta_contract.command_dispatch import dispatch
from rosetta_operator import cli as operator_cli
from rosetta_trainer.commands import cli as trainer_cli

PLUGIN = "kubectl-rosetta"
# As `kubectl rosetta`, the help lists the verbs that act on the cluster, then the offline helpers
# that go with them, in this order. The rest (train, run, operator, the trainer's tools) still run
# when named, but the help leaves them out: a kubectl command acts on the cluster, and `kubectl
# rosetta train` would train on the workstation instead, which no kubectl user expects.
PLUGIN_COMMANDS = ("submit", "get", "status", "logs", "wait", "suspend", "resume", "delete", "tensorboard",
                   "validate", "render", "crd")


def invoked_as(argv0: str) -> str:
    """`kubectl rosetta` when kubectl ran us as its plugin (argv[0] is the kubectl-rosetta
    executable), else `rosetta`: usage lines and examples name the command the user typed."""
    name = Path(argv0).name
    if name.lower().endswith(".exe"):
        name = name[:-4]
    return "kubectl rosetta" if name == PLUGIN else "rosetta"


def build_parser(prog: str = "rosetta") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Rosetta: train translation models from one YAML, "
                                     "on a Kubernetes cluster or on this machine.")
    # The program's own name, not `kubectl rosetta`: the version is the package's.
    parser.add_argument("--version", action="version", version=f"rosetta {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND" if prog != "rosetta" else None)
    trainer_cli.add_commands(sub)
    validate.add_command(sub)
    operator_cli.add_commands(sub)
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or tcsh)",
                       description="Print a completion script for the rosetta command.",
                       epilog="examples:\n"
                              "  source <(rosetta completion bash)                    # this shell\n"
                              "  rosetta completion bash > /etc/bash_completion.d/rosetta\n"
                              "  rosetta completion zsh > \"${fpath[1]}/_rosetta\"      # then: compinit",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    p.set_defaults(func=_cmd_completion)
    if prog != "rosetta":
        listed = {action.dest: action for action in sub._choices_actions}
        sub._choices_actions[:] = [listed[name] for name in PLUGIN_COMMANDS if name in listed]
    return parser


# Completion of a training's name asks the cluster (the current context's namespace), quietly:
# no cluster, no names, no noise on the terminal.
_NAMES = "rosetta get -o jsonpath='{.items[*].metadata.name}' 2>/dev/null"
_PREAMBLE = {
    "bash": f'_rosetta_trainings() {{ compgen -W "$({_NAMES})" -- "$1"; }}\n',
    "zsh": f"_rosetta_trainings() {{\n  local -a names\n  names=(${{=$({_NAMES})}})\n  compadd -a names\n}}\n",
}
_TRAINING = {"bash": "_rosetta_trainings", "zsh": "_rosetta_trainings"}
_FILE_OPTIONS = frozenset({"--file", "--kubeconfig", "--policy"})


def completion_script(shell: str) -> str:
    """shtab's script for the whole parser: subcommands, options, files after -f, --kubeconfig and
    --policy, and the trainings of the cluster where a verb takes a NAME."""
    import shtab

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, subparser in commands.choices.items():
        for arg in subparser._actions:
            if _FILE_OPTIONS & set(arg.option_strings):
                arg.complete = shtab.FILE  # shtab reads this attribute
            elif arg.dest == "name" and not arg.option_strings and name in PLUGIN_COMMANDS:
                arg.complete = _TRAINING
    return str(shtab.complete(parser, shell=shell, preamble=_PREAMBLE.get(shell, "")))


def _cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.shell))
    return 0


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(invoked_as(sys.argv[0])).parse_args(argv))
