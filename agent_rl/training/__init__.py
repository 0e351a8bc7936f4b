"""Training: the Ray-driven RL loop, its workers, algorithms, batches, weight sync and checkpoints."""
