"""agg_loss, PPO policy loss, value loss and entropy against hand-computed values."""

import math

import pytest
import torch

from agent_rl.config import ActorConfig
from agent_rl.training.algos import (
    agg_loss,
    agg_normalizers,
    entropy_from_logits,
    entropy_loss,
    entropy_mask,
    get_policy_loss,
    ppo_policy_loss,
    rft_loss,
    value_loss,
)

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


# ----------------------------------------------------------------------------- agg_loss
def test_agg_loss_hand_values():
    loss = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 5 + 6 + 7 + 8) / 6)
    # rows: (1+2)/2 = 1.5 and (5+6+7+8)/4 = 6.5 -> mean 4.0
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(4.0)
    # rows: 3 and 26 -> mean 14.5
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(14.5)
    with pytest.raises(ValueError, match="known: \\['token-mean'"):
        agg_loss(loss, mask, "token-sum")


def test_agg_loss_empty_rows_and_all_masked():
    loss = torch.tensor([[1.0, 2.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    # the empty row is not a sequence: (1+2)/2 over 1 row
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert agg_normalizers(mask) == (2, 1)
    for mode in MODES:
        assert agg_loss(loss, torch.zeros(2, 2), mode).item() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_normalizers_equal_whole_batch(mode):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 7, generator=gen) > 0.4).long()
    mask[2] = 0  # an empty row in the middle micro-batch
    base = torch.randn(6, 7, generator=gen)
    whole = base.clone().requires_grad_(True)
    full = agg_loss(whole * whole, mask, mode)
    full.backward()

    parts = base.clone().requires_grad_(True)
    tokens, seqs = agg_normalizers(mask)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        x = parts[sl]
        part = agg_loss(x * x, mask[sl], mode, global_tokens=tokens, global_seqs=seqs)
        part.backward()  # gradient accumulation: no division by the number of micro-batches
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-6)
    assert torch.allclose(parts.grad, whole.grad, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_data_parallel_recipe_normalisers_divided_by_w_equal_whole_batch(mode):
    """The module doc's data-parallel recipe: each of W workers aggregates with the whole
    batch's normalisers divided by W, DDP averages the gradients. With one sequence over
    W = 4 workers, seqs / W = 0.25 must not be clamped to 1 (that made the loss W/S = 4x too
    small); only a normaliser of 0 becomes 1."""
    gen = torch.Generator().manual_seed(1)
    W = 4
    mask = torch.zeros(4, 5, dtype=torch.long)
    mask[1, :3] = 1  # one sequence, on worker 1; the other workers hold empty rows
    base = torch.randn(4, 5, generator=gen)
    whole = base.clone().requires_grad_(True)
    agg_loss(whole * whole, mask, mode).backward()

    tokens, seqs = agg_normalizers(mask)
    grads = []
    for w in range(W):
        x = base[w:w + 1].clone().requires_grad_(True)
        agg_loss(x * x, mask[w:w + 1], mode, global_tokens=tokens / W, global_seqs=seqs / W).backward()
        grads.append(x.grad)
    averaged = torch.cat(grads) / W  # DDP's all-reduce mean, row by row
    assert torch.allclose(averaged, whole.grad, atol=1e-6)
    assert averaged.abs().sum() > 0


# ----------------------------------------------------------------------------- policy loss
def cfg(**kw):
    return ActorConfig(**kw)


def test_ratio_one_gives_plain_policy_gradient():
    adv = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -4.0, -1.2]], requires_grad=True)
    loss, metrics = ppo_policy_loss(logp, logp.detach().clone(), adv, mask, cfg())
    # token-mean of -A over the 5 sampled tokens: -(1 - 2 + 0.5 + 3 - 1) / 5 = -0.3
    assert loss.item() == pytest.approx(-0.3)
    loss.backward()
    # d ratio / d logp = ratio = 1, so the gradient is -A / N on sampled tokens, 0 elsewhere
    assert torch.allclose(logp.grad, -adv * mask / 5)
    assert metrics["pg_clipfrac"] == 0 and metrics["ppo_kl"] == 0 and metrics["pg_clipfrac_lower"] == 0


