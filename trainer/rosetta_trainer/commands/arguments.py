"""Arguments more than one command takes: counts, and the generation settings of evaluate and translate."""

from __future__ import annotations

import argparse
from typing import Any, Callable


def count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def ratio(text: str) -> float | str:
    """A positive number, or 'none' (no limit relative to the source: only --max-new-tokens)."""
    if text.lower() == "none":
        return "none"
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number or 'none', got {text}")
    return value


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    """Search settings; each defaults to the checkpoint's spec.evaluation (docs/training.md, beam settings)."""
    g = p.add_argument_group("generation (default: the checkpoint's spec.evaluation)")
    g.add_argument("--beams", type=count(1), help="beam size, 1 = greedy")
    g.add_argument("--length-penalty", type=float, metavar="ALPHA",
                   help="beam search ranks by log-probability / length^ALPHA; above 1 favours longer outputs")
    g.add_argument("--no-repeat-ngram-size", type=count(0), metavar="N", help="never repeat an N-gram; 0 disables")
    g.add_argument("--max-length-ratio", type=ratio, metavar="A",
                   help="stop at A x source tokens + --max-length-offset ('none': only --max-new-tokens)")
    g.add_argument("--max-length-offset", type=count(0), metavar="B")
    g.add_argument("--max-new-tokens", type=count(1), metavar="N", help="longest output in tokens")


def generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generation flags given on the command line, as Generation fields (unset ones left out)."""
    names = ("beams", "length_penalty", "no_repeat_ngram_size", "max_length_ratio", "max_length_offset",
             "max_new_tokens")
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if given.get("max_length_ratio") == "none":
        given["max_length_ratio"] = None
    return given
