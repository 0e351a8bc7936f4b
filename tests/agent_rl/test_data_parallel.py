"""Data parallelism: 2 worker processes (gloo, CPU) on the two token-balanced shards of a batch
give the same gradient, metrics and parameters after a step as 1 worker on the whole batch.

Both strategies are checked: "replicas" (the CPU default: full copies, one gradient
all-reduce per optimizer step) and "fsdp" (FSDP2, the GPU path, which also runs on gloo).
The model is the 2-block truncated copy of the embedded model (real weights), in fp32, so only
summation order differs. The gradient is compared directly as well as the parameters: after
one Adam step the parameters are nearly blind to a wrong gradient *scale* (Adam normalises
it away), the gradient and its norm are not.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.multiprocessing as mp

from agent_rl.config import ActorRolloutRefConfig
from agent_rl.training.batch import TokenBatch, shard
from agent_rl.training.workers import dist as wdist
from agent_rl.training.workers.actor import ActorWorker
from agent_rl.types import Trajectory


LR = 1e-3
"""The optimizer's lr in these tests: it also bounds how far one Adam step moves an element."""


def make_cfg(path: str, strategy: str) -> ActorRolloutRefConfig:
    cfg = ActorRolloutRefConfig()
    cfg.model.path = path
    cfg.rollout.n = 2
    cfg.actor.ppo_mini_batch_size = 4  # the whole batch of 8 sequences: one optimizer step
    cfg.actor.ppo_max_token_len_per_gpu = 70  # several micro-batches per rank
    cfg.actor.bf16_autocast = False
    cfg.actor.use_kl_loss = True
    cfg.actor.entropy_coeff = 0.01
    cfg.actor.optim.lr = LR
    cfg.actor.strategy = strategy
    return cfg


def assert_same_adam_step(got: dict, want: dict, lr: float = LR) -> None:
    """Parameters after one Adam step from the same start and (to summation order) the same
    gradient: equal to 1e-6, except on the few elements whose gradient is at the noise level
    of Adam's eps, where a changed summation order (another packing, another ISA's kernels)
    flips the first step's lr * g / (|g| + eps); such an element moves by at most 2 * lr."""
    bad = total = 0
    for name, p in want.items():
        d = (got[name] - p).abs()
        assert d.max() <= 2 * lr + 1e-6, name
        bad, total = bad + int((d > 1e-6).sum()), total + d.numel()
    assert bad <= 1e-4 * total, f"{bad} of {total} parameters differ by more than 1e-6"


def make_batch() -> TokenBatch:
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(8):
        p, r = int(torch.randint(4, 16, (1,), generator=g)), int(torch.randint(6, 40, (1,), generator=g))
        mask = [0 if (i % 2 == 0 and 2 <= j < 6) else 1 for j in range(r)]
        ids = torch.randint(3, 49000, (p + r,), generator=g).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask,
                                rollout_logprobs=[0.0] * r, group_id=i // 2))
    b = TokenBatch.from_trajectories(trajs)
    valid = b.response_valid_mask()
    adv = torch.randn(8, 1, generator=g).expand_as(valid) * valid
    old = -5.0 + torch.randn(valid.shape, generator=g) * valid  # off-policy: ratios != 1
    ref = -5.0 + torch.randn(valid.shape, generator=g) * valid
    return b.with_fields(advantages=adv.contiguous(), old_logprobs=old, ref_logprobs=ref)


def step(worker: ActorWorker, batch: TokenBatch) -> dict:
    """This rank's view after: the summed gradient (before the step), metrics, parameters."""
    worker.optim.optimizer.zero_grad(set_to_none=True)
    worker._backward(batch, functools.partial(worker._ppo_loss, reuse_old=False))
    if not worker.fsdp:
        wdist.sum_gradients(worker.optim.params)
    grad = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in worker.optim.params]
    grad = torch.cat([g.flatten() for g in grad]).clone()
    worker.optim.optimizer.zero_grad(set_to_none=True)
    metrics = worker.update_policy(batch)
    params = {k: v.clone() for k, v in worker.named_weights_for_sync()}
    return {"grad": grad, "metrics": metrics, "params": params}


STRATEGIES = ("replicas", "fsdp")


