"""Training: optimizers and schedules, losses, the Trainer, checkpoints and the train / sample command line (chapters 3-5 and after)."""
