"""The training engine: the loop, the DDP and DeepSpeed backends, optimizers and schedules, preemption."""
