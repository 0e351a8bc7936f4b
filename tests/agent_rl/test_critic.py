"""CriticWorker: value head on the real architecture (2-block truncated copy of the embedded
model, real weights; see test_actor.py), fp32 for exact comparisons."""

from __future__ import annotations

import math

import pytest
import torch

from agent_rl.config import TrainConfig
from agent_rl.training.batch import TokenBatch
from agent_rl.training.workers.critic import CriticWorker
from agent_rl.types import Trajectory


def make_trajs(n: int, seed: int, head: int = 0) -> list[Trajectory]:
    """Random-token trajectories; every third response has an observation span; every prompt
    starts with the same `head` tokens (a system prompt)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(3, 49000, (head,), generator=g).tolist()
    out = []
    for i in range(n):
        p, r = int(torch.randint(4, 20, (1,), generator=g)), int(torch.randint(6, 30, (1,), generator=g))
        mask = [0 if (i % 3 == 0 and 2 <= j < 5) else 1 for j in range(r)]
        ids = common + torch.randint(3, 49000, (p + r,), generator=g).tolist()
        p += head
        out.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask,
                              rollout_logprobs=[0.0] * r, group_id=i // 2))
    return out


def make_cfg(path) -> TrainConfig:
    cfg = TrainConfig()
    cfg.actor_rollout_ref.model.path = str(path)
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.critic.bf16_autocast = False
    cfg.critic.ppo_mini_batch_size = 2  # 4 sequences per optimizer step
    cfg.critic.ppo_max_token_len_per_gpu = 80
    cfg.critic.optim.lr = 1e-3
    return cfg


def with_targets(batch: TokenBatch, old: torch.Tensor, seed: int = 0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    returns = torch.randn(len(batch), 1, generator=g).expand_as(batch.loss_mask) * batch.response_valid_mask()
    return batch.with_fields(values=old, returns=returns.contiguous())


@pytest.mark.parametrize("head", [0, 12], ids=["distinct prompts", "shared prompt head"])
def test_values_are_head_of_the_predicting_hidden_state(tiny_policy, head):
    """Values of each sequence computed alone by plain transformers; with a shared prompt head
    the micro-batch packs it once (forward.py)."""
    from transformers import AutoModel

    c = CriticWorker(make_cfg(tiny_policy), total_steps=1)
    assert c.share_prefix
    batch = TokenBatch.from_trajectories(make_trajs(5, seed=2, head=head))
    values = c.compute_values(batch)
    assert values.shape == batch.loss_mask.shape and values.dtype == torch.float32
    assert (values[~batch.response_valid_mask().bool()] == 0).all()
    trunk = AutoModel.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    head = c.model.value_head
    with torch.no_grad():
        for i in range(len(batch)):
            n, p = int(batch.seq_lens[i]), int(batch.prompt_lens[i])
            h = trunk(batch.input_ids[i : i + 1, :n]).last_hidden_state[0]
            expected = head(h[p - 1 : n - 1]).squeeze(-1)  # V before response token j
            assert torch.allclose(values[i, : n - p], expected, atol=1e-5)


def test_update_critic_fits_returns(tiny_policy):
    c = CriticWorker(make_cfg(tiny_policy), total_steps=4)
    batch = TokenBatch.from_trajectories(make_trajs(8, seed=4))
    head_before = c.model.value_head.weight.detach().clone()
    trunk_before = next(c.model.trunk.parameters()).detach().clone()
    losses = []
    for _ in range(3):
        metrics = c.update_critic(with_targets(batch, c.compute_values(batch)))
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/lr"):
            assert math.isfinite(metrics[key]), key
        losses.append(metrics["critic/vf_loss"])
    assert losses[-1] < losses[0]
    assert not torch.equal(c.model.value_head.weight, head_before)
    assert not torch.equal(next(c.model.trunk.parameters()), trunk_before)
    with pytest.raises(ValueError, match="returns"):
        c.update_critic(batch)


def test_critic_save_load(tiny_policy, tmp_path):
    cfg = make_cfg(tiny_policy)
    c = CriticWorker(cfg, total_steps=2)
    batch = TokenBatch.from_trajectories(make_trajs(4, seed=6))
    c.update_critic(with_targets(batch, c.compute_values(batch)))
    c.save(str(tmp_path / "critic"))
    c2 = CriticWorker(cfg, total_steps=2)
    c2.load(str(tmp_path / "critic"))
    assert torch.equal(c2.compute_values(batch), c.compute_values(batch))
    assert c2.num_updates == 1


def _fsdp_bf16_main(rank: int, port: int, model: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    cfg = make_cfg(model)
    cfg.critic.bf16_autocast = True
    cfg.critic.strategy = "fsdp"
    c = CriticWorker(cfg, total_steps=2)
    batch = TokenBatch.from_trajectories(make_trajs(4, seed=7))
    values = c.compute_values(batch)
    metrics = c.update_critic(with_targets(batch, values))
    torch.save({"fsdp": c.fsdp, "values": values, "head": str(c.model.value_head.weight.dtype),
                "loss": metrics["critic/vf_loss"]}, out)
    torch.distributed.destroy_process_group()


def test_fsdp_bf16_critic_keeps_an_fp32_value_head(tiny_policy, tmp_path):
    """Under FSDP2 with bf16 parameters the value head used to be cast to bf16 as well and
    its fp32 input failed the matmul (found on an H100, docs/gpu.md); gloo, one rank."""
    import torch.multiprocessing as mp

    from agent_rl.training.workers import dist as wdist

    out = tmp_path / "critic.pt"
    mp.spawn(_fsdp_bf16_main, args=(wdist.free_port(), str(tiny_policy), str(out)), nprocs=1, join=True)
    r = torch.load(out, weights_only=False)
    assert r["fsdp"] and r["values"].dtype == torch.float32 and torch.isfinite(r["values"]).all()
    assert r["head"] == "torch.float32" and math.isfinite(r["loss"])
