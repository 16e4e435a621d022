"""`rosetta average --checkpoints DIR --last N | --best N -o OUT` (checkpoints/averaging.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rosetta_trainer.checkpoints.averaging import average_checkpoints, select


def average_command(args: argparse.Namespace) -> int:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file loading bars: noise in a command's output
    chosen = select(Path(args.checkpoints), last=args.last, best=args.best)
    selection = f"last {args.last}" if args.last is not None else f"best {args.best}"
    out = average_checkpoints(chosen, Path(args.output), selection)
    print(f"averaged {', '.join(p.name for p in chosen)} into {out}")
    return 0
