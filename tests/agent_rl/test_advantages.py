"""Advantage estimators against hand-computed values and slow reference loops."""

import math

import pytest
import torch

from agent_rl.config import AlgorithmConfig
from agent_rl.training.algos import (
    ADV_ESTIMATORS,
    compute_gae,
    discounted_returns,
    get_adv_estimator,
    place_outcome_reward,
    register_adv_est,
)


def outcome(scores, T=4):
    """Rows with every token sampled and the score on the last one."""
    mask = torch.ones(len(scores), T)
    return place_outcome_reward(torch.tensor(scores, dtype=torch.float32), mask), mask


# ----------------------------------------------------------------------------- placement
def test_place_outcome_reward_on_last_sampled_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 1]])
    r = place_outcome_reward(torch.tensor([1.0, 2.0, 3.0]), mask)
    expected = torch.tensor([[0, 1.0, 0, 0], [0, 0, 2.0, 0], [0, 0, 0, 3.0]])
    assert torch.equal(r, expected)


def test_place_outcome_reward_rejects_row_without_sampled_token():
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        place_outcome_reward(torch.tensor([1.0, 2.0]), torch.tensor([[1, 0], [0, 0]]))


# ----------------------------------------------------------------------------- GRPO
def test_grpo_hand_values_zero_mean_unit_std():
    r, mask = outcome([1, 0, 0, 1, 1, 0])
    adv, ret = get_adv_estimator("grpo")(r, mask, [0, 0, 0, 1, 1, 1], None, AlgorithmConfig())
    # group [1,0,0]: mean 1/3, unbiased std sqrt(((2/3)^2 + 2*(1/3)^2)/2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    a = torch.tensor([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, (1 / 3) / s, (1 / 3) / s, -(2 / 3) / s])
    assert torch.allclose(adv[:, 0], a, atol=1e-5)
    assert torch.allclose(adv, a[:, None].expand(6, 4), atol=1e-5)  # same on every sampled token
    for g in (slice(0, 3), slice(3, 6)):
        assert abs(adv[g, 0].mean().item()) < 1e-6
        assert abs(adv[g, 0].std().item() - 1.0) < 1e-4
    assert torch.equal(ret, adv)


def test_dr_grpo_no_std():
    r, mask = outcome([1, 0, 0])
    adv, _ = get_adv_estimator("grpo")(r, mask, [7, 7, 7], None, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    # s - mean = [1 - 1/3, -1/3, -1/3]
    assert torch.allclose(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3]), atol=1e-6)


def test_grpo_singleton_and_unanimous_groups_get_zero():
    r, mask = outcome([5.0, 1.0, 1.0, 0.3])
    adv, _ = get_adv_estimator("grpo")(r, mask, ["solo", "same", "same", "other"], None, None)
    # "solo" and "other" have one member, "same" has std 0: no signal anywhere, and no NaN.
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize("value", [0.2, 0.1, 1 / 3, 0.7])
def test_a_group_of_equal_rewards_gets_exactly_zero(name, value):
    """Eight rewards of 0.2 (Search-R1's score for a well-formed wrong answer): float32's mean is
    one ulp off, and over a std of ~1e-8 GRPO gave each -0.0147 (veRL's code shares the
    rounding). A flat group must carry no signal, so the zero-advantage skip sees it."""
    r, mask = outcome([value] * 8 + [1.0, 0.0, 0.0, 0.0])
    groups = [0] * 8 + [1] * 4
    adv, _ = get_adv_estimator(name)(r, mask, groups, None, AlgorithmConfig())
    assert torch.equal(adv[:8], torch.zeros(8, 4))
    assert (adv[8:, 0] != 0).all()  # the mixed group still carries its signal


def test_group_ids_as_tensor_list_or_strings_agree():
    r, mask = outcome([1, 0, 2, 2, 0, 1])
    fn = get_adv_estimator("grpo")
    a1, _ = fn(r, mask, torch.tensor([3, 3, 9, 9, 3, 9]), None, None)
    a2, _ = fn(r, mask, ["x", "x", "y", "y", "x", "y"], None, None)
    assert torch.equal(a1, a2)
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        fn(r, mask, [0, 1], None, None)
    with pytest.raises(ValueError, match="needs group_ids"):
        fn(r, mask, None, None, None)


# ----------------------------------------------------------------------------- RLOO
def test_rloo_hand_values():
    r, mask = outcome([1, 0, 0, 4])
    adv, _ = get_adv_estimator("rloo")(r, mask, [0, 0, 0, 1], None, None)
    # 1 - mean(0,0) = 1; 0 - mean(1,0) = -0.5 (twice); singleton group -> 0
    assert torch.allclose(adv[:, 0], torch.tensor([1.0, -0.5, -0.5, 0.0]))


