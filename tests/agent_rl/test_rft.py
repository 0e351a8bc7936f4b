"""Rejection sampling fine-tuning (`algorithm.adv_estimator=rejection_sampling`) through the
trainer's own pieces: scoring (`score_trajectories`: reward and task metric), the trainer's
advantage step, the loss the estimator brings (`actor_settings`), and the actor's update on
`tiny_policy` (the 2-block copy of the embedded model test_actor.py trains).

The hand batch: 2 groups x 3 samples under the demo's format-aware reward. Rows 0, 3, 4 answer
right (row 3 in a malformed response: reward 0.8); rows 1 and 5 are well-formed and wrong, so
their reward (0.2, 0.3) is format only, and row 2 has no answer. Rejection sampling keeps 0, 3
and 4: a threshold on the reward would have kept 1 and 5 too.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from agent_rl.config import RewardConfig, TrainConfig
from agent_rl.training import algos
from agent_rl.training.batch import TokenBatch
from agent_rl.training.groups import score_trajectories
from agent_rl.training.metrics import batch_metrics
from agent_rl.training.trainer import RayTrainer, actor_settings
from agent_rl.types import Trajectory

RIGHT_SEARCHED = "<think>a</think><search>q</search><information>Paris it is</information><think>b</think><answer>Paris</answer>"
RESPONSES = [  # (reward_text, loss mask); group 0 = rows 0-2, group 1 = rows 3-5
    (RIGHT_SEARCHED, [1, 1, 0, 1]),
    ("<think>a</think><answer>Lyon</answer>", [1, 1, 1]),
    ("no answer at all", [1]),
    ("<answer>Paris</answer>", [1, 1, 1, 1]),
    (RIGHT_SEARCHED, [1, 1, 0]),
    ("<think>a</think><search>q</search><information>Paris it is</information><think>b</think><answer>Lyon</answer>",
     [1, 0, 1, 1]),
]
KEEP = [1.0, 0, 0, 1, 1, 0]
# the demo's reward (configs/train/demo_grpo_cpu.yaml): Search-R1 v0.3's format terms
DEMO_REWARD = RewardConfig(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)


def hand_trajectories(seed: int = 0, prompt_len: int = 6, extra: int = 0) -> list[Trajectory]:
    """The six rows above, scored by the real reward. Token ids are random (the reward reads
    `reward_text`); `extra` appends that many sampled tokens to every response, so a real model
    has something to train on."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (text, mask) in enumerate(RESPONSES):
        mask = mask + [1] * extra
        ids = torch.randint(3, 49000, (prompt_len + len(mask),), generator=g).tolist()
        out.append(Trajectory(prompt_ids=ids[:prompt_len], response_ids=ids[prompt_len:], loss_mask=mask,
                              rollout_logprobs=[-1.0 * m for m in mask], group_id=i // 3, reward_text=text,
                              golden_answers=["Paris"]))
    score_trajectories(out, [], DEMO_REWARD)
    return out


def rft_config() -> TrainConfig:
    cfg = TrainConfig()
    cfg.algorithm.adv_estimator = "rejection_sampling"  # the one setting
    cfg.reward = DEMO_REWARD
    return cfg


def trainer_advantages(cfg: TrainConfig, batch: TokenBatch) -> TokenBatch:
    """The trainer's advantage step (`RayTrainer._advantages`) on a trainer without workers:
    the estimator and KL controller its __init__ makes."""
    stub = SimpleNamespace(cfg=cfg, adv_fn=algos.get_adv_estimator(cfg.algorithm.adv_estimator),
                           kl_ctrl=algos.make_kl_controller(cfg.algorithm.kl_ctrl))
    batch, _ = RayTrainer._advantages(stub, batch, batch.mask(True))
    return batch


