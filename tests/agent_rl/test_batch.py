"""TokenBatch layout and splitting (pure tensor logic, no model)."""

from __future__ import annotations

import pytest
import torch

from agent_rl.training.batch import TokenBatch, concat_rows, micro_batches, shard, shard_indices, split_mini_batches
from agent_rl.types import Trajectory


def _traj(prompt: int, response: int, obs: tuple[int, int] | None = None, group: int = 0, reward: float = 0.0):
    mask = [1] * response
    if obs is not None:
        for j in range(*obs):
            mask[j] = 0
    return Trajectory(
        prompt_ids=list(range(10, 10 + prompt)),
        response_ids=list(range(100, 100 + response)),
        loss_mask=mask,
        rollout_logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=reward,
        group_id=group,
    )


def _batch(lengths: list[tuple[int, int]]) -> TokenBatch:
    return TokenBatch.from_trajectories([_traj(p, r, group=i // 2) for i, (p, r) in enumerate(lengths)])


def test_from_trajectories_layout():
    b = TokenBatch.from_trajectories([_traj(3, 5, obs=(1, 3), reward=1.0), _traj(2, 2, group=1)])
    assert b.input_ids.shape == (2, 8) and b.loss_mask.shape == (2, 5)
    assert b.prompt_lens.tolist() == [3, 2] and b.seq_lens.tolist() == [8, 4]
    assert b.input_ids[0].tolist() == [10, 11, 12, 100, 101, 102, 103, 104]
    assert b.input_ids[1].tolist() == [10, 11, 100, 101, 0, 0, 0, 0]
    assert b.loss_mask.tolist() == [[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]]
    assert b.rollout_logprobs[0].tolist() == [-0.5, 0, 0, -0.5, -0.5]
    # response column j is input position prompt_len + j
    assert b.input_ids[0, b.prompt_lens[0] + 1].item() == 101
    assert b.rewards.tolist() == [1.0, 0.0] and b.group_ids.tolist() == [0, 1]
    assert b.index.tolist() == [0, 1] and b.num_tokens == 12
    assert b.old_logprobs is None and b.advantages is None


def test_state_masking_switch():
    b = TokenBatch.from_trajectories([_traj(3, 5, obs=(1, 3)), _traj(2, 2)])
    assert b.mask(True).tolist() == [[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]]
    assert b.mask(False).tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_bad_trajectory_is_named():
    with pytest.raises(ValueError, match="trajectory 1"):
        TokenBatch.from_trajectories([_traj(3, 5), _traj(3, 0)])
    with pytest.raises(ValueError, match="empty"):
        TokenBatch.from_trajectories([])


def test_select_trims_and_with_fields_checks_shape():
    b = _batch([(3, 9), (2, 2), (5, 4)])
    adv = torch.arange(27, dtype=torch.float32).reshape(3, 9)
    b = b.with_fields(advantages=adv)
    sub = b.select([2, 1])
    assert sub.input_ids.shape == (2, 9) and sub.loss_mask.shape == (2, 4)
    assert sub.index.tolist() == [2, 1]
    assert torch.equal(sub.advantages, adv[[2, 1], :4])
    with pytest.raises(ValueError, match="shape"):
        b.with_fields(old_logprobs=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="not a per-token field"):
        b.with_fields(rewards=torch.zeros(3, 9))
    empty = b.select([])
    assert len(empty) == 0 and empty.loss_mask.shape == (0, 0)


def test_split_mini_batches_even_and_seeded():
    b = _batch([(2, 3)] * 10)
    parts = split_mini_batches(b, 4)
    assert [len(p) for p in parts] == [4, 3, 3]  # ceil(10/4)=3 parts, sizes differ by <= 1
    assert sorted(sum((p.index.tolist() for p in parts), [])) == list(range(10))
    assert [p.index.tolist() for p in parts][0] == [0, 1, 2, 3]
    s1 = [p.index.tolist() for p in split_mini_batches(b, 5, shuffle=True, seed=3)]
    s2 = [p.index.tolist() for p in split_mini_batches(b, 5, shuffle=True, seed=3)]
    s3 = [p.index.tolist() for p in split_mini_batches(b, 5, shuffle=True, seed=4)]
    assert s1 == s2 and s1 != s3
    assert [len(p) for p in split_mini_batches(b.select([0]), 4, num_mini_batches=2)] == [1, 0]


def test_dynamic_micro_batches_respect_budget_and_cover():
    lens = [(5, 40), (3, 10), (10, 30), (2, 5), (4, 60), (1, 8)]
    b = _batch(lens)
    parts = micro_batches(b, use_dynamic_bsz=True, max_token_len=70, micro_batch_size=0)
    assert sorted(sum((p.index.tolist() for p in parts), [])) == list(range(len(lens)))
    assert all(p.num_tokens <= 70 for p in parts)
    assert len(parts) == 3  # 204 tokens: FFD needs 3 bins of 70
    # a sequence over the budget gets a bin of its own instead of failing
    big = micro_batches(b, True, 50, 0)
    assert any(len(p) == 1 and p.num_tokens == 64 for p in big)
    fixed = micro_batches(b, use_dynamic_bsz=False, max_token_len=0, micro_batch_size=4)
    assert [len(p) for p in fixed] == [4, 2]
    assert fixed[0].index.tolist() == [4, 0, 2, 1]  # longest first


def test_shard_balanced_and_disjoint():
    lens = [(10, 200), (10, 20), (10, 150), (10, 90), (10, 60), (10, 50), (10, 30)]
    b = _batch(lens)
    shards = [shard(b, r, 3) for r in range(3)]
    idx = sum((s.index.tolist() for s in shards), [])
    assert sorted(idx) == list(range(len(lens)))
    loads = [s.num_tokens for s in shards]
    assert max(loads) - min(loads) <= max(p + r for p, r in lens)
    assert all(s.index.tolist() == sorted(s.index.tolist()) for s in shards)
    assert shard_indices([5], 1, 2) == []  # fewer sequences than ranks: an empty shard
    with pytest.raises(ValueError):
        shard(b, 3, 3)


def test_concat_rows_restores_order():
    parts = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]])]
    out = concat_rows(parts, [[2], [0, 1]], 3)
    assert out.tolist() == [[3.0, 0.0], [4.0, 0.0], [1.0, 2.0]]
