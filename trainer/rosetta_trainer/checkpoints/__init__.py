"""Checkpoints: the atomic step directories, DeepSpeed's shards in them, averaging, the S3 mirror."""
