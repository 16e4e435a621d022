"""The `rosetta` command: the trainer's commands and the operator's in one parser, and `rosetta
validate`, which needs both sides (the operator's rendering, the trainer's data checks and memory
plan). The only package that imports both; a pod runs `python -m rosetta_trainer` instead.
"""
