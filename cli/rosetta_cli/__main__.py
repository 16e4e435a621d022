import sys

from rosetta_cli.main import main

sys.exit(main())
