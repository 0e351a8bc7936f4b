"""Advantage estimators: outcome reward -> per-token advantages and returns.

Every estimator has the signature

    fn(token_rewards (B,T), mask (B,T), group_ids (B,) | None, values (B,T) | None, cfg)
        -> (advantages (B,T), returns (B,T))

and is registered by its `algorithm.adv_estimator` name. `mask` is 1 on tokens the policy
sampled and 0 on prompt padding, observation (`<information>`) and feedback tokens, which in
our trajectories sit in the MIDDLE of a response. Conventions shared by all estimators:

- only masked positions are read (a token reward outside the mask is ignored) and outputs
  are exactly 0 outside the mask;
- the outcome score of a row is the sum of its masked token rewards (the outcome reward
  from `place_outcome_reward`, minus any in-reward KL penalty; an estimator registered with
  outcome="acc" is given the task metric instead of the reward);
- observation tokens are *transparent*: recursions over time (GAE, discounted returns) run
  over the sampled tokens only, in order, as if the observation tokens were not there — no
  discount is applied across an observation and no value is read at one. The environment
  acted in between, but the policy made no decision there;
- a group with a single member has no baseline to compare with: group-baseline estimators
  give it advantage 0 (no signal) rather than veRL's "baseline 0", which would reward the
  raw score;
- estimators without a critic return `returns = advantages` (veRL convention; nothing
  regresses on them). Only GAE's returns are critic targets.

`cfg` is the `AlgorithmConfig` (read by duck typing: gamma, lam, norm_adv_by_std_in_grpo).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from agent_rl.training.algos.masked import as_bool_mask, masked_sum, masked_whiten
from agent_rl.training.algos.registry import cfg_get, register_adv_est

GRPO_EPS = 1e-6
"""Added to the group std before dividing (veRL's epsilon). All-equal groups get exactly 0:
`_group_baseline` takes their mean as their common value, because a float32 mean of eight
rewards of 0.2 is off by one ulp and, over a std of ~1e-8, became -0.0147 each (veRL's
`compute_grpo_outcome_advantage` shares that rounding; its eps does not absorb it)."""


# ----------------------------------------------------------------------------- helpers
def place_outcome_reward(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards (B,T) holding each row's score (B,) on its LAST sampled token.

    The last position with mask == 1 is the last token the policy chose (usually `</answer>`
    or EOS); observation tokens after it, if any, cannot carry the reward. A row with no
    sampled token has nowhere to put its reward: that is an upstream bug, so it raises.
    """
    if scores.dim() != 1 or mask.dim() != 2 or scores.shape[0] != mask.shape[0]:
        raise ValueError(
            f"place_outcome_reward: need scores (B,) and mask (B,T), got {tuple(scores.shape)} and {tuple(mask.shape)}"
        )
    m = mask.bool()
    empty = (~m.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"place_outcome_reward: rows {empty} have no sampled token (mask all 0)")
    T = m.shape[1]
    positions = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, positions, -1).max(dim=1).values  # (B,)
    out = torch.zeros(m.shape, dtype=scores.dtype if scores.is_floating_point() else torch.float32, device=m.device)
    out[torch.arange(m.shape[0], device=m.device), last] = scores.to(out.dtype)
    return out


def group_index(group_ids: torch.Tensor | Sequence[Hashable], n: int) -> tuple[torch.Tensor, list]:
    """Map arbitrary group ids (ints, strings, a LongTensor) to 0..G-1.

    Returns (index LongTensor (n,), unique ids in order of first appearance).
    """
    ids = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries for a batch of {n}")
    first: dict = {}
    index = [first.setdefault(g, len(first)) for g in ids]
    return torch.tensor(index, dtype=torch.long), list(first)


