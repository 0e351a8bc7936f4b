"""Ray worker groups: 2 data-parallel actor ranks (gloo through the rank-0 rendezvous) give
the same per-token results, in batch order, as 1 rank, and run a collective update."""

from __future__ import annotations

import functools
import os
import math
import operator

import pytest
import torch

from agent_rl.rollout.retrieval_client import RetrieverClient, server_base_url
from local_ray import ray_up


def test_retriever_urls_accept_search_r1_and_base_forms():
    urls = ["http://h:8000/retrieve", "http://g:9/", "http://k:1"]
    assert [server_base_url(u) for u in urls] == ["http://h:8000", "http://g:9", "http://k:1"]
    assert RetrieverClient(urls).urls == ["http://h:8000", "http://g:9", "http://k:1"]
    with pytest.raises(ValueError, match="must start with http"):
        server_base_url("h:8000/retrieve")


def _batch():
    from agent_rl.training.batch import TokenBatch
    from agent_rl.types import Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, (p, r) in enumerate([(5, 9), (7, 3), (4, 12), (6, 6), (3, 2)]):
        ids = torch.randint(10, 5000, (p + r,), generator=g).tolist()
        mask = [1] * r
        mask[r // 2] = 0  # an observation token in the middle
        trajs.append(Trajectory(ids[:p], ids[p:], mask, [0.0] * r, group_id=i // 2))
    batch = TokenBatch.from_trajectories(trajs)
    return batch.with_fields(advantages=batch.loss_mask * torch.linspace(-1, 1, len(trajs))[:, None])


@pytest.mark.ray
def test_two_ranks_match_one_rank(tiny_policy):
    """On the 2-block copy of the embedded policy (the subject is rows, order and the collective
    update, not what the model knows): each rank loads it and takes an Adam step."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.ray_workers import WorkerGroup
    from agent_rl.training.workers.actor import ActorWorker

    ray_up()
    # fp32 on every host kind (`auto` picks bf16 where it is native): the check is rows and
    # order, and bf16 rounds two packings' log-probs differently by more than its 1e-4
    cfg = load_config(TrainConfig, None, [f"actor_rollout_ref.model.path={tiny_policy}", "actor_rollout_ref.rollout.n=1",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=5",
                                          "actor_rollout_ref.actor.bf16_autocast=false"])
    factory = functools.partial(ActorWorker, cfg.actor_rollout_ref, 10)
    batch = _batch()

    # the one-rank reference in this process (a group of one is every trainer run's actor): the
    # same worker class on the whole batch, without a third Ray worker to start
    ref = factory().compute_log_probs(batch)
    two = WorkerGroup(cfg, factory, 2)
    try:
        got = two.per_token(ActorWorker.compute_log_probs, batch)
        assert got.shape == ref.shape
        valid = batch.response_valid_mask().bool()
        assert torch.allclose(got[valid], ref[valid], atol=1e-4)  # same rows, same order
        assert (got[~valid] == 0).all()
        metrics = two.update(ActorWorker.update_policy, batch.with_fields(old_logprobs=got))
        assert metrics["actor/grad_norm"] > 0 and all(math.isfinite(v) for v in metrics.values())
    finally:
        two.shutdown()


@pytest.mark.ray
def test_fsdp_group_exports_full_weights_from_rank0(tiny_policy):
    """Under FSDP the export gathers shards collectively: every rank must join rank 0's export
    (rank 0 alone waited for ever: seen while bringing up the GPU path, docs/gpu.md). Gloo here."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.ray_workers import WorkerGroup
    from agent_rl.training.weight_sync import unpack_weights
    from agent_rl.training.workers import model_io
    from agent_rl.training.workers.actor import ActorWorker

    ray = ray_up()
    cfg = load_config(TrainConfig, None, [f"actor_rollout_ref.model.path={tiny_policy}", "actor_rollout_ref.rollout.n=1",
                                          "actor_rollout_ref.actor.strategy=fsdp",
                                          "actor_rollout_ref.actor.bf16_autocast=false"])
    group = WorkerGroup(cfg, functools.partial(ActorWorker, cfg.actor_rollout_ref, 10), 2)
    try:
        assert group.call_all(operator.attrgetter("fsdp")) == [True, True]
        packed = ray.get(group.export_weights("object_store"), timeout=300)
    finally:
        group.shutdown()
    got = dict(unpack_weights(packed))
    want = dict(model_io.named_weights(model_io.load_policy(tiny_policy)))
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].shape == tensor.shape and torch.equal(got[name], tensor), name


def test_a_group_is_asked_by_the_method_not_its_name():
    """A worker method's name in a string would fail only on a remote rank, after the group
    started; the group refuses it in the driver (`ActorWorker.update_policy` is the form)."""
    from agent_rl.training.ray_workers import _checked
    from agent_rl.training.workers.actor import ActorWorker

    assert _checked(ActorWorker.update_policy) is ActorWorker.update_policy
    assert _checked(operator.attrgetter("fsdp"))(type("W", (), {"fsdp": True})()) is True
    with pytest.raises(TypeError, match="ActorWorker.update_policy, not 'update_policy'"):
        _checked("update_policy")


@pytest.mark.ray
def test_a_local_ray_node_starts_no_idle_workers_ahead():
    """init_ray's own node (RAY_* of no_ray_prestart, read by the raylet): no worker process
    before the first actor, one with it; Ray's default would start one per CPU ahead, which
    our actors (the job's runtime_env) never use."""
    from fresh import run_fresh

    code = """if True:
        import os, time, psutil, ray
        from agent_rl.training.ray_workers import init_ray
        def workers():  # worker processes by title (ray::IDLE, ray::A); not the node's agents
            names = [p.name() for p in psutil.Process().children(recursive=True)]
            return sorted(n for n in names if n.startswith("ray::") and not n.endswith("Agent"))
        init_ray(None)
        time.sleep(3)
        before = workers()
        @ray.remote
        class A:
            def ping(self):
                return os.getpid()
        a = A.remote()
        ray.get(a.ping.remote())
        print("workers", before, workers())
        ray.shutdown()
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_memory_usage_threshold"}
    out = run_fresh(code, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "workers [] ['ray::A']" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
