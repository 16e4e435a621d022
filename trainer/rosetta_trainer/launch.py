"""`python -m rosetta_trainer.launch torchrun ARGS...`: a trainer pod's first process (commands/launch.py).

The operator renders this module's name into every pod's command: it stays here while the code moves.
"""

import sys

from rosetta_trainer.commands.launch import main

if __name__ == "__main__":
    sys.exit(main())
