"""`rosetta stage [--prepare OUTPUT]`: the stage job (preparation/staging.py copies; commands/prepare.py prepares)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rosetta_contract.spec import load_for_trainer
from rosetta_trainer.commands.prepare import prepare_training
from rosetta_trainer.preparation.staging import stage_all


def stage_command(args: argparse.Namespace) -> int:
    """`rosetta stage`: copy the spec's model.source and data.source into place (the stage job);
    with --prepare OUTPUT, then prepare the training data as `rosetta prepare -o OUTPUT` does
    (data.prepare: BeforeTraining), from what was just copied."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = load_for_trainer(args.file, args.overrides).spec
    done = stage_all(spec)
    if not done:
        print("nothing to stage: the spec has no model.source or data.source", flush=True)
    for entry in done:
        state = f"copied {entry['files']} files" if entry["copied"] else "already there"
        print(f"{entry['what']}: {entry['uri']} -> {entry['path']} ({state})", flush=True)
    if args.prepare:
        prepare_training(spec, Path(args.prepare))
    return 0
