"""Corpora read into examples (text files, JSONL, Parquet, saved datasets, the built-in demo corpus) and batched."""
