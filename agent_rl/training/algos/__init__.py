"""RL algorithms as pure functions on tensors, registered by name (torch + stdlib only).

- advantage estimators: `get_adv_estimator(algorithm.adv_estimator)` -> grpo, rloo,
  reinforce_plus_plus, reinforce_plus_plus_baseline, gae, rejection_sampling (RFT's keep
  weights); `place_outcome_reward`; `outcome_of`, `policy_loss_for` (what each declares)
- policy losses: `get_policy_loss(name)` -> vanilla (PPO clip / clip-higher / dual-clip / TIS),
  rft (NLL of the kept trajectories); `value_loss`, `entropy_loss`, `agg_loss` (+
  `agg_normalizers` for gradient accumulation); `entropy_mask` (the forking tokens)
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
    rejection_sampling,
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
    entropy_mask,
    ppo_policy_loss,
    rft_loss,
    value_loss,
)
from agent_rl.training.algos.masked import masked_mean, masked_whiten
from agent_rl.training.algos.registry import (
    ADV_ESTIMATORS,
    OUTCOMES,
    POLICY_LOSSES,
    check_kl_in_reward,
    flat_groups_carry_signal,
    get_adv_estimator,
    get_policy_loss,
    needs_critic,
    outcome_of,
    policy_loss_for,
    register_adv_est,
    register_policy_loss,
    uses_groups,
)

__all__ = [
    "ADV_ESTIMATORS", "AGG_MODES", "KL_KINDS", "OUTCOMES", "POLICY_LOSSES", "AdaptiveKLController", "FixedKLController",
    "GroupFilterResult", "agg_loss", "agg_normalizers", "apply_kl_penalty", "check_kl_in_reward", "compute_gae",
    "discounted_returns", "entropy_from_logits", "entropy_loss", "entropy_mask", "filter_groups",
    "flat_groups_carry_signal", "gae",
    "get_adv_estimator", "get_policy_loss", "needs_critic",
    "group_index", "grpo", "kl_loss", "kl_penalty", "make_kl_controller", "masked_mean", "masked_whiten",
    "outcome_of", "place_outcome_reward", "policy_loss_for", "ppo_policy_loss", "register_adv_est",
    "register_policy_loss", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rejection_sampling",
    "rft_loss", "rloo", "uses_groups", "value_loss",
]
