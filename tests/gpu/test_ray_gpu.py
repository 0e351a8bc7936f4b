"""The trainer's GPU placement with Ray: the actor and critic workers take their shares of
GPU 0 through the placement group of `ray_workers._placement` (GPU_SHARE, as veRL colocates
them), train there, and the actor's weights reach a third GPU actor of the same bundle, the
rollout engine's seat, by CUDA IPC (`WeightSync`'s transport on GPUs). vLLM's CUDA wheel is
too large to travel to a lent GPU machine, so that seat is taken by a stand-in that loads what
the engine would be handed; skipped where Ray is not installed."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.ray, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ray = pytest.importorskip("ray")


class EngineSeat:
    """Where the rollout worker sits: receives the payload WeightSync pushes and loads it."""

    def load(self, payload, transport: str):
        from agent_rl.training.weight_sync import get_transport

        named = get_transport(transport).load(payload)
        sums = {k: float(t.cpu().double().sum()) for k, t in named}
        return sums, sorted({t.device.type for _, t in named}), [str(g) for g in ray.get_gpu_ids()]


def test_actor_and_critic_share_the_gpu_and_weights_reach_the_engine_seat(tiny_policy):
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training import ray_workers
    from agent_rl.training.ray_workers import WorkerGroup
    from agent_rl.training.workers.actor import ActorWorker
    from agent_rl.training.workers.critic import CriticWorker
    from agent_rl.training.batch import TokenBatch
    from agent_rl.types import Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = [Trajectory(prompt_ids=torch.randint(3, 49000, (12,), generator=g).tolist(),
                        response_ids=torch.randint(3, 49000, (40,), generator=g).tolist(), loss_mask=[1] * 40,
                        rollout_logprobs=[0.0] * 40, reward=float(i % 2), group_id=i // 2) for i in range(8)]
    batch = TokenBatch.from_trajectories(trajs)
    cfg = load_config(TrainConfig, None, [
        f"actor_rollout_ref.model.path={tiny_policy}", "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8"])
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False)
    try:
        actor = WorkerGroup(cfg, functools.partial(ActorWorker, cfg.actor_rollout_ref, 10), 1)
        critic = WorkerGroup(cfg, functools.partial(CriticWorker, cfg, 10), 1, "critic")
        assert str(actor.rank0(operator.attrgetter("device"))).startswith("cuda")
        assert str(critic.rank0(operator.attrgetter("device"))).startswith("cuda")
        metrics = actor.update(ActorWorker.update_sft, batch)
        assert metrics["sft/loss"] > 0
        values = critic.per_token(CriticWorker.compute_values, batch)
        assert values.shape == batch.loss_mask.shape and torch.isfinite(values).all()

        seat = ray.remote(EngineSeat).options(**ray_workers._placement(cfg, "rollout", 0)).remote()
        sums, devices, gpu_ids = ray.get(seat.load.remote(actor.export_weights("cuda_ipc"), "cuda_ipc"), timeout=300)
        want = {k: float(t.double().sum()) for k, t in actor.rank0(ActorWorker.named_weights_for_sync)}
        assert sums == want and devices == ["cuda"] and gpu_ids == ["0"]
        # the three seats fill GPU 0's bundle of the placement group: 0.4 + 0.4 + 0.2
        bundle = {k: v for k, v in ray.cluster_resources().items() if k.startswith("GPU_group_0_")}
        assert bundle and all(v == pytest.approx(1.0) for v in bundle.values())
        assert all(ray.available_resources().get(k, 0.0) == pytest.approx(0.0, abs=1e-6) for k in bundle)
    finally:
        ray.shutdown()
        ray_workers._GPU_GROUP.clear()
