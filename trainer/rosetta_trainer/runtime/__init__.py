"""The process and its cluster: the process group, preflight, termination messages, cgroup memory, S3 client."""
