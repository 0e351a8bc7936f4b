"""Our GRPO advantages, loss and gradient against TRL's (trl==1.16.0, the dev extra) on one
identical batch (issue 98, item 3; the differences are named in docs/vs_trl.md).

The batch: 3 GRPO groups of 4 responses (random token ids; most responses have an observation
span in the middle, masked out of the loss), their rewards, the same old log-probs, and the
same weights (`tiny_policy`, 2 blocks of the embedded policy, fp32), sampled at temperature 0.7.

- Ours, as the trainer and the actor call it: `place_outcome_reward` + `get_adv_estimator("grpo")`
  (trainer._advantages), then `ActorWorker._backward` with `_ppo_loss` (the actor's forward,
  `ppo_policy_loss`, `agg_loss`): the gradient of one optimizer step, before the step.
- TRL's own code, not a copy: a real `GRPOTrainer` (model path, reward function, GRPOConfig)
  whose `rollout_func` returns our token ids, with `env_mask` (TRL's way of keeping environment
  tokens out of the loss), so that its `_generate_and_score_completions` computes the
  advantages and its `_compute_loss` the loss; then `loss.backward()`. Two things are set by
  hand, because only HF's training loop or a misaligned schedule sets them:
  `current_gradient_accumulation_steps = 1` (one optimizer step per batch) and the batch's
  `old_per_token_logps` (TRL computes them itself only when generation and update steps are
  misaligned; both sides must get the same old log-probs for the clip to be exercised).

Settings mapped: TRL `loss_type` grpo -> our loss_agg_mode seq-mean-token-mean, bnpo and dapo
-> token-mean, dr_grpo -> seq-mean-token-sum / max_completion_length; scale_rewards none ->
norm_adv_by_std_in_grpo False, group -> True (eps differs, below); epsilon / epsilon_high ->
clip_ratio_low / clip_ratio_high; beta=0 -> no KL; TRL `delta` -> our dual-clip clip_ratio_c.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from agent_rl.config import ActorRolloutRefConfig, AlgorithmConfig
from agent_rl.training.algos import get_adv_estimator, place_outcome_reward
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers.actor import ActorWorker
from agent_rl.training.workers.step import combine_metrics
from agent_rl.types import Trajectory

GROUP = 4
REWARDS = [1.0, 0.0, 0.0, 0.0,  # one right: mean 0.25, unbiased std 0.5
           0.0, 1.0, 1.0, 1.0,  # one wrong: mean 0.75, unbiased std 0.5 (the same std: see _scaled)
           0.2, 0.2, 0.2, 0.2]  # all well-formed and wrong: no signal on either side
TEMPERATURE = 0.7
CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # DAPO's clip-higher, so that the two bounds are told apart
MAX_COMPLETION = 64  # TRL dr_grpo's constant denominator (per sequence)
TRL_STD_EPS = 1e-4  # grpo_trainer.py: advantages / (std_rewards + 1e-4)
OUR_STD_EPS = 1e-6  # agent_rl.training.algos.advantages.GRPO_EPS

# Two fp32 implementations of the same forward (ours: packed varlen attention and a chunked
# head; TRL: left-padded prompts and its fused head) sum in different orders: log-probs near
# -15 differ by up to 4e-5, the losses by ~5e-6 of their size (seen here). A mismatch of
# definitions (another normaliser, a clip bound, the temperature) moves them by 1e-2 or more.
LOSS_RTOL = 1e-4
# Gradients compared as vectors: |g_ours - g_trl| was 8e-6 of |g_trl| here; 1e-4 is
# test_actor.py's bound for two packings of the same forward.
GRAD_RTOL = 1e-4


# ----------------------------------------------------------------------------- the batch
def make_trajs(seed: int = 0) -> list[Trajectory]:
    """3 groups x 4 responses of random tokens; each group shares its prompt (lengths 5, 9, 13:
    TRL left-pads them), responses 6-30 tokens (so the per-sequence and per-token means
    differ), with a 4-token observation span (loss mask 0) in 3 of every 4."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for q in range(len(REWARDS) // GROUP):
        prompt = torch.randint(3, 49000, (5 + 4 * q,), generator=g).tolist()
        for k in range(GROUP):
            i = q * GROUP + k
            r = int(torch.randint(6, 31, (1,), generator=g))
            mask = [1] * r
            if k != GROUP - 1:
                start = int(torch.randint(1, r - 4, (1,), generator=g))
                mask[start:start + 4] = [0] * 4
            out.append(Trajectory(prompt_ids=prompt, response_ids=torch.randint(3, 49000, (r,), generator=g).tolist(),
                                  loss_mask=mask, rollout_logprobs=[0.0] * r, reward=REWARDS[i], group_id=q))
    return out