# ----------------------------------------------------------------------------- REINFORCE++
def test_reinforce_plus_plus_hand_values_with_observation_gap():
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    r = place_outcome_reward(torch.tensor([1.0, 2.0]), mask)
    adv, ret = get_adv_estimator("reinforce_plus_plus")(r, mask, None, None, AlgorithmConfig(gamma=0.5))
    # row 0: G3 = 1, G1 = 0 + 0.5*G3 = 0.5 (t=2 is an observation: no discount), G0 = 0.25
    # row 1: G2 = 2, G1 = 1, G0 = 0.5
    expected_ret = torch.tensor([[0.25, 0.5, 0, 1.0], [0.5, 1.0, 2.0, 0]])
    assert torch.allclose(ret, expected_ret)
    # whitening over the 6 sampled returns: mean 5.25/6 = 0.875,
    # unbiased var = (0.625^2 + 0.375^2 + 0.125^2 + 0.375^2 + 0.125^2 + 1.125^2) / 5 = 1.96875 / 5
    std = math.sqrt(1.96875 / 5 + 1e-8)
    expected = torch.tensor([[-0.625, -0.375, 0, 0.125], [-0.375, 0.125, 1.125, 0]]) / std
    assert torch.allclose(adv, expected, atol=1e-6)


def test_reinforce_plus_plus_baseline_hand_values():
    r, mask = outcome([1, 0, 3, 3], T=2)
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(r, mask, [0, 0, 1, 1], None, None)
    # centred: [0.5, -0.5, 0, 0] on 2 tokens each -> 8 values, mean 0,
    # unbiased var = 4 * 0.25 / 7 -> whitened = centred / sqrt(1/7)
    k = 1 / math.sqrt(1 / 7 + 1e-8)
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0])[:, None].expand(4, 2) * k
    assert torch.allclose(adv, expected, atol=1e-6)


def slow_returns(rewards, mask, gamma):
    out = [[0.0] * len(rewards[0]) for _ in rewards]
    for i, (rr, mm) in enumerate(zip(rewards, mask)):
        g = 0.0
        for t in reversed([t for t, x in enumerate(mm) if x]):
            g = rr[t] + gamma * g
            out[i][t] = g
    return torch.tensor(out)


def test_discounted_returns_match_slow_loop():
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 11, generator=gen) > 0.3).long()
    rewards = torch.randn(5, 11, generator=gen)
    ref = slow_returns(rewards.tolist(), mask.tolist(), 0.9)
    assert torch.allclose(discounted_returns(rewards, mask, 0.9), ref, atol=1e-6)


# ----------------------------------------------------------------------------- GAE
def test_gae_hand_computation_with_observation_gap():
    # Sampled t0, t1, then a 2-token observation (t2, t3, garbage values), then sampled t4.
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.8]])
    rewards = torch.tensor([[0.0, 0.1, 7.0, 7.0, 1.0]])  # 7.0 at observation tokens must be ignored
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t4: delta = 1 + 0.9*0 - 0.8 = 0.2                  A4 = 0.2
    # t1: delta = 0.1 + 0.9*0.8 - 0.6 = 0.22            A1 = 0.22 + 0.9*0.8*0.2 = 0.364
    # t0: delta = 0 + 0.9*0.6 - 0.5 = 0.04              A0 = 0.04 + 0.72*0.364 = 0.30208
    expected = torch.tensor([[0.30208, 0.364, 0.0, 0.0, 0.2]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.80208, 0.964, 0.0, 0.0, 1.0]]), atol=1e-6)


def slow_gae(rewards, values, mask, gamma, lam):
    """Reference: run textbook GAE on the list of sampled tokens of each row."""
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    for i in range(B):
        idx = [t for t in range(T) if mask[i][t]]
        a_next, v_next = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i][t] + gamma * v_next - values[i][t]
            a_next = delta + gamma * lam * a_next
            v_next = values[i][t]
            adv[i][t] = a_next
    return torch.tensor(adv)


def test_gae_matches_slow_loop_on_random_masks():
    gen = torch.Generator().manual_seed(1)
    mask = (torch.rand(6, 13, generator=gen) > 0.35).long()
    mask[0] = 0
    mask[0, 5] = 1  # a row with a single sampled token
    rewards, values = torch.randn(6, 13, generator=gen), torch.randn(6, 13, generator=gen)
    adv, ret = compute_gae(rewards, values, mask, 0.95, 0.9)
    ref = slow_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.95, 0.9)
    assert torch.allclose(adv, ref, atol=1e-5)
    assert torch.allclose(ret, (ref + values) * mask, atol=1e-5)


