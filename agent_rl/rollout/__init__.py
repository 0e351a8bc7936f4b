"""Rollout: the vLLM engines, the multi-turn rollout manager, prompts and observations, the retrieval client, rewards."""