def test_rft_on_a_hand_computed_batch():
    """Reward and metric from the real scorer, keep weights from the trainer's advantage step,
    the loss the estimator brings, on log-probs written out: the kept rows' NLL
    (0.5 + 1.0 + 1.5) + (0.2 + 0.4 + 0.6 + 0.8) + (1.0 + 3.0) = 9.0 over the batch's
    3 + 3 + 1 + 4 + 2 + 3 = 16 sampled tokens."""
    cfg = rft_config()
    batch = TokenBatch.from_trajectories(hand_trajectories())
    assert batch.rewards.tolist() == pytest.approx([1.0, 0.2, 0.0, 0.8, 1.0, 0.3])
    assert batch.acc.tolist() == [1.0, 0, 0, 1, 1, 0]
    batch = trainer_advantages(cfg, batch)
    mask = batch.mask(True)
    keep = torch.tensor(KEEP)[:, None] * mask
    assert torch.equal(batch.advantages, keep)
    assert batch_metrics(batch, mask)["adv/nonzero_frac"] == 0.5  # 3 of 6 kept

    actor = actor_settings(cfg).actor
    assert actor.policy_loss == "rft" and cfg.actor_rollout_ref.actor.policy_loss == "vanilla"  # cfg untouched
    logp = torch.tensor([[-0.5, -1.0, -4.0, -1.5],
                         [-2.0, -0.1, -0.3, 0.0],
                         [-0.7, 0.0, 0.0, 0.0],
                         [-0.2, -0.4, -0.6, -0.8],
                         [-1.0, -3.0, -5.0, 0.0],
                         [-0.9, -7.0, -1.1, -1.3]], requires_grad=True)
    loss, metrics = algos.get_policy_loss(actor.policy_loss)(logp, logp.detach(), batch.advantages, mask, actor,
                                                             rollout_logp=batch.rollout_logprobs)
    assert loss.item() == pytest.approx(9.0 / 16)
    assert metrics["rft_nll"] == pytest.approx(1.0)
    loss.backward()
    assert torch.allclose(logp.grad, -keep / 16)
    # GRPO on the same batch reads the reward: the format-only rows get advantages of their own
    grpo = TrainConfig()
    grpo.reward = DEMO_REWARD
    adv = trainer_advantages(grpo, TokenBatch.from_trajectories(hand_trajectories())).advantages
    assert adv[1].abs().sum() > 0 and adv[5].abs().sum() > 0


def test_rft_settings_are_checked_at_load(monkeypatch):
    from agent_rl.config import ConfigError
    from agent_rl.config.checks import check_settings

    cfg = rft_config()
    check_settings(cfg)
    cfg.algorithm.rft_min_acc = 0.0
    with pytest.raises(ConfigError, match="algorithm.rft_min_acc"):
        check_settings(cfg)
    # a policy loss set beside it that is not the one it brings: refused by the command, in
    # one line, before anything starts (and by the trainer)
    from agent_rl.training.cli import check_registered

    cfg = rft_config()
    check_registered(cfg)
    cfg.actor_rollout_ref.actor.policy_loss = "another_loss"
    with pytest.raises(ValueError, match="conflicts"):
        actor_settings(cfg)
    monkeypatch.setitem(algos.POLICY_LOSSES._fns, "another_loss", algos.rft_loss)  # registered for this test only
    monkeypatch.setitem(algos.POLICY_LOSSES._info, "another_loss", {})
    with pytest.raises(ConfigError, match="adv_estimator=rejection_sampling trains with policy loss 'rft'"):
        check_registered(cfg)


