"""benchmarks/async_modes.py (issue 86, item 2): `trainer.mode` sync, one_step_off and async side
by side, the command a lent GPU runs (`scripts/gpu_check.sh modes`), here on the CPU with a
2-block policy and a tiny knowledge base; and its table's arithmetic by hand."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import async_modes  # noqa: E402
from local_ray import ray_address  # noqa: E402

TINY = ["data.train_batch_size=2", "data.max_response_length=64", "data.max_obs_length=48",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.max_tokens_per_turn=32",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.kv_cache_space_gb=0.25",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "max_turns=2",
        # the transformers backend: the subject is the command and its table, not vLLM (which the
        # GPU stage runs; tests/agent_rl/test_trainer.py's GRPO/PPO runs keep it on the CPU)
        "actor_rollout_ref.rollout.engine_mode=hf"]


def _arm(steps: int, train_s: float, **kw) -> dict:
    return {"steps": steps, "train_s": train_s, "steps_per_hour": 3600 * steps / train_s, "time_to_gain_min": None,
            "steps_to_gain": None, "val_em_start": 0.5, "val_em_best": 0.55, "val_em_last": 0.5,
            "staleness_mean": None, "dropped_stale": 0.0, "trainer_wait_s": 2.0, "engine_idle_s": None,
            "step_s": train_s / steps, **kw}


def test_the_table_puts_each_mode_beside_sync_of_the_same_search():
    """12 steps in 240 s = 180 an hour; async's 18 in 240 s = 270: 1.50x sync's; a slow-search
    arm is compared with the slow-search sync, not the local one."""
    arms = {("local", "sync"): _arm(12, 240.0), ("local", "async"): _arm(18, 240.0, staleness_mean=0.5),
            ("slow", "sync"): _arm(6, 240.0), ("slow", "async"): _arm(12, 240.0, time_to_gain_min=3.0, steps_to_gain=9)}
    text = async_modes.table(arms, argparse.Namespace(minutes=4.0, gain=0.05))
    rows = [r for r in text.splitlines() if r.startswith("| local") or r.startswith("| slow")]
    assert [r.split(" | ")[:5] for r in rows] == [
        ["| local", "sync", "12", "180", "1.00x"], ["| local", "async", "18", "270", "1.50x"],
        ["| slow", "sync", "6", "90", "1.00x"], ["| slow", "async", "12", "180", "2.00x"]]
    assert "| 3.0 (9) |" in rows[3] and "not reached" in rows[0] and "| 0.50 |" in rows[1]


def test_an_arm_trains_on_the_kb_given_and_the_commands_overrides_win(tmp_path, monkeypatch):
    """--kb's training questions (the config names the embedded KB's), the mode last; where torch
    sees a GPU, engine and trainer go on it (the demo's placement); a command override beats the
    benchmark's own settings."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.demo import stages

    args = argparse.Namespace(kb=str(tmp_path / "kb"), test=[tmp_path / "kb" / "test.parquet"], minutes=2.0,
                              val_n=8, val_every=3, overrides=["trainer.test_freq=5"])
    for device, placed in (("cpu", []), ("cuda", ["trainer.n_gpus_per_node=1"])):
        monkeypatch.setattr("data_prep.hardware.default_device", lambda d=device: d)
        o = async_modes.arm_overrides(tmp_path / "sft", "http://h:1/retrieve", args, tmp_path / "run", "async")
        assert o[0] == f"data.train_files=[{tmp_path / 'kb' / 'train.parquet'}]" and o[-1] == "trainer.mode=async"
        assert [x for x in o if x.startswith("trainer.n_gpus_per_node")] == placed
    cfg = load_config(TrainConfig, ROOT / "configs" / "train" / "demo_grpo_cpu.yaml", o)
    assert cfg.data.train_files == [str(tmp_path / "kb" / "train.parquet")] and cfg.trainer.test_freq == 5
    assert (cfg.trainer.mode, cfg.trainer.max_time_s, cfg.trainer.n_gpus_per_node) == ("async", 120.0, 1)
    assert stages.device_overrides() == ["trainer.n_gpus_per_node=1"]


@pytest.mark.ray
def test_the_modes_train_one_after_another_and_land_in_one_table(tiny_policy, tiny_kb, tiny_bm25, tmp_path):
    """sync and async (one_step_off's arm is the same path with another mode: the GPU stage runs
    all three; the suite keeps its minutes), each from the same policy on the KB given."""
    out = tmp_path / "modes.json"
    # a step per arm is what the assertions need: the budget ends each arm after its first step
    # each arm's agent-rl-train joins this process's Ray node (test_vs_trl's command starts its own)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_modes.py"), "--minutes", "0.05",
                           "--modes", "sync,async", "--search", "local", "--sft", str(tiny_policy), "--kb", str(tiny_kb),
                           "--index", str(tiny_bm25), "--val-every", "1", "--val-n", "4",
                           "--workdir", str(tmp_path / "work"), "--json", str(out), *TINY,
                           f"trainer.ray_address={ray_address()}"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert list(res["arms"]) == ["local/sync", "local/async"]
    for name, a in res["arms"].items():
        assert a["steps"] >= 1 and a["steps_per_hour"] > 0, (name, a)
        assert a["val_points"][0][0] == 0, (name, a["val_points"])  # the start's running evaluation
    # the mode took effect: only the modes that generate ahead measure how stale their groups were
    assert res["arms"]["local/sync"]["staleness_mean"] is None
    assert res["arms"]["local/async"]["staleness_mean"] is not None
    rows = [r for r in res["table"].splitlines() if r.startswith("| local |")]
    assert len(rows) == 2 and rows[0].split(" | ")[4] == "1.00x"
    assert Path(res["png"]).is_file() and (tmp_path / "work" / "record.json").is_file()