def constructed_ratios():
    r = torch.tensor([1.5, 1.1, 0.7, 0.9, 0.5, 1.0, 1.25, 5.0, 50.0])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0, 1.0])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0])  # the last token (ratio 50) is masked
    old = torch.full((9,), -1.0)
    logp = (old + r.log())[None].clone().requires_grad_(True)
    return logp, old[None], adv[None], mask[None], r


def test_clip_fractions_both_sides_clip_higher_and_dual_clip():
    logp, old, adv, mask, r = constructed_ratios()
    c = cfg(clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    loss, m = ppo_policy_loss(logp, old, adv, mask, c)
    # per token (eps_low 0.2, eps_high 0.28, c 3):
    # t0 r1.5 A+  -> clipped at 1.28: -1.28      t4 r0.5 A- -> clipped at 0.8: 0.8
    # t1 r1.1 A+  -> -1.1                        t5 r1.0 A- -> 1.0
    # t2 r0.7 A+  -> max(-0.7, -0.8) = -0.7      t6 r1.25 A+ -> under 1.28: -1.25
    # t3 r0.9 A-  -> 0.9                         t7 r5 A- -> max(5, 1.2) = 5, dual-clip min(5, 3) = 3
    assert loss.item() == pytest.approx((-1.28 - 1.1 - 0.7 + 0.9 + 0.8 + 1.0 - 1.25 + 3.0) / 8)
    assert m["pg_clipfrac"] == pytest.approx(2 / 8)  # t0, t4
    assert m["pg_clipfrac_ratio_high"] == pytest.approx(1 / 8)  # t0
    assert m["pg_clipfrac_ratio_low"] == pytest.approx(1 / 8)  # t4
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 8)  # t7
    assert m["ppo_kl"] == pytest.approx(-sum(math.log(x) for x in r[:8].tolist()) / 8, rel=1e-5)
    loss.backward()
    # clipped tokens (t0, t4, t7) and the masked one get no gradient; others -A*r/N
    expected = torch.where(torch.tensor([0, 1, 1, 1, 0, 1, 1, 0, 0]).bool(), -adv[0] * r / 8, torch.zeros(9))
    assert torch.allclose(logp.grad[0], expected, atol=1e-6)


def test_symmetric_clip_defaults_to_clip_ratio():
    logp, old, adv, mask, _ = constructed_ratios()
    _, m = ppo_policy_loss(logp, old, adv, mask, cfg(clip_ratio=0.2))
    # with eps_high = 0.2 the ratio 1.25 (t6) is clipped too
    assert m["pg_clipfrac_ratio_high"] == pytest.approx(2 / 8)


def test_dual_clip_bound_and_validation():
    adv = torch.tensor([[-2.0]])
    old = torch.tensor([[-5.0]])
    logp = torch.tensor([[-5.0 + math.log(100.0)]], requires_grad=True)  # ratio 100
    loss, m = ppo_policy_loss(logp, old, adv, torch.ones(1, 1), cfg(clip_ratio_c=3.0))
    assert loss.item() == pytest.approx(6.0)  # -A * c = 2 * 3, instead of 2 * 100
    loss.backward()
    assert logp.grad.item() == 0.0 and m["pg_clipfrac_lower"] == 1.0
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_policy_loss(logp, old, adv, torch.ones(1, 1), cfg(clip_ratio_c=1.0))


def test_truncated_importance_sampling_weights_are_capped():
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logp.detach().clone()
    # old - rollout = log 3, log 0.5, 0 -> weights min(3, 2) = 2, 0.5, 1
    rollout = old - torch.tensor([[math.log(3.0), math.log(0.5), 0.0]])
    loss, m = ppo_policy_loss(logp, old, adv, torch.ones(1, 3), cfg(tis_cap=2.0), rollout_logp=rollout)
    assert loss.item() == pytest.approx(-(2 * 1 + 0.5 * 1 - 1 * 1) / 3)
    assert m["tis_capfrac"] == pytest.approx(1 / 3)
    assert m["tis_weight_mean"] == pytest.approx((2 + 0.5 + 1) / 3)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -0.5, 1.0]]) / 3)
    # tis off: the rollout logprobs are ignored
    off, _ = ppo_policy_loss(logp, old, adv, torch.ones(1, 3), cfg(), rollout_logp=rollout)
    assert off.item() == pytest.approx(-(1 + 1 - 1) / 3)
    with pytest.raises(ValueError, match="rollout_logp"):
        ppo_policy_loss(logp, old, adv, torch.ones(1, 3), cfg(tis_cap=2.0))