def old_logprobs(logp: torch.Tensor, mask: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """The behaviour policy's log-probs: the current ones shifted by U(-0.4, 0.4) per sampled
    token, so ratios span e^-0.4 = 0.67 .. e^0.4 = 1.49 (both clip bounds active, the dual clip
    at 3 never)."""
    g = torch.Generator().manual_seed(seed)
    return logp - (torch.rand(logp.shape, generator=g) * 0.8 - 0.4) * mask


# ----------------------------------------------------------------------------- our side
def our_worker(path, **actor) -> ActorWorker:
    cfg = ActorRolloutRefConfig()
    cfg.model.path = str(path)
    cfg.rollout.n = GROUP
    cfg.rollout.temperature = TEMPERATURE
    cfg.actor.bf16_autocast = False
    cfg.actor.ppo_mini_batch_size = len(REWARDS) // GROUP  # one mini-batch: one optimizer step
    cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high = CLIP_LOW, CLIP_HIGH
    for k, v in actor.items():
        setattr(cfg.actor, k, v)
    return ActorWorker(cfg, total_steps=1)


def our_advantages(batch: TokenBatch, norm_by_std: bool) -> torch.Tensor:
    """(B,T) advantages as trainer._advantages computes them."""
    mask = batch.loss_mask
    token_rewards = place_outcome_reward(batch.rewards, mask)
    adv, _ = get_adv_estimator("grpo")(token_rewards, mask, batch.group_ids, None,
                                       AlgorithmConfig(norm_adv_by_std_in_grpo=norm_by_std))
    return adv


def our_loss_and_grad(worker: ActorWorker, batch: TokenBatch) -> tuple[float, dict[str, torch.Tensor]]:
    """The policy loss of this mini-batch and its gradient by parameter name (no step)."""
    worker.optim.optimizer.zero_grad(set_to_none=True)
    metrics = combine_metrics(worker._backward(batch, lambda mb, norm: worker._ppo_loss(mb, norm, reuse_old=False)))
    grads = {n: p.grad.detach().clone() for n, p in worker.model.named_parameters() if p.grad is not None}
    worker.optim.optimizer.zero_grad(set_to_none=True)
    return metrics["pg_loss"], grads


# ----------------------------------------------------------------------------- TRL's side
def trl_trainer(path, tmp_path, trajs: list[Trajectory], group: int = GROUP, **config) -> GRPOTrainer:
    """A real GRPOTrainer whose rollout returns `trajs` (in order) and whose reward is theirs."""
    def rollout(prompts, trainer):
        return {"prompt_ids": [t.prompt_ids for t in trajs], "completion_ids": [t.response_ids for t in trajs],
                "logprobs": None, "env_mask": [t.loss_mask for t in trajs]}

    def reward(prompts, completions, completion_ids, reward, **_):
        return list(reward)

    args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=len(trajs), num_generations=group, beta=0.0,
                      temperature=TEMPERATURE, epsilon=CLIP_LOW, epsilon_high=CLIP_HIGH,
                      max_completion_length=MAX_COMPLETION, **config)
    data = Dataset.from_dict({"prompt": ["q"] * len(trajs), "reward": [t.reward for t in trajs]})
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func's "experimental" warning
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward, args=args, train_dataset=data, rollout_func=rollout)
    trainer.current_gradient_accumulation_steps = 1  # set by HF's training loop; one step per batch
    trainer.model.train()
    return trainer


def trl_batch(trainer: GRPOTrainer, trajs: list[Trajectory]) -> dict:
    """TRL's training inputs for `trajs`: its own advantages (B,), masks and padding."""
    with torch.no_grad():
        return trainer._generate_and_score_completions([{"prompt": "q", "reward": t.reward} for t in trajs])


def trl_loss_and_grad(trainer: GRPOTrainer, inputs: dict) -> tuple[float, dict[str, torch.Tensor]]:
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return loss.item(), grads


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def trajs() -> list[Trajectory]:
    return make_trajs()


@pytest.fixture(scope="module")
def current_logp(tiny_policy, trajs) -> torch.Tensor:
    """(B,R) our log-probs of the batch at the shared weights."""
    return our_worker(tiny_policy).compute_log_probs(TokenBatch.from_trajectories(trajs))


@pytest.fixture(scope="module")
def shared_old(trajs, current_logp) -> torch.Tensor:
    """(B,R) old log-probs both sides get: the current ones, shifted (old_logprobs)."""
    return old_logprobs(current_logp, TokenBatch.from_trajectories(trajs).loss_mask)


