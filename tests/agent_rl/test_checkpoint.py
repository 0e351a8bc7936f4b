"""Run-level checkpoints: atomic write, latest pointer, keep-last-K, RNG restore."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from agent_rl.training.checkpoint import CheckpointManager


def _save(mgr: CheckpointManager, step: int, **kw):
    def workers(d):
        (d / "actor").mkdir()
        (d / "actor" / "weights.txt").write_text(f"step {step}")

    return mgr.save(step, {"data": {"epoch": 0, "index": step}, **kw}, {"lr": 1e-6}, workers)


def test_save_then_load_restores_state_and_rng(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    assert mgr.latest() is None
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(mgr, 3)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7), np.random.seed(7), torch.manual_seed(7)  # disturb
    assert mgr.latest() == path and path.name == "global_step_3"
    state = mgr.load(mgr.latest())
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "index": 3}
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert (path / "actor" / "weights.txt").read_text() == "step 3"
    assert "lr" in (path / "config.yaml").read_text()


def test_keep_last_k_and_latest_points_to_newest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        _save(mgr, step)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]
    assert mgr.latest().name == "global_step_4"


def test_interrupted_save_leaves_previous_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)

    def crash(d):
        (d / "actor").mkdir()
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError):
        mgr.save(2, {}, {}, crash)
    assert mgr.latest().name == "global_step_1"
    assert not (tmp_path / "global_step_2").exists()  # only the .tmp dir, never a partial final dir
    _save(mgr, 2)  # a later save of the same step cleans up the stale tmp dir
    assert mgr.latest().name == "global_step_2" and not (tmp_path / "global_step_2.tmp").exists()


def test_load_rejects_a_directory_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        CheckpointManager(tmp_path).load(tmp_path)


def test_latest_is_found_even_if_the_pointer_lags(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)
    _save(mgr, 2)
    (tmp_path / "latest").write_text("global_step_1")  # killed between rename and pointer update
    (tmp_path / "global_step_3").mkdir()  # a directory without trainer_state.json is not complete
    assert mgr.latest().name == "global_step_2"
