"""vLLM's CUDA engine inside the project (docs/gpu.md, "The loop on a GPU"):

- stage a: the project's engine class (`RolloutEngine`, in-process backend) generates on CUDA
  with the embedded policy's real weights;
- stage b: the trainer's weight sync on GPUs: an actor worker (Ray, its share of GPU 0) takes
  one update, `WeightSync` pushes its weights by CUDA IPC into the rollout worker's running
  engine, and the engine's log-probs of what it then generates equal the trainer's for the
  same tokens (bf16 on both sides: within bf16 tolerance), and differ from before the push.

Skipped without CUDA, vLLM or Ray. The policy is `artifacts/model` where `make setup` (or
`agent-rl-prep model`) prepared it, else $AGENT_RL_GPU_POLICY (tests/gpu/conftest.py).
"""

from __future__ import annotations

import asyncio
import functools

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm")
ray = pytest.importorskip("ray")

PROMPTS = ["Question: In which city was the founder of the Velmora Institute born? Answer:",
           "The capital of France is", "List three colours:"]
GPU_SHARE = "0.25"
"""vLLM's fraction of the GPU here: the in-process engine of stage a and the rollout worker's
of stage b are never up together, and each leaves room for the actor."""
TOKENS = 24
"""Every comparison is over the same 24 greedy tokens (EOS ignored): a mean over one token is
one token's rounding (the first H200 run compared 1 token after the push: 0.057 nats)."""
BF16_MEAN, BF16_MAX = 0.1, 0.5
"""|engine - trainer| log-prob per token, bf16 engine (bf16 weights) vs bf16-autocast trainer
(fp32 weights, bf16 matmuls): the same function rounded twice, bf16 keeping 8 bits of each
number (0.019 nats mean on a CPU with real text, 0.037 on 4 tokens on the H200, docs/gpu.md).
The push must move the engine by more than three times what rounding explains."""


def _cfg(policy, **over):
    from agent_rl.config import TrainConfig, load_config

    args = {
        "actor_rollout_ref.model.path": policy,
        "actor_rollout_ref.rollout.dtype": "bfloat16",
        "actor_rollout_ref.rollout.gpu_memory_utilization": GPU_SHARE,
        "actor_rollout_ref.rollout.n": "1",
        "actor_rollout_ref.actor.optim.lr": "1e-4",
        "actor_rollout_ref.actor.optim.weight_decay": "0",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.bf16_autocast": "true",
        "data.max_prompt_length": "256",
        "data.max_response_length": "64",
        "retriever.url": "[]",
        "trainer.n_gpus_per_node": "1",
        **over,
    }
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in args.items()])


def test_the_engine_class_generates_on_cuda(policy_dir):
    from transformers import AutoTokenizer

    from agent_rl.rollout.engine import RolloutEngine, Sampling

    cfg = _cfg(str(policy_dir))
    tok = AutoTokenizer.from_pretrained(str(policy_dir))

    async def go():
        engine = await RolloutEngine.create(str(policy_dir), cfg.actor_rollout_ref.rollout, max_model_len=512)
        try:
            greedy = Sampling(max_tokens=24, temperature=0.0, stop=())
            outs = await asyncio.gather(*(engine.generate(tok(p)["input_ids"], greedy) for p in PROMPTS))
            again = await engine.generate(tok(PROMPTS[1])["input_ids"], greedy)
            return outs, again
        finally:
            await engine.shutdown()

    outs, again = asyncio.run(go())
    for p, out in zip(PROMPTS, outs):
        text = tok.decode(out.token_ids)
        print(f"[engine on cuda] {p!r} -> {text!r}")
        assert 0 < len(out.token_ids) <= 24 and len(out.logprobs) == len(out.token_ids)
        assert all(lp <= 0.0 for lp in out.logprobs) and text.strip()
    assert again.token_ids == outs[1].token_ids  # greedy is deterministic
    assert "paris" in tok.decode(outs[1].token_ids).lower()  # the real weights, not random ones


def _batch_of(prompt_ids, result, advantage: float = 0.0):
    from agent_rl.training.batch import TokenBatch
    from agent_rl.types import Trajectory

    traj = Trajectory(prompt_ids, list(result.token_ids), [1] * len(result.token_ids), list(result.logprobs))
    batch = TokenBatch.from_trajectories([traj])
    return batch.with_fields(advantages=torch.full_like(batch.loss_mask, advantage) * batch.loss_mask)


def _gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    d = (a.float() - b.float()).abs()
    return float(d.mean()), float(d.max())


def test_cuda_ipc_push_makes_engine_logprobs_equal_the_trainers(policy_dir):
    from transformers import AutoTokenizer

    from agent_rl.training.ray_workers import WorkerGroup, make_rollout_worker
    from agent_rl.training.weight_sync import WeightSync
    from agent_rl.training.workers.actor import ActorWorker

    cfg = _cfg(str(policy_dir))
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False)
    rollout = make_rollout_worker(cfg)
    actor = WorkerGroup(cfg, functools.partial(ActorWorker, cfg.actor_rollout_ref, 10), 1)
    try:
        sync = WeightSync(actor, rollout, "cuda_ipc")
        prompt_ids = AutoTokenizer.from_pretrained(str(policy_dir))(PROMPTS[0])["input_ids"]

        before = ray.get(rollout.generate.remote(prompt_ids, TOKENS, ignore_eos=True))
        batch = _batch_of(prompt_ids, before, advantage=1.0)
        n = len(before.token_ids)
        assert n == TOKENS
        gap0 = _gap(actor.per_token(ActorWorker.compute_log_probs, batch)[0, :n], torch.tensor(before.logprobs))
        print(f"\n[weight sync] before the push: engine vs trainer mean {gap0[0]:.4f} max {gap0[1]:.4f} nats")
        assert gap0[0] < BF16_MEAN and gap0[1] < BF16_MAX

        metrics = actor.update(ActorWorker.update_policy, batch.with_fields(old_logprobs=actor.per_token(ActorWorker.compute_log_probs, batch)))
        assert metrics["actor/grad_norm"] > 0
        first = sync.push(version=1)
        again = sync.push(version=1)
        print(f"[weight sync] cuda_ipc push: first {first:.3f}s, again {again:.3f}s "
              f"(engine side {sync.last_engine_seconds:.3f}s)")

        after = ray.get(rollout.generate.remote(prompt_ids, TOKENS, ignore_eos=True))
        batch_after = _batch_of(prompt_ids, after)
        m = len(after.token_ids)
        assert m == TOKENS
        engine_after = torch.tensor(after.logprobs)
        gap1 = _gap(actor.per_token(ActorWorker.compute_log_probs, batch_after)[0, :m], engine_after)
        moved = _gap(actor.per_token(ActorWorker.compute_ref_log_probs, batch_after)[0, :m], engine_after)
        print(f"[weight sync] after: engine vs trainer mean {gap1[0]:.4f} max {gap1[1]:.4f}; "
              f"engine vs the weights before the push: mean {moved[0]:.4f} max {moved[1]:.4f}")
        assert gap1[0] < BF16_MEAN and gap1[1] < BF16_MAX
        assert moved[0] > 3 * max(gap1[0], gap0[0])  # the engine really runs the pushed weights
    finally:
        ray.get(rollout.shutdown.remote())
        ray.kill(rollout)
        actor.shutdown()