@pytest.fixture(scope="module")
def ours(tiny_policy, trajs, shared_old):
    """`ours(loss_agg_mode, norm_by_std)` -> (loss, grads) on the shared batch, each computed once."""
    done: dict = {}

    def run(mode: str, norm_by_std: bool):
        if (mode, norm_by_std) not in done:
            worker = our_worker(tiny_policy, loss_agg_mode=mode)
            done[mode, norm_by_std] = our_loss_and_grad(worker, our_batch(trajs, shared_old, norm_by_std))
        return done[mode, norm_by_std]

    return run


@pytest.fixture(scope="module")
def trl(tiny_policy, tmp_path_factory, trajs, shared_old):
    """`trl(loss_type, scale_rewards)` -> (loss, grads) on the shared batch, each computed once."""
    done: dict = {}

    def run(loss_type: str, scale_rewards: str):
        if (loss_type, scale_rewards) not in done:
            trainer = trl_trainer(tiny_policy, tmp_path_factory.mktemp("trl"), trajs, loss_type=loss_type,
                                  scale_rewards=scale_rewards)
            inputs = trl_batch(trainer, trajs)
            assert inputs["completion_ids"].shape == shared_old.shape  # the same right-padded layout
            inputs["old_per_token_logps"] = shared_old
            done[loss_type, scale_rewards] = trl_loss_and_grad(trainer, inputs)
        return done[loss_type, scale_rewards]

    return run


def our_batch(trajs, old: torch.Tensor, norm_by_std: bool) -> TokenBatch:
    batch = TokenBatch.from_trajectories(trajs)
    return batch.with_fields(advantages=our_advantages(batch, norm_by_std), old_logprobs=old)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[n].flatten() for n in sorted(grads)])


# ----------------------------------------------------------------------------- advantages
def test_advantages_std_scaling_vs_trl(tiny_policy, tmp_path, trajs):
    """Centring agrees exactly; the std is unbiased on both sides; the eps added to it differs
    (TRL 1e-4, ours 1e-6); TRL's scale_rewards="batch" has no counterpart in ours."""
    batch = TokenBatch.from_trajectories(trajs)
    first = batch.loss_mask.argmax(dim=1)  # a sampled token of each row: our advantage per row
    ours = {norm: our_advantages(batch, norm)[torch.arange(len(batch)), first] for norm in (False, True)}
    trl = {s: trl_batch(trl_trainer(tiny_policy, tmp_path, trajs, scale_rewards=s), trajs)["advantages"]
           for s in ("none", "group", "batch")}

    # scale_rewards="none" <-> norm_adv_by_std_in_grpo=False: r - group mean, hand-computed
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, -0.75, 0.25, 0.25, 0.25, 0, 0, 0, 0])
    assert torch.allclose(ours[False], centred, atol=1e-7) and torch.allclose(trl["none"], centred, atol=1e-7)
    # "group" <-> True: both divide by the unbiased std, 0.5 for [1,0,0,0] (the biased one
    # would be sqrt(0.1875) = 0.433); only the eps differs: 0.75/0.500001 vs 0.75/0.5001
    assert ours[True][0].item() == pytest.approx(0.75 / (0.5 + OUR_STD_EPS), rel=1e-6)
    assert trl["group"][0].item() == pytest.approx(0.75 / (0.5 + TRL_STD_EPS), rel=1e-6)
    assert trl["group"][0].item() != pytest.approx(ours[True][0].item(), rel=1e-5)  # 2e-4 apart
    # "batch": one std over all 12 rewards (mean 0.4, squared deviations 2.24, /11)
    batch_std = math.sqrt(2.24 / 11)
    assert trl["batch"][0].item() == pytest.approx(0.75 / (batch_std + TRL_STD_EPS), rel=1e-6)  # 1.6616
    assert trl["batch"][4].item() == pytest.approx(-0.75 / (batch_std + TRL_STD_EPS), rel=1e-6)


def test_flat_group_gets_no_signal_in_ours_but_not_in_trl(tiny_policy, tmp_path):
    """Eight equal rewards of 0.1: their float32 mean is 0.10000000894, one ulp above 0.1f
    (0.10000000149), so r - mean = -7.45e-9 and the std ~8e-9. TRL divides by std + 1e-4 and
    gives every row -7.45e-9 / 1e-4 = -7.45e-5; ours takes an all-equal group's mean as its
    common value (GRPO_EPS's docstring) and gives exactly 0."""
    trajs = [Trajectory(prompt_ids=[11, 12, 13], response_ids=[21, 22, 23], loss_mask=[1, 1, 1],
                        rollout_logprobs=[0.0] * 3, reward=0.1, group_id=0) for _ in range(8)]
    trl = trl_batch(trl_trainer(tiny_policy, tmp_path, trajs, group=8, scale_rewards="group"), trajs)["advantages"]
    assert torch.allclose(trl, torch.full((8,), -7.45e-5), rtol=1e-3)
    ours = our_advantages(TokenBatch.from_trajectories(trajs), norm_by_std=True)
    assert torch.equal(ours, torch.zeros_like(ours))


