"""Weight sync: the actor group's current policy -> the running rollout engine, no restart.

One small interface, `WeightSync.push() -> seconds`, two transports:

- "object_store" (CPU, any cluster; the tested path): actor rank 0 packs its full HF-format
  state dict (LoRA merged) into one flat numpy buffer per dtype (`PackedWeights`); Ray moves
  it through the object store to the rollout worker, which unpacks zero-copy views and hands
  them to the engine: validate names/shapes, reload in place, re-tie and re-pack a tied
  lm_head, reset the prefix cache (agent_rl/rollout/engine.py). The driver only passes an object
  reference: the weights never travel through it. Why one flat buffer: Ray pickles torch
  tensors (a copy each way: ~3.5 s for 135M fp32 params here) but maps numpy buffers from
  shared memory without a copy (~0.4 s).
- "cuda_ipc" (GPU, actor rank 0 and the engine on the same device; run on an H100, docs/gpu.md):
  rank 0 exports CUDA IPC handles of its tensors instead of copying them; the rollout worker
  rebuilds views of the same memory and loads them. Same engine call, no host copy.

Every push is timed; the trainer logs it as `timing/sync`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class PackedWeights:
    """Named tensors as one contiguous buffer per dtype (what crosses the object store)."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    buffers: dict[str, np.ndarray]
    """dtype name -> flat buffer; bfloat16 travels as int16 bits (numpy has no bfloat16)."""


def pack_weights(named: list[tuple[str, Any]]) -> PackedWeights:
    import torch

    by_dtype: dict[str, list] = {}
    names, shapes, dtypes = [], [], []
    for name, t in named:
        t = t.detach().to("cpu")
        key = str(t.dtype).removeprefix("torch.")
        names.append(name)
        shapes.append(tuple(t.shape))
        dtypes.append(key)
        by_dtype.setdefault(key, []).append(t.reshape(-1))
    buffers = {}
    for key, parts in by_dtype.items():
        flat = torch.cat(parts)
        buffers[key] = (flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat).numpy()
    return PackedWeights(names, shapes, dtypes, buffers)


def unpack_weights(packed: PackedWeights) -> list[tuple[str, Any]]:
    """Tensor views into the packed buffers (read-only memory from the object store is fine:
    the engine copies them into its own parameters)."""
    import warnings

    import torch

    flats = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": we only read
        for key, buf in packed.buffers.items():
            t = torch.from_numpy(buf)
            flats[key] = t.view(torch.bfloat16) if key == "bfloat16" else t
    offsets = dict.fromkeys(flats, 0)
    out = []
    for name, shape, key in zip(packed.names, packed.shapes, packed.dtypes):
        numel = math.prod(shape)
        out.append((name, flats[key][offsets[key] : offsets[key] + numel].view(shape)))
        offsets[key] += numel
    return out


def export_cuda_ipc(named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Actor side: tensors -> picklable CUDA IPC rebuild recipes. torch keeps a shared CUDA
    block allocated in this process until every reader has released it, so the tensors may be
    temporaries (FSDP's gathered weights; tests/gpu/test_training_gpu.py)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [(name, reduce_tensor(t.detach().contiguous())) for name, t in named]


def import_cuda_ipc(handles: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Engine side: rebuild the tensors (views of the actor's memory, another process's GPU memory)."""
    return [(name, rebuild(*args)) for name, (rebuild, args) in handles]


@dataclass(frozen=True)
class Transport:
    """How weights travel from actor rank 0 to the rollout engine; the one place a transport
    name is looked up (`get_transport`)."""

    export: Callable[[Any], Any]
    """Actor side: ActorWorker -> what crosses Ray (must pickle)."""
    load: Callable[[Any], list[tuple[str, Any]]]
    """Engine side: that payload -> (HF name, tensor) pairs for `RolloutEngine.load_weights`."""


TRANSPORTS: dict[str, Transport] = {
    "object_store": Transport(export=lambda worker: pack_weights(worker.named_weights_for_sync()), load=unpack_weights),
    "cuda_ipc": Transport(export=lambda worker: export_cuda_ipc(worker.device_named_weights()), load=import_cuda_ipc),
}


def get_transport(name: str) -> Transport:
    if name not in TRANSPORTS:
        raise ValueError(f"weight sync transport {name!r} unknown; known: {list(TRANSPORTS)}")
    return TRANSPORTS[name]


class WeightSync:
    """Pushes the actor group's weights into the rollout worker's engine.

    `actor_group` is an `agent_rl.training.ray_workers.WorkerGroup` of actor workers, `rollout` the
    `RolloutWorker` actor handle. `push()` returns the wall seconds and keeps the last ones
    in `last_seconds` / `last_engine_seconds` (the engine's share: validate + reload).
    """

    def __init__(self, actor_group: Any, rollout: Any, transport: str = "object_store"):
        get_transport(transport)  # fail at construction, not at the first push
        self.actor_group = actor_group
        self.rollout = rollout
        self.transport = transport
        self.last_seconds = 0.0
        self.last_engine_seconds = 0.0

    def push(self, version: int | None = None) -> float:
        """`version`: the policy version the engine's weights then have (the trainer's step)."""
        import ray

        t0 = time.perf_counter()
        weights_ref = self.actor_group.export_weights(self.transport)  # ObjectRef
        self.last_engine_seconds = ray.get(self.rollout.load_weights.remote(weights_ref, self.transport, version))
        self.last_seconds = time.perf_counter() - t0
        return self.last_seconds
