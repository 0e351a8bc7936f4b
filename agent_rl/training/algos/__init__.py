"""RL algorithms as pure functions on tensors, registered by name (torch + stdlib only).

- advantage estimators: `get_adv_estimator(algorithm.adv_estimator)` -> grpo, rloo,
  reinforce_plus_plus, reinforce_plus_plus_baseline, gae; `place_outcome_reward`
- policy losses: `get_policy_loss(name)` -> vanilla (PPO clip / clip-higher / dual-clip / TIS);
  `value_loss`, `entropy_loss`, `agg_loss` (+ `agg_normalizers` for gradient accumulation)
- KL: `kl_penalty`, `kl_loss`, `apply_kl_penalty`, fixed / adaptive controllers
- `filter_groups` (DAPO dynamic sampling)
"""

from agent_rl.training.algos.advantages import (
    compute_gae,
    discounted_returns,
    gae,
    group_index,
    grpo,
    place_outcome_reward,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)
from agent_rl.training.algos.filtering import GroupFilterResult, filter_groups
from agent_rl.training.algos.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from agent_rl.training.algos.losses import (
    AGG_MODES,
    agg_loss,
    agg_normalizers,
    entropy_from_logits,
    entropy_loss,
    ppo_policy_loss,
    value_loss,
)
from agent_rl.training.algos.masked import masked_mean, masked_whiten
from agent_rl.training.algos.registry import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    get_adv_estimator,
    get_policy_loss,
    needs_critic,
    register_adv_est,
    register_policy_loss,
    uses_groups,
)

__all__ = [
    "ADV_ESTIMATORS", "AGG_MODES", "KL_KINDS", "POLICY_LOSSES", "AdaptiveKLController", "FixedKLController",
    "GroupFilterResult", "agg_loss", "agg_normalizers", "apply_kl_penalty", "compute_gae", "discounted_returns",
    "entropy_from_logits", "entropy_loss", "filter_groups", "gae", "get_adv_estimator", "get_policy_loss", "needs_critic",
    "group_index", "grpo", "kl_loss", "kl_penalty", "make_kl_controller", "masked_mean", "masked_whiten",
    "place_outcome_reward", "ppo_policy_loss", "register_adv_est", "register_policy_loss",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "uses_groups", "value_loss",
]