def _rank_main(rank: int, world: int, ports: list[int], model: str, outs: list[str]) -> None:
    """One rank of each strategy in turn (a process group each): one pair of processes for both."""
    torch.set_num_threads(1)
    for strategy, port, out in zip(STRATEGIES, ports, outs):
        worker = ActorWorker(make_cfg(model, strategy), total_steps=2, rank=rank, world_size=world,
                             init_method=f"tcp://127.0.0.1:{port}")
        result = step(worker, shard(make_batch(), rank, world))
        worker.save(out + ".ckpt")  # collective under FSDP
        if rank == 0:
            torch.save(result, out)
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tiny_policy, tmp_path_factory) -> dict[str, str]:
    """strategy -> rank 0's view (and beside it the group's checkpoint) after one step of 2 ranks."""
    d = tmp_path_factory.mktemp("two_ranks")
    outs = [str(d / f"{s}.pt") for s in STRATEGIES]
    mp.spawn(_rank_main, args=(2, [wdist.free_port() for _ in STRATEGIES], str(tiny_policy), outs), nprocs=2, join=True)
    return dict(zip(STRATEGIES, outs))


@pytest.fixture(scope="module")
def single(tiny_policy):
    """1 worker on the whole batch: the reference (the worker, and what `step` saw)."""
    worker = ActorWorker(make_cfg(str(tiny_policy), "replicas"), total_steps=2)
    return worker, step(worker, make_batch())


def adam_moments(worker: ActorWorker) -> torch.Tensor:
    state = worker.optim.optimizer.state
    return torch.cat([state[p]["exp_avg"].flatten() for p in worker.optim.params])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_workers_equal_one(tiny_policy, single, two_ranks, strategy):
    out = two_ranks[strategy]
    shards = [shard(make_batch(), r, 2) for r in range(2)]
    assert all(len(s) for s in shards) and len(shards[0]) + len(shards[1]) == 8
    two = torch.load(out, weights_only=False)
    single_worker, single = single

    g1, g2 = single["grad"], two["grad"]
    assert (g2 - g1).norm() <= 1e-5 * g1.norm()
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"):
        assert two["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-4, abs=1e-6), key
    assert set(two["params"]) == set(single["params"]) and single["params"]
    assert_same_adam_step(two["params"], single["params"])

    # the group's checkpoint (gathered from shards under FSDP) resumes in a single worker:
    # same weights and the same Adam moments as the worker that saw the whole batch
    resumed = ActorWorker(make_cfg(str(tiny_policy), "replicas"), total_steps=2)
    resumed.load(str(out) + ".ckpt")
    assert resumed.num_updates == 1
    assert_same_adam_step({i: p.detach() for i, p in enumerate(resumed.optim.params)},
                          {i: q.detach() for i, q in enumerate(single_worker.optim.params)})
    m1, m2 = adam_moments(single_worker), adam_moments(resumed)
    assert (m2 - m1).norm() <= 1e-5 * m1.norm()


def _group_of_one_main(rank: int, port: int, model: str, out: str) -> None:
    torch.set_num_threads(1)
    assert not wdist.use_fsdp("fsdp")  # a lone worker without a process group: nothing to shard with
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    worker = ActorWorker(make_cfg(model, "fsdp"), total_steps=2)
    assert worker.fsdp and not wdist.use_fsdp("auto")  # auto: FSDP on multi-GPU runs only
    torch.save(step(worker, make_batch()), out)
    torch.distributed.destroy_process_group()


def test_fsdp_over_a_group_of_one_equals_the_plain_worker(tiny_policy, single, tmp_path):
    """strategy=fsdp with one rank (FSDP2's mixed precision on a single GPU, docs/gpu.md):
    the same gradient and parameters as the plain worker."""
    out = tmp_path / "one.pt"
    mp.spawn(_group_of_one_main, args=(wdist.free_port(), str(tiny_policy), str(out)), nprocs=1, join=True)
    one, (_, ref) = torch.load(out, weights_only=False), single
    assert (one["grad"] - ref["grad"]).norm() <= 1e-5 * ref["grad"].norm()
    assert_same_adam_step(one["params"], ref["params"])


def test_collectives_put_their_tensors_where_the_backend_reduces(monkeypatch):
    """NCCL reduces CUDA tensors only: the metric all-reduces used CPU tensors and failed on
    GPUs ("No backend type associated with device type cpu", seen on an H100)."""
    monkeypatch.setattr(wdist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(wdist.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert wdist.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(wdist.dist, "get_backend", lambda group=None: "gloo")
    assert wdist.collective_device() == torch.device("cpu")
