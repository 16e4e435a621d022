"""Rosetta's trainer: Hugging Face seq2seq models trained, evaluated and checkpointed for translation."""

from rosetta_contract import __version__

__all__ = ["__version__"]
