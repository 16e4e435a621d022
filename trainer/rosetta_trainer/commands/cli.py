"""The trainer's commands (train, prepare, stage, evaluate, translate, average, export, plan).

Subcommands import their heavy dependencies lazily, so that `rosetta validate` or `rosetta crd`
(rosetta_cli, which adds these to the operator's) never pay for importing torch."""

from __future__ import annotations

import argparse
import logging
import sys

from rosetta_contract import __version__, command_dispatch
from rosetta_contract.document_arguments import add_document_arguments
from rosetta_trainer.commands.arguments import add_generation_arguments, count


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="train a TranslationTraining in this process (or under torchrun)")
    add_document_arguments(p)
    p.add_argument("-o", "--output", help="output directory (default: runs/<metadata.name>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("prepare", help="tokenize the training data once into <output>/prepared/ (train maps it)")
    add_document_arguments(p)
    p.add_argument("-o", "--output", help="output directory of the training (default: runs/<metadata.name>)")
    p.add_argument("--workers", type=int, help="tokenizing processes (default: one per core)")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("stage", help="copy model.source and data.source into place (before training, once)")
    add_document_arguments(p)
    p.add_argument("--prepare", metavar="OUTPUT",
                   help="then tokenize the training data into OUTPUT/prepared/, as `prepare -o OUTPUT` does")
    p.set_defaults(func=_cmd_stage)

    p = sub.add_parser("evaluate", help="evaluate a saved checkpoint, exported or pretrained model")
    p.add_argument("--checkpoint", help="checkpoint or model directory (with --pick: the checkpoint directory "
                   "holding the step-* dirs); default: -f's model.name, a hub id or a local path")
    p.add_argument("--pick", choices=["final", "best", "averaged"],
                   help="which checkpoint of the directory: the newest, the best by validation score, or the "
                        "averaged model (checkpoint.average)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to run the model (auto: a GPU when one is visible)")
    add_document_arguments(p, required=False,
                           file_help="YAML whose data.test (or --split) to evaluate; default: the checkpoint's own config")
    p.add_argument("--split", default="test", choices=["validation", "test"])
    p.add_argument("--max-samples", type=int)
    p.add_argument("--output", help="write the scores (JSON) and hypotheses here")
    add_generation_arguments(p)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("translate", help="translate text with a saved checkpoint")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint, averaged or exported model directory (a CTranslate2 export too)")
    p.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    p.add_argument("--target-lang", help="target language of a multilingual model")
    add_generation_arguments(p)
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("average", help="average the weights of the last or best N checkpoints")
    p.add_argument("--checkpoints", required=True, metavar="DIR", help="checkpoint directory (holding step-* dirs)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=count(1), metavar="N", help="the N newest complete checkpoints")
    which.add_argument("--best", type=count(1), metavar="N", help="the N with the best validation score")
    p.add_argument("-o", "--output", required=True, help="directory for the averaged model")
    p.set_defaults(func=_cmd_average)

    p = sub.add_parser("export", help="convert a checkpoint for serving (CTranslate2)")
    p.add_argument("--checkpoint", required=True, help="checkpoint, averaged or exported model directory")
    p.add_argument("--format", required=True, choices=["ctranslate2", "onnx"])
    p.add_argument("--quantization", help="CTranslate2 weight type, e.g. int8, int8_float16, float16 (default: as saved)")
    p.add_argument("-o", "--output", required=True, help="directory for the exported model")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("plan", help="will it fit? GPU and node memory under DDP and each ZeRO stage")
    add_document_arguments(p)
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="memory of one GPU, e.g. 80GiB (default: from the network profile or node selector)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)


# Each command's module is imported when the command runs: most load torch, which `rosetta --help`,
# `rosetta validate` and the operator's commands (rosetta_cli) never need.
def _cmd_train(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.train import train_from_file

    # A bar on a pipe (pod logs, the local runner) is a stream of carriage returns: only on a terminal.
    progress = not args.no_progress and sys.stderr.isatty()
    try:
        train_from_file(args.file, output=args.output, overrides=args.overrides, progress=progress)
    except RuntimeError as exc:
        from rosetta_trainer.runtime.distributed import collective_timeout  # torch: loaded by now, not for --help

        # torch reports a timed-out collective as a RuntimeError like any other: named here, it
        # gets its own exit status (rosetta_contract.exits) instead of a traceback.
        timeout = collective_timeout(exc)
        if timeout is None:
            raise
        logging.getLogger("rosetta_trainer").error("the collective that timed out was called here:", exc_info=exc)
        raise timeout from exc
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.prepare import prepare_command

    return prepare_command(args)


def _cmd_stage(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.stage import stage_command

    return stage_command(args)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.evaluate import evaluate_command

    return evaluate_command(args)


def _cmd_translate(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.evaluate import translate_command

    return translate_command(args)


def _cmd_average(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.average import average_command

    return average_command(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.export import export_command

    return export_command(args)


def _cmd_plan(args: argparse.Namespace) -> int:
    from rosetta_trainer.commands.plan import plan_command

    return plan_command(args)


def build_parser() -> argparse.ArgumentParser:
    """The trainer's commands alone: what a pod runs as `python -m rosetta_trainer` (the `rosetta`
    command adds the operator's, rosetta_cli)."""
    parser = argparse.ArgumentParser(
        prog="python -m rosetta_trainer", description=__doc__.split("\n")[0],
        epilog="validate, render, run, operator and the kubectl-like verbs are the `rosetta` command's "
               "(python -m rosetta_cli).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    return command_dispatch.dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