def test_rft_update_through_the_actor_is_sft_on_the_kept_trajectories(tiny_policy):
    """The actor's real update (`update_policy`, the loss `actor_settings` picks) on the hand
    batch: its gradient is SFT's (`update_sft`'s loss) on the kept trajectories alone, scaled
    by their share of the sampled tokens; the trajectories not kept skip the forward and
    backward; the step changes the weights and logs the kept tokens' NLL."""
    from agent_rl.training.workers.actor import ActorWorker

    cfg = rft_config()
    arr = cfg.actor_rollout_ref
    arr.model.path = str(tiny_policy)
    arr.rollout.n = 3
    arr.actor.ppo_mini_batch_size = 2  # prompts: the 6 trajectories in one mini-batch
    arr.actor.bf16_autocast = False  # fp32: only summation order differs between the two gradients
    arr.actor.optim.lr = 1e-3
    arr.actor.optim.weight_decay = 0.0
    arr.actor.tis_cap = 2.0  # as the demo config: the rft loss does not read it
    worker = ActorWorker(actor_settings(cfg), total_steps=2)
    assert worker.policy_loss is algos.rft_loss

    batch = trainer_advantages(cfg, TokenBatch.from_trajectories(hand_trajectories(extra=8)))
    mask = batch.mask(True)
    kept = torch.tensor(KEEP).bool()
    share = float(mask[kept].sum() / mask.sum())

    def grads(b: TokenBatch, loss_fn, active=None) -> torch.Tensor:
        worker.optim.optimizer.zero_grad(set_to_none=True)
        worker._backward(b, loss_fn, active)
        flat = torch.cat([p.grad.flatten() for p in worker.optim.params])
        worker.optim.optimizer.zero_grad(set_to_none=True)
        return flat

    rft = grads(batch, functools.partial(worker._ppo_loss, reuse_old=True), active=kept)
    sft = grads(batch.select(kept.nonzero().flatten()), worker._sft_loss)
    assert rft.norm() > 0 and (rft - share * sft).norm() <= 1e-4 * (share * sft).norm()

    logp = worker.compute_log_probs(batch)
    nll_kept = -logp[kept][mask[kept].bool()]
    before = [p.detach().clone() for p in worker.optim.params]
    metrics = worker.update_policy(batch)
    assert metrics["actor/skipped_sequences"] == 3.0  # the three not kept
    assert metrics["actor/pg_loss"] == pytest.approx(float(nll_kept.sum() / mask.sum()), rel=1e-4)
    assert metrics["actor/rft_nll"] == pytest.approx(float(nll_kept.mean()), rel=1e-4)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert any(not torch.equal(b, p) for b, p in zip(before, worker.optim.params))


def test_kl_in_the_reward_is_refused_at_load_for_rejection_sampling(monkeypatch):
    """rejection_sampling keeps a trajectory whose task metric reaches rft_min_acc; an in-reward
    KL penalty subtracted from it would drop a right answer (metric 1.0 - a positive penalty) or
    keep a wrong one (F1 0.9 + a negative k1 estimate >= 1.0). The config is refused at load, by
    the estimator's registration (accepts_kl_in_reward=False), not by its name; GRPO keeps it."""
    from agent_rl.config import ConfigError, TrainConfig, load_config

    rft = ["algorithm.adv_estimator=rejection_sampling"]
    load_config(TrainConfig, None, rft)
    with pytest.raises(ConfigError, match=r"algorithm.use_kl_in_reward=true does not apply to "
                                          r"algorithm.adv_estimator=rejection_sampling: it reads the acc outcome"):
        load_config(TrainConfig, None, [*rft, "algorithm.use_kl_in_reward=true"])
    load_config(TrainConfig, None, ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=true"])
    for name, info in (("plain_keep", {}), ("my_rft", {"accepts_kl_in_reward": False})):  # this test only
        monkeypatch.setitem(algos.ADV_ESTIMATORS._fns, name, algos.rejection_sampling)
        monkeypatch.setitem(algos.ADV_ESTIMATORS._info, name, {"outcome": "acc", **info})
    load_config(TrainConfig, None, ["algorithm.adv_estimator=plain_keep", "algorithm.use_kl_in_reward=true"])
    with pytest.raises(ConfigError, match="adv_estimator=my_rft"):
        load_config(TrainConfig, None, ["algorithm.adv_estimator=my_rft", "algorithm.use_kl_in_reward=true"])
    # an unknown estimator is check_registered's to name (agent-rl-train), not a crash here
    load_config(TrainConfig, None, ["algorithm.adv_estimator=nope", "algorithm.use_kl_in_reward=true"])
