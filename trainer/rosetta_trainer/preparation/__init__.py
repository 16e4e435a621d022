"""The training data made ready: checked, deduplicated, tokenized into shards, staged; the tokenizer trained."""