# ----------------------------------------------------------------------------- loss and gradient
LOSS_TYPES = {  # TRL loss_type: (our loss_agg_mode, TRL's loss / ours)
    "grpo": ("seq-mean-token-mean", 1.0),
    "bnpo": ("token-mean", 1.0),
    "dapo": ("token-mean", 1.0),
    "dr_grpo": ("seq-mean-token-sum", 1.0 / MAX_COMPLETION),
}


def _scaled(scale_rewards: str) -> float:
    """TRL's advantages / ours on this batch. Every group with signal has std 0.5, so with
    scale_rewards="group" TRL's are ours times (0.5 + 1e-6) / (0.5 + 1e-4) on every row (the flat
    group is 0 on both sides), and the PPO loss is linear in a positive scale of A."""
    return (0.5 + OUR_STD_EPS) / (0.5 + TRL_STD_EPS) if scale_rewards == "group" else 1.0


# every loss_type with the advantages centred only (equal on both sides); the std scaling once,
# with TRL's default loss_type (the advantage test covers the scaling itself)
CASES = [(loss_type, "none") for loss_type in LOSS_TYPES] + [("dapo", "group")]


@pytest.mark.parametrize("loss_type,scale_rewards", CASES)
def test_loss_and_gradient_match_trl(ours, trl, loss_type, scale_rewards):
    mode, per_ours = LOSS_TYPES[loss_type]
    loss, g_ours = ours(mode, scale_rewards == "group")
    theirs, g_trl = trl(loss_type, scale_rewards)
    factor = per_ours * _scaled(scale_rewards)
    assert abs(loss) > 1e-3  # a loss that can tell definitions apart
    assert theirs == pytest.approx(factor * loss, rel=LOSS_RTOL)
    assert sorted(g_ours) == sorted(g_trl)
    a, b = factor * flat(g_ours), flat(g_trl)
    assert (a - b).norm() <= GRAD_RTOL * b.norm(), ((a - b).norm() / b.norm()).item()


def test_token_mean_is_not_trls_grpo(ours, trl):
    """Our default, token-mean, is TRL's dapo (its default too), not its "grpo" (per-sequence
    mean first): on responses of 6-30 tokens the two differ, so the mapping above is not
    vacuous."""
    loss, _ = ours("token-mean", False)
    theirs, _ = trl("grpo", "none")
    assert abs(theirs - loss) > 100 * LOSS_RTOL * abs(loss)


def test_dual_clip_is_trls_delta(tiny_policy, tmp_path, trajs, shared_old, current_logp):
    """Our dual clip (clip_ratio_c=3, always on) caps a negative-advantage token's loss at
    3|A|; TRL caps it only with `delta` set (delta=3 gives ours). One token of row 1 (A=-0.25)
    gets ratio e^2 = 7.39: without delta TRL's token-mean loss exceeds ours by
    0.25 * (e^2 - 3) / N, N the sampled tokens of the batch."""
    old = shared_old.clone()
    row, col = 1, int(TokenBatch.from_trajectories(trajs).loss_mask[1].argmax())
    worker = our_worker(tiny_policy, loss_agg_mode="token-mean", clip_ratio_c=3.0)
    old[row, col] = current_logp[row, col] - 2.0
    batch = our_batch(trajs, old, norm_by_std=False)
    ours, g_ours = our_loss_and_grad(worker, batch)

    results = {}
    for delta in (None, 3.0):
        trainer = trl_trainer(tiny_policy, tmp_path, trajs, loss_type="dapo", scale_rewards="none", delta=delta)
        inputs = trl_batch(trainer, trajs)
        inputs["old_per_token_logps"] = old
        results[delta] = trl_loss_and_grad(trainer, inputs)
    n_tokens = int(batch.loss_mask.sum())
    assert results[3.0][0] == pytest.approx(ours, rel=LOSS_RTOL)
    a, b = flat(g_ours), flat(results[3.0][1])
    assert (a - b).norm() <= GRAD_RTOL * b.norm()
    assert results[None][0] - ours == pytest.approx(0.25 * (math.exp(2.0) - 3.0) / n_tokens, rel=1e-3)
