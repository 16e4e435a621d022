"""`python -m rosetta_trainer ARGS`, the same as `rosetta ARGS` for the trainer's commands (commands/cli.py)."""

import sys

from rosetta_trainer.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