def _group_baseline(scores: torch.Tensor, group_ids, what: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group mean, unbiased group std, group size) of `scores` (B,). std is 0 for
    groups of size 1."""
    if group_ids is None:
        raise ValueError(f"{what} needs group_ids (rows sampled from the same prompt share an id)")
    idx, uniq = group_index(group_ids, scores.shape[0])
    idx = idx.to(scores.device)
    G = len(uniq)
    count = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, idx, torch.ones_like(scores))
    mean = torch.zeros_like(count).index_add_(0, idx, scores) / count
    # A group whose scores are all equal has that value as its mean, exactly (see GRPO_EPS).
    low = torch.full_like(count, float("inf")).scatter_reduce(0, idx, scores, "amin")
    high = torch.full_like(count, float("-inf")).scatter_reduce(0, idx, scores, "amax")
    mean = torch.where(low == high, low, mean)
    sq_dev = torch.zeros_like(count).index_add_(0, idx, (scores - mean[idx]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return mean[idx], std[idx], count[idx]


def _check(token_rewards: torch.Tensor, mask: torch.Tensor, where: str) -> torch.Tensor:
    if token_rewards.dim() != 2:
        raise ValueError(f"{where}: token_rewards must be (B,T), got {tuple(token_rewards.shape)}")
    return as_bool_mask(mask, token_rewards, where)


def _broadcast(per_row: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(m, per_row[:, None], torch.zeros((), dtype=per_row.dtype, device=per_row.device))


def _group_relative(token_rewards, mask, group_ids, where: str):
    """Shared front half of the group-baseline estimators: (bool mask, scores, mean, std, n)."""
    m = _check(token_rewards, mask, where)
    scores = masked_sum(token_rewards, m, dim=1)
    mean, std, n = _group_baseline(scores, group_ids, where)
    return m, scores, mean, std, n


# ----------------------------------------------------------------------------- outcome estimators
@register_adv_est("grpo", uses_groups=True)
@torch.no_grad()
def grpo(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """GRPO (Shao et al. 2024, arXiv:2402.03300): A_i = (s_i - mean_g) / (std_g + eps).

    With `cfg.norm_adv_by_std_in_grpo = False` the std division is dropped (Dr.GRPO, Liu et
    al. 2025, arXiv:2503.20783: dividing by std up-weights near-unanimous groups). std is the
    unbiased group std. Groups of size 1 get A = 0. The advantage is the same on every
    sampled token of a row.
    """
    m, scores, mean, std, n = _group_relative(token_rewards, mask, group_ids, "grpo")
    adv = scores - mean
    if cfg_get(cfg, "norm_adv_by_std_in_grpo", True):
        adv = adv / (std + GRPO_EPS)
    adv = torch.where(n > 1, adv, torch.zeros_like(adv))
    adv = _broadcast(adv, m)
    return adv, adv


@register_adv_est("rloo", uses_groups=True)
@torch.no_grad()
def rloo(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): A_i = s_i - mean_{j != i} s_j
    = n/(n-1) * (s_i - mean_g). Groups of size 1 get A = 0."""
    m, scores, mean, _, n = _group_relative(token_rewards, mask, group_ids, "rloo")
    adv = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), torch.zeros_like(scores))
    adv = _broadcast(adv, m)
    return adv, adv


