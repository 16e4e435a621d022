"""`rosetta run`: the pods of a rendered JobSet as local processes (the embedded default)."""
