"""Agentic search RL: multi-turn rollouts with retrieval, GRPO/PPO on Ray, SFT cold start, eval."""

from data_prep import lean_imports

lean_imports.install()  # before any process of ours loads transformers (data_prep/lean_imports.py)
