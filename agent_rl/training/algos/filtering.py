"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476, section 3.2): drop groups
whose rewards all agree.

Under any group-baseline estimator such a group has advantage 0 on every token, so it only
dilutes the batch (and, with token-mean, shrinks the effective learning rate). The trainer
over-samples prompts and keeps the groups that carry signal until the batch is full. Under an
estimator registered with flat_groups_carry_signal (rejection_sampling: an all-right group is
all kept samples) that reason fails, and the trainer does not filter (`groups.GroupRules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from agent_rl.training.algos.advantages import group_index


@dataclass
class GroupFilterResult:
    keep: torch.Tensor
    """(N,) bool: rows whose group has signal."""
    kept_groups: list
    """Group ids kept, in order of first appearance."""
    dropped_groups: list
    """Group ids dropped (all rewards agree, or a single member)."""
    metrics: dict[str, float]
    """num_groups, num_groups_kept, frac_groups_kept, frac_samples_kept."""


def filter_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable], atol: float = 0.0
) -> GroupFilterResult:
    """Keep groups whose rewards are not all equal: max - min > `atol` within the group.

    `rewards` (N,) are the outcome scores; `group_ids` (N,) mark rows of the same prompt.
    A group of one has no spread and is dropped, matching GRPO's advantage 0 for it.
    """
    if rewards.dim() != 1:
        raise ValueError(f"filter_groups: rewards must be (N,), got {tuple(rewards.shape)}")
    idx, uniq = group_index(group_ids, rewards.shape[0])
    idx = idx.to(rewards.device)
    r = rewards.float()
    G = len(uniq)
    gmax = torch.full((G,), -torch.inf, device=r.device).scatter_reduce(0, idx, r, "amax")
    gmin = torch.full((G,), torch.inf, device=r.device).scatter_reduce(0, idx, r, "amin")
    group_keep = (gmax - gmin) > atol
    keep = group_keep[idx]
    flags = group_keep.tolist()
    n_kept = sum(flags)
    metrics = {
        "num_groups": float(G),
        "num_groups_kept": float(n_kept),
        "frac_groups_kept": n_kept / G if G else 0.0,
        "frac_samples_kept": int(keep.sum()) / keep.numel() if keep.numel() else 0.0,
    }
    return GroupFilterResult(
        keep=keep,
        kept_groups=[g for g, k in zip(uniq, flags) if k],
        dropped_groups=[g for g, k in zip(uniq, flags) if not k],
        metrics=metrics,
    )
