"""Weight sync: packing round trip (unit) and the real push into a running vLLM engine."""

from __future__ import annotations

import pytest
import torch

from agent_rl.training.weight_sync import pack_weights, unpack_weights
from agent_rl.training.workers.actor import ActorWorker
from local_ray import ray_up


def test_pack_unpack_round_trip_keeps_names_shapes_dtypes_and_values():
    named = [
        ("a.weight", torch.randn(3, 4)),
        ("b.bias", torch.randn(5)),
        ("c.weight", torch.randn(2, 2).to(torch.bfloat16)),
        ("d.scalar", torch.tensor(1.5)),
    ]
    packed = pack_weights(named)
    assert set(packed.buffers) == {"float32", "bfloat16"}
    assert packed.buffers["float32"].size == 12 + 5 + 1  # one flat buffer per dtype
    out = unpack_weights(packed)
    assert [n for n, _ in out] == [n for n, _ in named]
    for (_, a), (_, b) in zip(named, out):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ----------------------------------------------------------------------------- integration
PROMPT = "Question: In which city was the founder of the Velmora Institute born? Answer:"


@pytest.fixture(scope="module")
def sync_setup(model_dir, tmp_path_factory):
    """A real Ray actor group (1 full fine-tuning actor, big lr so one update moves the
    weights visibly) and a real fp32 vLLM engine in a rollout worker."""
    import functools

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.ray_workers import WorkerGroup, make_rollout_worker
    from agent_rl.training.weight_sync import WeightSync
    from agent_rl.training.workers.actor import ActorWorker

    cfg = load_config(
        TrainConfig,
        None,
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.rollout.kv_cache_space_gb=0.25",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            "actor_rollout_ref.actor.optim.weight_decay=0",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.bf16_autocast=false",
            "data.max_prompt_length=256",
            "data.max_response_length=64",
            "retriever.url=[]",
        ],
    )
    ray = ray_up()
    rollout = make_rollout_worker(cfg)
    actor = WorkerGroup(cfg, functools.partial(ActorWorker, cfg.actor_rollout_ref, 10), 1)
    yield cfg, rollout, actor, WeightSync(actor, rollout)
    ray.get(rollout.shutdown.remote())
    ray.kill(rollout)
    actor.shutdown()


def _batch_of(tokenizer_ids: list[int], result, advantage: float = 0.0):
    from agent_rl.training.batch import TokenBatch
    from agent_rl.types import Trajectory

    traj = Trajectory(tokenizer_ids, list(result.token_ids), [1] * len(result.token_ids), list(result.logprobs))
    batch = TokenBatch.from_trajectories([traj])
    return batch.with_fields(advantages=torch.full_like(batch.loss_mask, advantage) * batch.loss_mask)


@pytest.mark.slow
def test_push_makes_engine_logprobs_equal_the_trainers(sync_setup, model_dir):
    import ray
    from transformers import AutoTokenizer

    cfg, rollout, actor, sync = sync_setup
    prompt_ids = AutoTokenizer.from_pretrained(str(model_dir))(PROMPT)["input_ids"]

    # Before any update: engine (fp32) == trainer (fp32) on the engine's own greedy ids.
    before = ray.get(rollout.generate.remote(prompt_ids, 24))
    batch = _batch_of(prompt_ids, before, advantage=1.0)
    trainer_before = actor.per_token(ActorWorker.compute_log_probs, batch)[0, : len(before.token_ids)]
    assert torch.allclose(trainer_before, torch.tensor(before.logprobs), atol=1e-4), (trainer_before, before.logprobs)

    # One real policy update (raise the likelihood of these ids), then push.
    metrics = actor.update(ActorWorker.update_policy, batch.with_fields(old_logprobs=actor.per_token(ActorWorker.compute_log_probs, batch)))
    assert metrics["actor/grad_norm"] > 0
    first = sync.push()
    print(f"\n[weight sync] first push ({sync.transport}): {first:.2f}s, engine side {sync.last_engine_seconds:.2f}s")
    again = sync.push()  # what every training step pays (object store already warm)
    print(f"[weight sync] steady-state push: {again:.2f}s, engine side {sync.last_engine_seconds:.2f}s")

    after = ray.get(rollout.generate.remote(prompt_ids, 24))
    batch_after = _batch_of(prompt_ids, after)
    trainer_after = actor.per_token(ActorWorker.compute_log_probs, batch_after)[0, : len(after.token_ids)]
    engine_after = torch.tensor(after.logprobs)
    assert torch.allclose(trainer_after, engine_after, atol=1e-4), (trainer_after - engine_after).abs().max()
    # ...and differ from what the engine computed before the push (= the reference policy,
    # which the first check tied to the pre-push engine).
    ref_after = actor.per_token(ActorWorker.compute_ref_log_probs, batch_after)[0, : len(after.token_ids)]
    assert (ref_after - engine_after).abs().max() > 1e-2
    # the update raised the likelihood of the reinforced ids
    if after.token_ids == before.token_ids:
        assert engine_after.sum() > torch.tensor(before.logprobs).sum()
