"""Evaluation on held-out QA (same rollout and reward code, greedy), reports and plots."""
