"""Memory and compute estimates: will a spec fit, and its FLOPs."""
