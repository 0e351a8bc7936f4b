"""filter_groups: DAPO dynamic sampling keeps only groups whose rewards disagree."""

import torch

from agent_rl.training.algos import filter_groups


def test_filter_groups_keeps_groups_with_signal():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "d"]
    res = filter_groups(rewards, groups)
    # a: all 1, c: all 0, d: single member -> dropped; b disagrees -> kept
    assert res.keep.tolist() == [False] * 3 + [True] * 3 + [False] * 3
    assert res.kept_groups == ["b"] and res.dropped_groups == ["a", "c", "d"]
    expected = {"num_groups": 4.0, "num_groups_kept": 1.0, "frac_groups_kept": 0.25, "frac_samples_kept": 3 / 9}
    assert res.metrics == expected


def test_filter_groups_tolerance_and_tensor_ids():
    rewards = torch.tensor([0.50, 0.52, 0.1, 0.9])
    ids = torch.tensor([4, 4, 2, 2])
    assert filter_groups(rewards, ids).kept_groups == [4, 2]
    assert filter_groups(rewards, ids, atol=0.05).kept_groups == [2]  # 0.02 spread is not signal
