"""Rosetta's trainer: Hugging Face seq2seq models trained, evaluated and checkpointed for translation."""

__version__ = "0.1.0"
