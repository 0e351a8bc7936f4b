"""KL to the reference policy: per-token estimators, in-loss and in-reward use, controllers.

Per-token estimators of KL(pi || pi_ref) from the log-probs of the *sampled* tokens
(J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html), with
d = logp - ref_logp:

    "kl"  (k1)          d                       unbiased, high variance, can be negative
    "abs"               |d|
    "mse" (k2)          0.5 * d^2               low variance, biased
    "low_var_kl" (k3)   exp(-d) - (-d) - 1      unbiased, always >= 0; clamped to [-10, 10]
                                                like veRL (the clamp zeroes its gradient
                                                beyond 10)

KL is masked exactly like the policy loss: use `kl_loss` (same `agg_loss` mode and
normalisers) or `apply_kl_penalty` (sampled tokens only).
"""

from __future__ import annotations

import math

import torch

from agent_rl.training.algos.losses import agg_loss
from agent_rl.training.algos.masked import as_bool_mask, masked_mean

KL_KINDS = ("kl", "abs", "mse", "low_var_kl")
_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate (B,T) of kind kl | abs | mse | low_var_kl (aliases k1, k2, k3)."""
    kind = _ALIASES.get(kind, kind)
    d = logp - ref_logp
    if kind == "kl":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "mse":
        return 0.5 * d.square()
    if kind == "low_var_kl":
        neg = (-d).clamp(-20.0, 20.0)  # keeps exp finite for tokens the ref finds impossible
        return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; known: {list(KL_KINDS)} (aliases {sorted(_ALIASES)})")


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens=None,
    global_seqs=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-the-loss (GRPO, `use_kl_loss`): agg_loss(kl_penalty(logp, ref_logp, kind)).

    The trainer adds `kl_loss_coef * loss`. Returns (loss, {"kl_loss": float}).
    """
    m = as_bool_mask(mask, logp, "kl_loss")
    ref_logp = torch.where(m, ref_logp, logp.detach())  # masked garbage cannot reach the gradient
    per_token = kl_penalty(logp, ref_logp, kind)
    loss = agg_loss(per_token, m, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    return loss, {"kl_loss": loss.item()}


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-the-reward (PPO, `use_kl_in_reward`): r_t - coef * kl_t on sampled tokens.

    `logp` is the behaviour policy's (old) log-prob. Returns (token_rewards' (B,T), metrics):
    `kl` = mean over non-empty rows of each row's mean token KL (what the adaptive controller
    tracks, as in veRL) and `kl_coef`.
    """
    m = as_bool_mask(mask, token_rewards, "apply_kl_penalty")
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    kl = torch.where(m, kl_penalty(logp, ref_logp, kind), zero)
    per_row = masked_mean(kl, m, dim=-1)
    nonempty = m.any(dim=-1)
    current = per_row[nonempty].mean().item() if bool(nonempty.any()) else 0.0
    return token_rewards - coef * kl, {"kl": current, "kl_coef": float(coef)}


# ----------------------------------------------------------------------------- controllers
class FixedKLController:
    """Constant in-reward KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (same interface as the adaptive controller)."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive coefficient of Ziegler et al. 2019 (arXiv:1909.08593, section 2.2):

        e = clip(KL / target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    `n_steps` is the number of samples (veRL passes the batch size) since the last update.
    The coefficient is training state: checkpoint it with `state_dict()`.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):
            raise ValueError(f"AdaptiveKLController.update: current_kl is {current_kl}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


def make_kl_controller(kl_ctrl) -> FixedKLController | AdaptiveKLController:
    """Controller from a `KLCtrlConfig` (type fixed | adaptive, kl_coef, target_kl, horizon)."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kl_ctrl.type!r}; known: ['adaptive', 'fixed']")
