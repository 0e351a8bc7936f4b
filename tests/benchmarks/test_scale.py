"""benchmarks/scale.py and the weightless policy it runs (issue 86, item 1): the shapes' parameter
counts by hand, random weights that engine and trainer make alike and that a weight sync makes
equal, the steps-per-hour arithmetic by hand, and the whole command on the CPU at the tiny shape
of the same architecture (the path a GPU runs at Qwen2.5-3B's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_rl.rollout.engine import config_shapes  # noqa: E402
from agent_rl.training.workers import model_io  # noqa: E402


def _qwen2_params(vocab: int, h: int, layers: int, heads: int, kv: int, inter: int) -> int:
    """Qwen2 by hand: embedding (tied to the head), per layer q/k/v with biases, o without, the
    SwiGLU MLP's three matrices and two RMSNorms; the final norm."""
    d = h // heads
    attn = (h * h + h) + 2 * (h * kv * d + kv * d) + h * h
    return vocab * h + layers * (attn + 3 * h * inter + 2 * h) + h


def test_the_3b_shape_has_qwen25_3bs_layers_with_the_embedded_vocabulary(model_dir, tmp_path):
    d = model_io.shaped_copy(model_dir, tmp_path / "p", "qwen2.5-3b")
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["tie_word_embeddings"]) == \
        ("qwen2", 2048, 36, 16, 2, 11008, True)
    embedded = json.loads((Path(model_dir) / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["eos_token_id"]) == (embedded["vocab_size"], embedded["eos_token_id"]) == (49152, 2)
    shapes = config_shapes(d)  # on the meta device: no 11 GiB of weights made
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert total == _qwen2_params(49152, 2048, 36, 16, 2, 11008) == 2_875_437_056
    assert "lm_head.weight" not in shapes and shapes["model.layers.0.self_attn.k_proj.weight"] == (256, 2048)
    # the tokenizer travels, the embedded model's weights and provenance do not
    assert (d / "tokenizer.json").is_file() and not list(d.glob("*.safetensors")) and not (d / "source.json").exists()
    with pytest.raises(ValueError, match="unknown"):
        model_io.shaped_copy(model_dir, tmp_path / "q", "qwen2.5-300b")


def test_dummy_weights_are_seeded_alike_for_policy_and_reference_and_shaped_as_the_config_says(model_dir, tmp_path):
    d = model_io.shaped_copy(model_dir, tmp_path / "p", "tiny-qwen2")
    a = model_io.load_policy(d, load_format="dummy")
    b = model_io.load_reference(d, "float32", torch.float32, load_format="dummy")
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # the reference policy starts equal to the policy
    assert {k: tuple(v.shape) for k, v in sa.items() if k != "lm_head.weight"} == config_shapes(d)
    assert sum(p.numel() for p in a.parameters()) == _qwen2_params(49152, 512, 2, 8, 1, 1376)
    assert float(sa["model.layers.0.mlp.up_proj.weight"].std()) > 0  # random, not zeros
    with pytest.raises(OSError):  # without dummy, a directory with no weights is refused
        model_io.load_policy(d)


def test_model_dummy_without_an_engine_dummy_is_refused_when_the_config_loads():
    from agent_rl.config import ConfigError, TrainConfig, load_config

    with pytest.raises(ConfigError, match="rollout.load_format=dummy"):
        load_config(TrainConfig, None, ["actor_rollout_ref.model.load_format=dummy"])
    with pytest.raises(ConfigError, match="load_format='random'"):
        load_config(TrainConfig, None, ["actor_rollout_ref.rollout.load_format=random"])
    cfg = load_config(TrainConfig, None, ["actor_rollout_ref.model.load_format=dummy",
                                          "actor_rollout_ref.rollout.load_format=dummy"])
    assert cfg.actor_rollout_ref.model.load_format == cfg.actor_rollout_ref.rollout.load_format == "dummy"


def test_steps_per_hour_by_hand():
    from benchmarks import scale

    assert scale.trajectories_per_device() == 512 * 5 // 8 == 320
    r = {"sampled_per_traj": 100.0, "tokens_per_traj": 500.0, "rollout_tok_s": 1000.0, "update_tok_s": 2000.0,
         "logprob_tok_s": 8000.0, "sync_s": 3.0}
    g = scale.steps_per_hour(r, 320)
    # rollout 320 x 100 / 1000 = 32 s; train 320 x 500 x (1/2000 + 2/8000) = 120 s; + 3 s sync
    assert (g["rollout_s"], g["train_s"], g["step_s"]) == pytest.approx((32.0, 120.0, 155.0))
    assert g["steps_per_hour"] == pytest.approx(3600 / 155)


@pytest.mark.slow
def test_the_command_runs_the_tiny_shape_on_the_cpu_and_the_synced_engine_agrees_with_the_trainer(model_dir, tmp_path):
    out = tmp_path / "scale.json"
    # fp32 on both sides on every host kind (`auto` picks bf16 where it is native): the gap then is rounding only
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--shape", "tiny-qwen2", "--quick",
                           "--dtype", "float32", "--json", str(out), "--record-dir", str(tmp_path / "rec")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["params"] == _qwen2_params(49152, 512, 2, 8, 1, 1376) and r["shape"] == "tiny-qwen2"
    # the engine's random weights were replaced by the trainer's: fp32 on both sides, equal log-probs
    assert r["engine_dtype"] == "float32" and r["sync_logprob_gap"] < 1e-4
    assert r["trajectories"] == 8 and r["sampled_per_traj"] > 0 and r["tokens_per_traj"] > r["sampled_per_traj"]
    for k in ("rollout_tok_s", "plain_tok_s", "update_tok_s", "bare_tok_s", "logprob_tok_s", "sync_s",
              "engine_gib", "trainer_peak_gib"):
        assert r[k] > 0, k
    assert r["grpo"] == pytest.approx(__import__("benchmarks.scale", fromlist=["x"]).steps_per_hour(r, 320))
    assert "| GRPO steps per hour |" in proc.stdout and "tiny-qwen2-shaped policy" in proc.stdout
    rec = json.loads((tmp_path / "rec" / "record.json").read_text())
    assert rec["benchmark"] == "benchmarks/scale.py" and "weight sync" in rec["headline"]