@pytest.mark.parametrize("mode", MODES)
def test_masked_positions_change_neither_loss_nor_gradient(mode):
    gen = torch.Generator().manual_seed(4)
    B, T = 4, 6
    mask = (torch.rand(B, T, generator=gen) > 0.4).long()
    mask[:, 0] = 1
    logp0 = -torch.rand(B, T, generator=gen) * 3
    old = logp0 + 0.3 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, T, generator=gen)
    rollout = old + 0.1 * torch.randn(B, T, generator=gen)
    c = cfg(loss_agg_mode=mode, clip_ratio_high=0.28, tis_cap=2.0)

    def run(old, adv, rollout, logp_base):
        logp = logp_base.clone().requires_grad_(True)
        loss, metrics = ppo_policy_loss(logp, old, adv, mask, c, rollout_logp=rollout)
        loss.backward()
        return loss.item(), logp.grad, metrics

    l1, g1, m1 = run(old, adv, rollout, logp0)
    hole = ~mask.bool()
    junk = torch.where(hole, torch.tensor(float("nan")), 0.0)
    logp_other = torch.where(hole, logp0 - 7.0, logp0)
    l2, g2, m2 = run(old + junk, torch.where(hole, float("inf"), adv), rollout + junk, logp_other)
    assert l1 == pytest.approx(l2, rel=1e-6) and m1 == pytest.approx(m2)
    assert torch.allclose(g1, g2) and torch.all(g2[hole] == 0)


def test_policy_loss_registry():
    assert get_policy_loss(ActorConfig().policy_loss) is ppo_policy_loss
    assert get_policy_loss("rft") is rft_loss
    with pytest.raises(ValueError, match=r"unknown policy loss 'grpo'; known: \['rft', 'vanilla'\]"):
        get_policy_loss("grpo")


# ----------------------------------------------------------------------------- rft
def rft_batch():
    """2 groups x 3 samples: keep weights (rows 0, 3, 4 kept), a mask with an observation gap
    (row 0, position 2: -inf there must not leak) and padding, hand-picked log-probs."""
    inf = float("inf")
    logp = torch.tensor([[-0.5, -1.0, -inf, -1.5],
                         [-2.0, -0.1, -0.3, 0.0],
                         [-0.7, 0.0, 0.0, 0.0],
                         [-0.2, -0.4, -0.6, -0.8],
                         [-1.0, -3.0, -5.0, 0.0],
                         [-0.9, -7.0, -1.1, -1.3]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 1]])
    keep = torch.tensor([1.0, 0, 0, 1, 1, 0])[:, None] * mask
    return logp, mask, keep


def test_rft_loss_hand_values():
    """The NLL of the kept rows' sampled tokens, summed, over every sampled token of the batch:
    kept NLL 0.5+1.0+1.5 (row 0) + 0.2+0.4+0.6+0.8 (row 3) + 1.0+3.0 (row 4) = 9.0 on 9 kept
    tokens; 3+3+1+4+2+3 = 16 sampled tokens in all."""
    logp, mask, keep = rft_batch()
    old = torch.full_like(logp, -50.0)  # not read: no ratio
    loss, metrics = rft_loss(logp, old, keep, mask, cfg(tis_cap=2.0), rollout_logp=old)
    assert loss.item() == pytest.approx(9.0 / 16)
    assert metrics == pytest.approx({"pg_loss": 9.0 / 16, "rft_nll": 9.0 / 9})
    loss.backward()
    # d loss / d logp = -w / N: -1/16 on the kept sampled tokens, 0 on the rest (-inf included)
    assert torch.allclose(logp.grad, -keep / 16) and torch.isfinite(logp.grad).all()
    # seq-mean-token-mean: kept rows' means 3.0/3, 2.0/4, 4.0/2 over the 6 rows
    loss, _ = rft_loss(logp, old, keep, mask, cfg(loss_agg_mode="seq-mean-token-mean"))
    assert loss.item() == pytest.approx((1.0 + 0.5 + 2.0) / 6)
    # the mini-batch's normalisers (gradient accumulation) replace the batch's own
    loss, _ = rft_loss(logp, old, keep, mask, cfg(), global_tokens=32)
    assert loss.item() == pytest.approx(9.0 / 32)
    # nothing kept: 0, not NaN
    loss, metrics = rft_loss(logp, old, torch.zeros_like(keep), mask, cfg())
    assert loss.item() == 0.0 and metrics["rft_nll"] == 0.0


