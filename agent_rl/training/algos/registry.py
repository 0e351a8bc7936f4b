"""Name -> function registries for advantage estimators and policy losses.

The trainer looks functions up by the name in its config (`algorithm.adv_estimator`,
`actor.policy_loss`) so it never branches on a loss or estimator type itself (veRL's
`register_adv_est` idea, without the enum). An unknown name fails with the list of known ones.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """A named table of functions, filled by a decorator at import time."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, Callable] = {}
        self._info: dict[str, dict] = {}

    def register(self, name: str, **info: object) -> Callable[[F], F]:
        """`info`: facts the caller declares with the function (e.g. needs_critic=True)."""
        def decorator(fn: F) -> F:
            if name in self._fns and self._fns[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._fns[name].__qualname__})")
            self._fns[name] = fn
            self._info[name] = dict(info)
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        try:
            return self._fns[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self._fns)}") from None

    def info(self, name: str) -> dict:
        self.get(name)  # the same error for an unknown name
        return self._info[name]

    def names(self) -> list[str]:
        return sorted(self._fns)


ADV_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")


OUTCOMES = ("score", "acc")
"""What an estimator is given as each trajectory's outcome: the reward (format terms and search
cost included) or the task metric alone (reward.kind's EM / subEM / F1 of the answer), the
names of `algorithm.filter_metric`."""


def register_adv_est(name: str, needs_critic: bool = False, uses_groups: bool = False, outcome: str = "score",
                     policy_loss: str | None = None, accepts_kl_in_reward: bool = True,
                     flat_groups_carry_signal: bool = False) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under `name` (`algorithm.adv_estimator`);
    `needs_critic`: it takes value estimates, so the trainer builds a critic for it;
    `uses_groups`: a sample's advantage depends on its group-mates (GRPO, RLOO), so a group
    that loses a member must be left out whole; `outcome`: what the trainer places as its token
    rewards, "score" or "acc" (`OUTCOMES`); `policy_loss`: the loss its output is made for,
    which the actor then trains with instead of actor.policy_loss (`policy_loss_for`), so one
    setting selects the method (rejection_sampling: weights for rft's NLL, not advantages);
    `accepts_kl_in_reward`: False when its outcome must reach it unchanged, so
    algorithm.use_kl_in_reward is refused at load (`check_kl_in_reward`); `flat_groups_carry_signal`:
    a group whose samples all agree still teaches something (no group baseline), so dynamic
    sampling (algorithm.filter_groups) must not drop it (`flat_groups_carry_signal`)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"register_adv_est({name!r}): outcome must be one of {OUTCOMES}, got {outcome!r}")
    return ADV_ESTIMATORS.register(name, needs_critic=needs_critic, uses_groups=uses_groups, outcome=outcome,
                                   policy_loss=policy_loss, accepts_kl_in_reward=accepts_kl_in_reward,
                                   flat_groups_carry_signal=flat_groups_carry_signal)


def outcome_of(name: str) -> str:
    """What the estimator registered as `name` reads as the outcome: "score" or "acc"."""
    return str(ADV_ESTIMATORS.info(name)["outcome"])


def policy_loss_for(adv_estimator: str, configured: str, default: str = "vanilla") -> str:
    """The policy loss a run trains with: the one `adv_estimator` was registered with, else
    `configured` (actor.policy_loss). An estimator's loss replaces the default (`default`,
    actor.policy_loss's); any other configured loss is a conflict, refused by name."""
    declared = ADV_ESTIMATORS.info(adv_estimator)["policy_loss"]
    if declared is None or configured == declared:
        return configured
    if configured != default:
        raise ValueError(f"algorithm.adv_estimator={adv_estimator} trains with policy loss {declared!r}; "
                         f"actor_rollout_ref.actor.policy_loss={configured!r} conflicts with it")
    return declared


def uses_groups(name: str) -> bool:
    """Whether the estimator registered as `name` compares samples within a group."""
    return bool(ADV_ESTIMATORS.info(name)["uses_groups"])


def needs_critic(name: str) -> bool:
    """Whether the estimator registered as `name` uses a critic's values (e.g. GAE)."""
    return bool(ADV_ESTIMATORS.info(name)["needs_critic"])


def flat_groups_carry_signal(name: str) -> bool:
    """Whether a group whose samples agree still carries signal under the estimator registered
    as `name` (rejection_sampling: an all-right group is all kept samples), so the group filter,
    whose reason is "advantage 0 under a group baseline", must keep it."""
    return bool(ADV_ESTIMATORS.info(name).get("flat_groups_carry_signal", False))


def check_kl_in_reward(adv_estimator: str, use_kl_in_reward: bool) -> None:
    """ValueError when algorithm.use_kl_in_reward is on for an estimator registered with
    accepts_kl_in_reward=False: the penalty, subtracted from the outcome it thresholds, would
    drop right answers (a positive KL) or keep wrong ones (a negative per-token estimate)."""
    if use_kl_in_reward and not ADV_ESTIMATORS.info(adv_estimator).get("accepts_kl_in_reward", True):
        raise ValueError(f"algorithm.use_kl_in_reward=true does not apply to algorithm.adv_estimator={adv_estimator}: "
                         f"it reads the {outcome_of(adv_estimator)} outcome unchanged (a KL penalty subtracted from it "
                         "would drop right answers or keep wrong ones); set algorithm.use_kl_in_reward=false "
                         "(actor_rollout_ref.actor.use_kl_loss keeps the policy near the reference instead)")


def get_adv_estimator(name: str) -> Callable:
    """The estimator registered as `name`; ValueError listing the known names otherwise."""
    return ADV_ESTIMATORS.get(name)


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name`."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name`; ValueError listing the known names otherwise."""
    return POLICY_LOSSES.get(name)


def cfg_get(cfg: object, name: str, default):
    """`cfg.name`, or `default` when cfg is None / lacks the field (configs are duck-typed here
    so this package does not import `agent_rl.config` and its YAML dependency)."""
    value = getattr(cfg, name, None) if cfg is not None else None
    return default if value is None else value