@register_adv_est("reinforce_plus_plus_baseline", uses_groups=True)
@torch.no_grad()
def reinforce_plus_plus_baseline(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262): s_i - mean_g on every
    sampled token, then whitened over all sampled tokens of the batch. Groups of size 1 get
    0 before whitening."""
    m, scores, mean, _, n = _group_relative(token_rewards, mask, group_ids, "reinforce_plus_plus_baseline")
    centred = torch.where(n > 1, scores - mean, torch.zeros_like(scores))
    adv = masked_whiten(_broadcast(centred, m), m)
    return adv, adv


@register_adv_est("rejection_sampling", outcome="acc", policy_loss="rft", accepts_kl_in_reward=False,
                  flat_groups_carry_signal=True)
@torch.no_grad()
def rejection_sampling(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """Rejection sampling fine-tuning's keep weights: 1 on every sampled token of a trajectory
    whose outcome is at least `cfg.rft_min_acc` (default 1.0), 0 elsewhere.

    RFT (Yuan et al. 2023, arXiv:2308.01825; the baseline Search-R1 compares RL with, Jin et
    al. 2025, arXiv:2503.09516): sample as GRPO does, keep the trajectories that reach the
    answer, fine-tune on them. Registered with outcome="acc", so the outcome is the task metric
    (reward.kind's EM / F1 of the answer), never the reward: a well-formed wrong answer's format
    reward (Search-R1's 0.2) must not be kept. With policy_loss="rft" the weights select the
    tokens of rft's NLL; they are not advantages (no baseline, so groups play no part).
    returns = weights. The kept share of a batch is logged as adv/nonzero_frac.
    """
    m = _check(token_rewards, mask, "rejection_sampling")
    keep = masked_sum(token_rewards, m, dim=1) >= float(cfg_get(cfg, "rft_min_acc", 1.0))
    weights = _broadcast(keep.to(token_rewards.dtype), m)
    return weights, weights


# ----------------------------------------------------------------------------- time recursions
@torch.no_grad()
def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go G_t = r_t + gamma * G_next over sampled tokens only (B,T); 0 outside mask.

    `G_next` is the return at the next *sampled* token: observation tokens neither add reward
    nor discount. (veRL's `compute_reinforce_plus_plus_outcome_advantage`, as of its commit
    b178a3cd5, resets the running return at every mask-0 token, "Reset after EOS", which in a
    multi-turn response cuts the outcome reward off from every turn before the last observation.)
    """
    m = _check(token_rewards, mask, "discounted_returns")
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        g = token_rewards[:, t] + gamma * running
        running = torch.where(m[:, t], g, running)
        out[:, t] = torch.where(m[:, t], g, torch.zeros_like(g))
    return out


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, arXiv:1506.02438) over sampled tokens only, not whitened.

    For sampled positions t < t' consecutive *among sampled tokens* (observation tokens in
    between are skipped):
        delta_t = r_t + gamma * V_t' - V_t,   A_t = delta_t + gamma * lam * A_t'
    and V, A after the last sampled token are 0 (terminal). returns = A + V (critic target).
    Shapes (B,T); both outputs are 0 outside the mask.
    """
    m = _check(token_rewards, mask, "compute_gae")
    if values is None or values.shape != token_rewards.shape:
        got = None if values is None else tuple(values.shape)
        raise ValueError(f"compute_gae: values must be (B,T) like token_rewards, got {got}")
    adv = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        # Observation tokens keep the carried value/advantage untouched (transparent).
        next_value = torch.where(m[:, t], values[:, t], next_value)
        next_adv = torch.where(m[:, t], a, next_adv)
        adv[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
    returns = torch.where(m, adv + values, torch.zeros_like(adv))
    return adv, returns


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go (`cfg.gamma`) over
    sampled tokens, whitened over all sampled tokens of the batch. returns = un-whitened G."""
    m = _check(token_rewards, mask, "reinforce_plus_plus")
    returns = discounted_returns(token_rewards, m, float(cfg_get(cfg, "gamma", 1.0)))
    return masked_whiten(returns, m), returns


@register_adv_est("gae", needs_critic=True)
@torch.no_grad()
def gae(token_rewards, mask, group_ids=None, values=None, cfg=None):
    """PPO's estimator: `compute_gae` with `cfg.gamma`, `cfg.lam` and critic `values` (B,T),
    then advantages whitened over the batch's sampled tokens (as veRL / Search-R1 PPO).
    returns (critic targets) are not whitened."""
    if values is None:
        raise ValueError("gae needs critic values (B,T); use a critic-free estimator (grpo, rloo, ...) otherwise")
    m = _check(token_rewards, mask, "gae")
    adv, returns = compute_gae(
        token_rewards, values, m, float(cfg_get(cfg, "gamma", 1.0)), float(cfg_get(cfg, "lam", 1.0))
    )
    return masked_whiten(adv, m), returns
