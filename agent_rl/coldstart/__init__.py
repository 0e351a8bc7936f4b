"""Cold start: grounded demonstration trajectories and SFT on them, before RL."""
