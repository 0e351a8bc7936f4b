"""KL estimators, KL loss / in-reward penalty, and KL controllers."""

import math

import pytest
import torch

from agent_rl.config import KLCtrlConfig
from agent_rl.training.algos import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)


def test_estimators_hand_values():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    d = math.log(2)  # logp - ref
    assert kl_penalty(logp, ref, "kl").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(d)
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "mse").item() == pytest.approx(0.5 * d * d)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 + d - 1)
    for alias, name in (("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")):
        assert kl_penalty(logp, ref, alias).item() == kl_penalty(logp, ref, name).item()
    with pytest.raises(ValueError, match="unknown KL estimator 'full'"):
        kl_penalty(logp, ref, "full")


def test_k3_nonnegative_clamped_and_gradient_analytic():
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(200, generator=gen) * 3).requires_grad_(True)
    ref = torch.randn(200, generator=gen) * 3
    k3 = kl_penalty(logp, ref, "low_var_kl")
    assert (k3 >= 0).all() and (k3 <= 10).all()
    k3.sum().backward()
    # d/dlogp [exp(ref-logp) - (ref-logp) - 1] = 1 - exp(ref - logp), where not clamped at 10
    inside = k3.detach() < 10
    analytic = 1 - torch.exp(ref - logp.detach())
    assert torch.allclose(logp.grad[inside], analytic[inside], atol=1e-5)
    assert torch.all(logp.grad[~inside] == 0)
    assert inside.sum() > 100 and (~inside).sum() > 0  # both regimes exercised


def test_kl_loss_is_masked_like_the_loss():
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    logp0, ref = -torch.rand(2, 4, generator=gen), -torch.rand(2, 4, generator=gen)
    logp = logp0.clone().requires_grad_(True)
    loss, m = kl_loss(logp, ref, mask, "low_var_kl", "seq-mean-token-mean")
    expected = agg_loss(kl_penalty(logp0, ref, "low_var_kl"), mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(expected.item()) and m["kl_loss"] == pytest.approx(expected.item())
    loss.backward()
    hole = mask == 0
    logp2 = logp0.clone().requires_grad_(True)
    loss2, _ = kl_loss(logp2, torch.where(hole, float("nan"), ref), mask, "low_var_kl", "seq-mean-token-mean")
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item())
    assert torch.allclose(logp.grad, logp2.grad) and torch.all(logp2.grad[hole] == 0)


def test_apply_kl_penalty_hand_values():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    ref = torch.zeros(1, 3)
    logp = torch.tensor([[0.1, 0.2, 0.3]])  # k1 = logp - ref
    out, m = apply_kl_penalty(rewards, logp, ref, torch.tensor([[1, 0, 1]]), coef=0.5, kind="kl")
    # sampled tokens get r - 0.5 * kl; the observation token (mask 0) is untouched
    assert torch.allclose(out, torch.tensor([[-0.05, 0.0, 1.0 - 0.15]]))
    assert m["kl"] == pytest.approx(0.2)  # mean of 0.1 and 0.3
    assert m["kl_coef"] == 0.5


def test_adaptive_controller_update_rule():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)
    # error = clip(9/6 - 1 = 0.5, -0.2, 0.2) = 0.2 -> 0.1 * (1 + 0.2 * 256 / 10000)
    assert ctl.value == pytest.approx(0.100512)
    ctl.update(current_kl=6.6, n_steps=1000)
    # error = 0.1 (inside the clip) -> * (1 + 0.1 * 0.1)
    assert ctl.value == pytest.approx(0.100512 * 1.01)
    ctl.update(current_kl=0.0, n_steps=1000)
    # error = clip(-1) = -0.2 -> * (1 - 0.02)
    assert ctl.value == pytest.approx(0.100512 * 1.01 * 0.98)
    restored = AdaptiveKLController(0.1, 6.0, 10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_fixed_controller_and_factory():
    fixed = make_kl_controller(KLCtrlConfig(type="fixed", kl_coef=0.01))
    assert isinstance(fixed, FixedKLController)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.01
    adaptive = make_kl_controller(KLCtrlConfig(type="adaptive", kl_coef=0.2, target_kl=1.0, horizon=50))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="kl_ctrl.type"):
        make_kl_controller(KLCtrlConfig(type="pid"))