# ----------------------------------------------------------------------------- value loss
def test_value_loss_clipping_hand_values():
    values = torch.tensor([[1.0, 2.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = value_loss(values, old, returns, mask, cliprange_value=0.2)
    # t0: V 1.0 -> clipped 0.7: max((1-0)^2, 0.7^2) = 1
    # t1: V 2.0 -> clipped 0.7: max(0, (0.7-2)^2 = 1.69) = 1.69   (clipped term wins)
    # t2: V 0 = V_old: max(1, 1) = 1
    assert loss.item() == pytest.approx(0.5 * (1 + 1.69 + 1) / 3)
    assert m["vf_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    # d/dV 0.5*(V-R)^2/3 = (V-R)/3: t0 -> 1/3, t1 clipped -> 0, t2 -> -1/3, masked t3 -> 0
    assert torch.allclose(values.grad, torch.tensor([[1 / 3, 0.0, -1 / 3, 0.0]]))


# ----------------------------------------------------------------------------- entropy
def test_entropy_hand_values_and_chunking():
    logits = torch.zeros(1, 2, 4)
    logits[0, 1] = torch.tensor([100.0, 0.0, 0.0, 0.0])  # nearly deterministic
    ent = entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4))
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)

    gen = torch.Generator().manual_seed(5)
    z = torch.randn(3, 5, 11, generator=gen)
    ref = torch.distributions.Categorical(logits=z).entropy()
    z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    chunked = entropy_from_logits(z1, chunk_size=4)  # 15 rows in chunks of 4, checkpointed
    assert torch.allclose(chunked, ref, atol=1e-5)
    torch.distributions.Categorical(logits=z2).entropy().sum().backward()
    chunked.sum().backward()
    assert torch.allclose(z1.grad, z2.grad, atol=1e-5)


def test_entropy_loss_uses_the_mask():
    logits = torch.zeros(1, 3, 4)
    logits[0, 2] = torch.tensor([100.0, 0, 0, 0])
    ent, m = entropy_loss(logits, torch.tensor([[1, 1, 0]]))
    assert ent.item() == pytest.approx(math.log(4)) and m["entropy"] == pytest.approx(math.log(4))


# ----------------------------------------------------------------------------- forking tokens
def test_entropy_mask_keeps_each_rows_top_quantile_of_sampled_tokens():
    """TRL's rule (torch's linear quantile at 1 - q, ties kept), per row. Hand values:
    row 0 sampled entropies 0.1 0.9 0.5 0.3 0.7 (5.0 is an observation token): the 0.6
      quantile sits at position 0.6 * 4 = 2.4 of the sorted 0.1 0.3 0.5 0.7 0.9, i.e.
      0.5 + 0.4 * 0.2 = 0.58, so 0.9 and 0.7 are kept, and never the observation;
    row 1 entropies all below row 0's: its own top two (0.04, 0.05) are kept (per row, not
      over the batch, where row 0's threshold would keep none of them);
    row 2 ties: the threshold equals them, every token is kept; row 3 nothing sampled."""
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.3, 5.0, 0.7],
                        [0.01, 0.05, 0.02, 0.04, 0.03, 0.0],
                        [0.2, 0.2, 0.2, 0.0, 0.0, 0.0],
                        [1.0, 2.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    keep = entropy_mask(ent, mask, 0.4)
    assert keep.tolist() == [[False, True, False, False, False, True],
                             [False, True, False, True, False, False],
                             [True, True, True, False, False, False],
                             [False] * 6]
    # q = 0.2 on 5 tokens: the 0.8 quantile is at position 3.2, between the top two: only the top one
    assert entropy_mask(ent, mask, 0.2)[0].tolist() == [False, True, False, False, False, False]
    # q = 1 keeps every sampled token, and only those
    assert torch.equal(entropy_mask(ent, mask, 1.0), mask.bool())
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"entropy_mask: quantile must be in \(0, 1\]"):
            entropy_mask(ent, mask, bad)
