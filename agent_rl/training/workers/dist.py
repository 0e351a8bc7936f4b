"""torch.distributed for the worker groups: gloo on CPU, NCCL (+ FSDP2) on GPUs.

Data parallelism here is deliberately plain. Each rank trains on its token-balanced shard of
the batch (`agent_rl.training.batch.shard`); loss normalisers (sampled tokens, sequences) are summed
over ranks for every mini-batch, so each rank's gradient is its exact share of the global one
and the ranks SUM their gradients (not average): 2 workers on half the data each make the same
update as 1 worker on all of it. On CPU each rank holds a full replica and sums gradients with
one flat all-reduce per optimizer step ("replicas"); on GPUs the model is sharded with FSDP2
and the loss is multiplied by the world size to undo FSDP's gradient averaging ("fsdp", which
also runs on gloo, so the CPU tests cover it).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)


def free_port() -> int:
    """A free TCP port on this host, for `init_method=f"tcp://127.0.0.1:{port}"`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_for(rank: int) -> torch.device:
    """cuda:<local rank> when GPUs are visible, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def autocast_dtype(setting: object, device: torch.device) -> torch.dtype | None:
    """bf16 when `setting` (auto | true | false) resolves to autocast on `device`, else None (fp32).
    auto asks data_prep.hardware: emulated bf16 is up to 12x slower per training step."""
    from data_prep.hardware import resolve_autocast

    on, why = resolve_autocast(setting, device.type)
    log.info("training precision: %s", why)
    return torch.bfloat16 if on else None


def init(rank: int, world_size: int, init_method: str | None) -> None:
    """Join the process group (no-op for a single worker or when already initialised).

    `init_method` None means env:// (MASTER_ADDR / MASTER_PORT set by the launcher).
    """
    if world_size <= 1 or dist.is_initialized():
        return
    if init_method is None:
        if "MASTER_ADDR" not in os.environ:
            raise ValueError("dist.init: world_size > 1 needs init_method (tcp://host:port) or MASTER_ADDR/MASTER_PORT")
        init_method = "env://"
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device_for(rank))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(minutes=30))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


STRATEGIES = ("auto", "fsdp", "replicas")


def use_fsdp(strategy: str) -> bool:
    """Whether to shard with FSDP2: "auto" = on multi-GPU runs only (CPU ranks keep full
    replicas and sum gradients once per step), "fsdp" / "replicas" force a choice. "fsdp"
    also applies to a process group of one (FSDP2's mixed precision on a single GPU), but
    not without a process group: a lone worker has nothing to shard with."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {list(STRATEGIES)}")
    if strategy == "replicas":
        return False
    if strategy == "fsdp":
        return dist.is_initialized()
    return world_size() > 1 and torch.cuda.is_available()


def decoder_layer_types(model: nn.Module) -> tuple[type, ...]:
    """Classes of the transformer blocks (HF `_no_split_modules`), the FSDP wrap units."""
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    types = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    if not types:
        raise ValueError(f"no transformer block classes found for FSDP in {type(model).__name__}")
    return types


def wrap_fsdp(model: nn.Module, layer_types: tuple[type, ...], param_dtype: torch.dtype | None,
              fp32_modules: tuple[nn.Module, ...] = ()) -> nn.Module:
    """FSDP2: shard each transformer block, then the root. `param_dtype` (e.g. bf16) is the
    compute dtype of gathered parameters; gradients are reduced in fp32. `fp32_modules` (e.g.
    the critic's value head) are sharded on their own and keep fp32 parameters: under the
    root's policy they would be cast to `param_dtype` too."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for module in model.modules():
        if isinstance(module, layer_types):
            fully_shard(module, mp_policy=mp)
    for module in fp32_modules:
        fully_shard(module, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
    fully_shard(model, mp_policy=mp)
    return model


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Full (unsharded, CPU) model and optimizer state, keyed by parameter name, for plain
    and FSDP models alike (collective under FSDP), so checkpoints move between strategies."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=opts)


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict | None,
                    optim_sd: dict | None) -> None:
    """Inverse of `full_state`: every rank passes the full dicts, each keeps its shard.
    A None dict leaves that part as it is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, strict=True)
    if model_sd is not None:
        set_model_state_dict(model, model_sd, options=opts)
    if optim_sd is not None:
        set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def collective_device() -> torch.device:
    """Where small tensors for a collective must live: NCCL reduces CUDA tensors only
    (a CPU tensor fails with "No backend type associated with device type cpu")."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64); the values themselves when alone."""
    if world_size() <= 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float]) -> list[float]:
    """Element-wise max over ranks."""
    if world_size() <= 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def sum_gradients(params: list[nn.Parameter]) -> None:
    """Sum .grad over ranks in one flat buffer (replica data parallelism; no-op alone).

    Parameters without a gradient on this rank (e.g. an empty shard) count as zeros, so
    every rank enters the same collective.
    """
    if world_size() <= 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        summed = flat[offset : offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = summed.clone()
        else:
            p.grad.copy_(summed)
        offset += p.numel()


def all_gather_objects(obj):
    """Every rank's `obj`, in rank order ([obj] alone)."""
    if world_size() <= 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
