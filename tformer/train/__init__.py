"""Training: optimizers and schedules, checkpoints, the loop, and scale-out with torchrun."""