def test_gae_estimator_whitens_advantages_and_needs_values():
    gen = torch.Generator().manual_seed(2)
    mask = (torch.rand(4, 9, generator=gen) > 0.3).long()
    rewards, values = torch.randn(4, 9, generator=gen), torch.randn(4, 9, generator=gen)
    adv, ret = get_adv_estimator("gae")(rewards, mask, None, values, AlgorithmConfig(gamma=1.0, lam=0.95))
    raw, raw_ret = compute_gae(rewards, values, mask, 1.0, 0.95)
    sel = mask.bool()
    assert abs(adv[sel].mean().item()) < 1e-5 and abs(adv[sel].std().item() - 1) < 1e-4
    assert torch.allclose(adv[sel], (raw[sel] - raw[sel].mean()) / raw[sel].std(), atol=1e-5)
    assert torch.equal(ret, raw_ret)
    with pytest.raises(ValueError, match="critic values"):
        get_adv_estimator("gae")(rewards, mask, None, None, None)


# ----------------------------------------------------------------------------- rejection sampling
def test_rejection_sampling_keeps_the_trajectories_that_reach_the_threshold():
    """Weight 1 on every sampled token of a row whose outcome (the task metric: the trainer
    places `acc` for this estimator) is at least rft_min_acc, 0 elsewhere; no baseline, so the
    groups do not matter and an all-correct group keeps all its members."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 1]])
    acc = place_outcome_reward(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), mask)
    fn = get_adv_estimator("rejection_sampling")
    w, ret = fn(acc, mask, [0, 0, 0, 1, 1, 1], None, AlgorithmConfig())
    expected = torch.tensor([[1.0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert torch.equal(w, expected) and torch.equal(ret, expected)
    assert torch.equal(fn(acc, mask, None, None, AlgorithmConfig())[0], expected)  # no group ids needed
    # a threshold for F1: 0.5 keeps 0.5 and 0.9, not 0.4; the default (1.0) only the exact match
    f1 = place_outcome_reward(torch.tensor([0.4, 0.5, 0.9, 1.0]), torch.ones(4, 2))
    assert fn(f1, torch.ones(4, 2), None, None, AlgorithmConfig(rft_min_acc=0.5))[0][:, 0].tolist() == [0, 1, 1, 1]
    assert fn(f1, torch.ones(4, 2), None, None, None)[0][:, 0].tolist() == [0, 0, 0, 1]


def test_rejection_sampling_declares_its_outcome_and_its_loss():
    from agent_rl.training.algos import outcome_of, policy_loss_for, uses_groups

    assert outcome_of("rejection_sampling") == "acc" and not uses_groups("rejection_sampling")
    assert all(outcome_of(n) == "score" for n in ("grpo", "rloo", "reinforce_plus_plus", "gae"))
    # one setting: the estimator brings its loss in place of the default; a loss chosen
    # otherwise is refused by name; estimators without one keep actor.policy_loss
    assert policy_loss_for("rejection_sampling", "vanilla") == "rft"
    assert policy_loss_for("rejection_sampling", "rft") == "rft"
    assert policy_loss_for("grpo", "vanilla") == "vanilla" and policy_loss_for("grpo", "rft") == "rft"
    with pytest.raises(ValueError, match="adv_estimator=rejection_sampling trains with policy loss 'rft'"):
        policy_loss_for("rejection_sampling", "my_loss")
    with pytest.raises(ValueError, match="outcome must be one of"):
        register_adv_est("bad_outcome", outcome="reward")


# ----------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae",
                                  "rejection_sampling"])
def test_masked_positions_are_ignored_and_zero(name):
    gen = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 8, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    rewards, values = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    groups = [0, 0, 0, 1, 1, 1]
    fn = get_adv_estimator(name)
    adv, ret = fn(rewards, mask, groups, values, AlgorithmConfig(gamma=0.9, lam=0.9))
    noisy = torch.where(mask.bool(), 0.0, 100.0 * torch.randn(6, 8, generator=gen))
    adv2, ret2 = fn(rewards + noisy, mask, groups, values + noisy, AlgorithmConfig(gamma=0.9, lam=0.9))
    assert torch.allclose(adv, adv2, atol=1e-6) and torch.allclose(ret, ret2, atol=1e-6)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert torch.isfinite(adv).all()


def test_registry_lists_known_names_and_rejects_duplicates():
    assert ADV_ESTIMATORS.names() == ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                      "rejection_sampling", "rloo"]
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; known: \['gae', 'grpo'"):
        get_adv_estimator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda *a: None)


def test_config_default_estimator_is_registered():
    assert get_adv_estimator(AlgorithmConfig().adv_estimator) is not None


def test_needs_critic_is_declared_at_registration():
    from agent_rl.training.algos import needs_critic

    assert needs_critic("gae") is True
    assert not any(needs_critic(n) for n in ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                             "rejection_sampling"))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        needs_critic("nope")
