"""Ray actors: the rollout worker and data-parallel groups of training workers.

- `RolloutWorker` (async actor): the vLLM engine, the retriever client and the rollout
  manager in one process, so generation and retrieval overlap on one event loop.
- `WorkerGroup`: N `TrainWorkerHost` actors, each hosting one `ActorWorker` (or
  `CriticWorker`) with its rank; they form a torch.distributed group (gloo on CPU, NCCL on
  GPU) through a MASTER_ADDR/PORT taken from rank 0. The driver hands every rank the same
  batch through the object store (one copy); each rank works on its own token-balanced shard
  (`agent_rl.training.batch.shard`) and per-token results are put back in batch order here.
  A group is asked to run a worker's method by the method itself (`ActorWorker.update_policy`),
  never by its name: a renamed method fails where it is named, not on a remote rank.

Resources: on CPU every actor asks for `num_cpus=0`, so they all fit a 2-core machine
(Ray would otherwise refuse to place them); they time-share the cores, which is what the
loop does anyway (rollout, then log-probs, then update). Ray sets OMP_NUM_THREADS=1 in
actors with no CPUs, so each actor sets its torch threads explicitly. On GPU (untested
here) the engine, actor rank i and critic rank i share GPU i (`GPU_SHARE`); tensor-parallel
engines are not placed yet.

Nodes (`trainer.nnodes`, veRL's meaning: the nodes the training workers spread over): on CPU
a group's `num_actor_workers` ranks sit `num_actor_workers / nnodes` to a node (ranks 0..k-1
on one, the next k on another) through a STRICT_SPREAD placement group of one bundle per
node; the engine is one actor on one node. Gloo meets at rank 0's node IP and binds to the
interface holding each node's Ray address. A cluster with fewer nodes than `nnodes` is
refused in one line before anything starts (`check_cluster`).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

import ray

from agent_rl.config import TrainConfig

WorkerMethod = Callable[..., Any]
"""A function of the hosted worker and arguments: a worker class's method
(`ActorWorker.compute_log_probs`) or e.g. `operator.attrgetter("fsdp")`."""


def _checked(method: WorkerMethod) -> WorkerMethod:
    if not callable(method):
        raise TypeError(f"a worker group runs a method, e.g. ActorWorker.update_policy, not {method!r}")
    return method


def init_ray(address: str | None) -> bool:
    """Join a running cluster (`address`, e.g. "auto") or start a local one for this process;
    nothing when this process is already connected (a caller that started Ray itself).
    Returns whether this call connected it: only then is Ray the caller's to shut down."""
    import ray

    if ray.is_initialized():
        return False
    env = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM") if k in os.environ}
    # every worker quiets the same third-party notices as this process, before its libraries load
    runtime_env = {"env_vars": env, "worker_process_setup_hook": "data_prep.quiet.install"}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
    else:
        from data_prep.hardware import no_ray_prestart

        no_ray_prestart()
        ray.init(include_dashboard=False, runtime_env=runtime_env, log_to_driver=True)
    return True


def torch_threads(cfg: TrainConfig) -> int:
    return cfg.trainer.torch_threads or len(os.sched_getaffinity(0))


def _actor_env(cfg: TrainConfig, engine: bool = False) -> dict:
    """runtime_env for our actors: all cores for OpenMP (Ray's default for 0-CPU actors is 1);
    `engine`: the actor runs a vLLM engine (`data_prep.quiet.ENGINE_ENV`, read when torch loads)."""
    from data_prep.quiet import engine_env

    n = str(torch_threads(cfg))
    keep = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "VLLM_CPU_OMP_THREADS_BIND")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {"env_vars": {**env, **(engine_env() if engine else {}), "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}}


class ClusterTooSmall(ValueError):
    """The Ray cluster has fewer nodes able to hold the training workers than trainer.nnodes."""


SPREAD_BUNDLE = {"CPU": 0.01}
"""One node's bundle of a CPU group spread over trainer.nnodes nodes. The 0.01 CPU only marks
the node (Ray refuses a bundle of zeros); the workers in it still ask for no CPUs."""
PLACEMENT_TIMEOUT_S = 300
"""How long a spread group may wait for its nodes (held by other work) before it is refused."""


def check_nnodes(cfg: TrainConfig, world_size: int | None = None) -> None:
    """trainer.nnodes against the workers it spreads (config only, before Ray): on CPU the
    `world_size` ranks (default trainer.num_actor_workers) must fill every node alike."""
    tr = cfg.trainer
    n = tr.num_actor_workers if world_size is None else world_size
    if tr.n_gpus_per_node <= 0 and tr.nnodes > 1 and n % tr.nnodes:
        raise ValueError(f"trainer.num_actor_workers={n} does not spread over trainer.nnodes={tr.nnodes}: on CPU each "
                         f"node runs num_actor_workers / nnodes of them (veRL: nnodes x n_gpus_per_node); "
                         f"make it a multiple of {tr.nnodes}")


def check_cluster(cfg: TrainConfig, world_size: int | None = None) -> None:
    """Refuse (ClusterTooSmall, one line) a connected cluster with fewer alive nodes able to
    hold a training worker (a CPU bundle; on GPU runs n_gpus_per_node GPUs) than
    trainer.nnodes: their placement group would wait for ever."""
    check_nnodes(cfg, world_size)
    tr = cfg.trainer
    if tr.nnodes <= 1:
        return
    key, need = ("GPU", tr.n_gpus_per_node) if tr.n_gpus_per_node > 0 else ("CPU", SPREAD_BUNDLE["CPU"])
    alive = [n for n in ray.nodes() if n["Alive"]]
    able = [n for n in alive if n["Resources"].get(key, 0) >= need]
    if len(able) < tr.nnodes:
        gcs = ray.get_runtime_context().gcs_address
        what = "CPUs" if key == "CPU" else f"{need} GPUs"
        raise ClusterTooSmall(f"trainer.nnodes={tr.nnodes}, but the Ray cluster at {gcs} has {len(able)} node(s) with "
                              f"{what} ({len(alive)} alive): join the others (`ray start --address={gcs}` on each host) "
                              "or lower trainer.nnodes")


def _spread_group(cfg: TrainConfig, world_size: int, role: str) -> Any:
    """The STRICT_SPREAD placement group of a CPU group over trainer.nnodes > 1 nodes (one
    bundle per node), ready; None otherwise (a single node, or GPU runs: `_placement`)."""
    if cfg.trainer.n_gpus_per_node > 0 or cfg.trainer.nnodes <= 1:
        return None
    from ray.util.placement_group import placement_group, remove_placement_group

    check_cluster(cfg, world_size)
    pg = placement_group([dict(SPREAD_BUNDLE)] * cfg.trainer.nnodes, strategy="STRICT_SPREAD", name=f"agent_rl_{role}")
    if not pg.wait(PLACEMENT_TIMEOUT_S):
        remove_placement_group(pg)
        raise ClusterTooSmall(f"the {role} workers' {cfg.trainer.nnodes} nodes (STRICT_SPREAD, {SPREAD_BUNDLE} each) "
                              f"were not free within {PLACEMENT_TIMEOUT_S}s: `ray status` shows what holds them")
    return pg


GPU_SHARE = {"rollout": 0.2, "actor": 0.4, "critic": 0.4}
"""GPU runs (untested here: no GPU): the engine, actor rank i and critic rank i share GPU i,
as veRL's colocated workers do; these are their fractions of the device."""
_GPU_GROUP: list = []


def _placement(cfg: TrainConfig, role: str, rank: int, spread: Any = None, world_size: int = 1) -> dict:
    """Ray resources of one actor: no CPUs on CPU runs (see module docstring), in bundle
    rank // (world_size / nnodes) of `spread` (the group's `_spread_group`) when there is one;
    on GPU runs a share of GPU `rank` through one placement group of one bundle per GPU."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if cfg.trainer.n_gpus_per_node <= 0:
        if spread is None:
            return {"num_cpus": 0}
        per_node = world_size // cfg.trainer.nnodes
        return {"num_cpus": 0, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            spread, placement_group_bundle_index=rank // per_node)}
    from ray.util.placement_group import placement_group

    n = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if not _GPU_GROUP:
        pg = placement_group([{"GPU": 1}] * n, strategy="PACK")
        ray.get(pg.ready())
        _GPU_GROUP.append(pg)
    strategy = PlacementGroupSchedulingStrategy(_GPU_GROUP[0], placement_group_bundle_index=rank % n)
    return {"num_cpus": 0, "num_gpus": GPU_SHARE[role], "scheduling_strategy": strategy}


# ----------------------------------------------------------------------------- rollout
@ray.remote
class RolloutWorker:
    """The vLLM engine + rollout manager (+ retriever client) as one async Ray actor.

    Call `start()` once (the engine is created inside the actor's event loop), then
    `rollout(prompts, n, ...)` and `load_weights(ref)`; `shutdown()` frees the engine.
    """

    def __init__(self, cfg: TrainConfig, retriever: Any = None):
        import torch

        self.cfg = cfg
        torch.set_num_threads(torch_threads(cfg))
        self.engine = self.manager = self.client = self.stream = None
        self.retriever = retriever
        """Optional object with `async search(queries, topk)` used instead of the HTTP client."""

    async def start(self) -> None:
        from agent_rl.rollout.engine import RolloutEngine
        from agent_rl.rollout.manager import RolloutManager

        cfg = self.cfg
        max_len = cfg.data.max_prompt_length + cfg.data.max_response_length
        rcfg = cfg.actor_rollout_ref.rollout
        self.engine = await RolloutEngine.create(cfg.actor_rollout_ref.model.path, rcfg, max_model_len=max_len)
        if self.retriever is None and cfg.retriever.url:  # no URL: direct (no-search) rollouts only
            from agent_rl.rollout.retrieval_client import RetrieverClient

            self.client = RetrieverClient.from_config(cfg.retriever)
        self.manager = RolloutManager(self.engine, self.retriever or self.client, cfg)

    async def rollout(self, prompts: list, n: int, greedy: bool = False) -> tuple[list, dict[str, float]]:
        """Trajectories for each prompt x n samples (group_id = index of the prompt) + rollout/* metrics."""
        return await self.manager.rollout(prompts, n=n, greedy=greedy)

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, ignore_eos: bool = False):
        """One plain generation (tests and diagnostics): GenerateResult with ids + logprobs;
        `ignore_eos` makes it exactly `max_tokens` long."""
        from agent_rl.rollout.engine import Sampling

        return await self.engine.generate(prompt_ids, Sampling(temperature=temperature, max_tokens=max_tokens, stop=(),
                                                                ignore_eos=ignore_eos))

    async def wait_retriever(self, timeout: float) -> None:
        """Until the retriever answers /health (RetrieverUnavailable after `timeout` s); no-op
        for an in-process retriever object."""
        if self.client is not None:
            await self.client.wait_healthy(timeout)

    async def load_weights(self, weights: Any, transport: str = "object_store", version: int | None = None) -> float:
        """Load named tensors (resolved from the object store by Ray) into the running engine,
        between turns (`PolicyGate.swap`: turns being generated finish first); the policy
        version becomes `version` (the trainer's step)."""
        from agent_rl.training.weight_sync import get_transport

        return await self.manager.gate.swap(lambda: self.engine.load_weights(get_transport(transport).load(weights)),
                                            version)

    # -------------------------------------------------- rollouts ahead of the trainer (stream)
    def _stream(self) -> Any:
        if self.stream is None:
            from agent_rl.rollout.stream import RolloutStream

            self.stream = RolloutStream(self.manager, self.cfg.actor_rollout_ref.rollout.n)
        return self.stream

    async def stream_submit(self, items: list) -> None:
        """Start groups: (key, prompt, SavedGroup or None) each."""
        for key, prompt, saved in items:
            await self._stream().submit(key, prompt, saved)

    async def stream_take(self, keys: list[int] | None = None, count: int = 0) -> tuple[list, dict[str, float]]:
        return await self._stream().take(keys, count)

    async def stream_drain(self) -> None:
        await self._stream().drain()

    async def stream_snapshot(self) -> list:
        return await self._stream().snapshot()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def shutdown(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
        if self.manager is not None:
            await self.manager.aclose()  # MCP servers' connections
        if self.engine is not None:
            await self.engine.shutdown()
            self.engine = None
        if self.client is not None:
            await self.client.aclose()
            self.client = None


def make_rollout_worker(cfg: TrainConfig, retriever: Any = None) -> Any:
    """Create and start the rollout worker; returns its handle once the engine is up.
    `retriever`: optional in-process search object replacing the HTTP client (tests)."""
    worker = RolloutWorker.options(runtime_env=_actor_env(cfg, engine=True), **_placement(cfg, "rollout", 0)).remote(cfg, retriever)
    ray.get(worker.start.remote())
    if cfg.trainer.nnodes > 1:
        print(f"[workers] engine on node {ray.get(worker.node_id.remote())[:8]}", flush=True)
    return worker


# ----------------------------------------------------------------------------- training workers
@ray.remote
class TrainWorkerHost:
    """Hosts one training worker (actor or critic) of a data-parallel group."""

    def __init__(self, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.worker = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: the rendezvous of the group (asked of rank 0)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def setup(self, factory: Callable[..., Any], rank: int, world_size: int, master: tuple[str, int]) -> None:
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(rank), WORLD_SIZE=str(world_size))
        # gloo binds to what the hostname resolves to, 127.0.1.1 on many Linux hosts: peers on
        # other nodes could not reach it. Bind to the interface holding the address Ray
        # reaches this node by, unless the user named one (GLOO_SOCKET_IFNAME).
        if world_size > 1 and "GLOO_SOCKET_IFNAME" not in os.environ:
            iface = _interface_of(ray.util.get_node_ip_address())
            if iface:
                os.environ["GLOO_SOCKET_IFNAME"] = iface
        self.worker = factory(rank=rank, world_size=world_size, init_method=f"tcp://{master[0]}:{master[1]}")

    def call(self, method: WorkerMethod, *args: Any) -> Any:
        return method(self.worker, *args)

    def export_weights(self, transport: str, rank0: bool = True) -> Any:
        """The policy's HF-format weights (LoRA merged), packed for `transport`; ranks other
        than 0 only take part in the FSDP gathers and return None."""
        from agent_rl.training.weight_sync import get_transport

        if not rank0:
            self.worker.join_weight_gather()
            return None
        return get_transport(transport).export(self.worker)

    def call_on_shard(self, method: WorkerMethod, batch: Any, rank: int, world_size: int) -> tuple[Any, Any]:
        """`method(worker, shard)` on this rank's part of `batch`; returns (result, shard row indices)."""
        from agent_rl.training.batch import shard_indices

        idx = shard_indices(batch.seq_lens.tolist(), rank, world_size)
        return method(self.worker, batch.select(idx)), idx


def _interface_of(ip: str) -> str | None:
    """The name of this host's network interface holding `ip`, if any."""
    import psutil  # a Ray dependency

    return next((name for name, addrs in psutil.net_if_addrs().items() if any(a.address == ip for a in addrs)), None)


class WorkerGroup:
    """N data-parallel training workers built by `factory(rank=, world_size=)` in Ray actors,
    spread over trainer.nnodes nodes (module docstring)."""

    def __init__(self, cfg: TrainConfig, factory: Callable[..., Any], world_size: int, role: str = "actor"):
        if world_size < 1:
            raise ValueError(f"trainer.num_actor_workers must be >= 1, got {world_size}")
        self.world_size = world_size
        self.spread = _spread_group(cfg, world_size, role)
        self.hosts = [
            TrainWorkerHost.options(runtime_env=_actor_env(cfg), **_placement(cfg, role, rank, self.spread, world_size))
            .remote(torch_threads(cfg))
            for rank in range(world_size)
        ]
        if self.spread is not None:
            nodes = " ".join(f"{r}@{n[:8]}" for r, n in enumerate(self.node_ids()))
            print(f"[workers] {role} ranks over trainer.nnodes={cfg.trainer.nnodes} nodes (rank@node): {nodes}", flush=True)
        master = ray.get(self.hosts[0].address.remote())  # rank 0's node IP: reachable from every node
        ray.get([h.setup.remote(factory, r, world_size, master) for r, h in enumerate(self.hosts)])

    def node_ids(self) -> list[str]:
        """The Ray node id of each rank's process, by rank."""
        return ray.get([h.node_id.remote() for h in self.hosts])

    def call_all(self, method: WorkerMethod, *args: Any) -> list[Any]:
        """`method(worker, *args)` on every rank (collectives inside need all ranks); results by rank."""
        return ray.get([h.call.remote(_checked(method), *args) for h in self.hosts])

    def export_weights(self, transport: str) -> Any:
        """ObjectRef of rank 0's packed weights (passed on to the engine, never fetched here).
        Every rank is called: under FSDP gathering the full tensors is collective (rank 0
        alone would wait for the others forever)."""
        refs = [h.export_weights.remote(transport, r == 0) for r, h in enumerate(self.hosts)]
        return refs[0]

    def per_token(self, method: WorkerMethod, batch: Any) -> Any:
        """(B, R) per-token result of `method` on each rank's shard, rows back in batch order."""
        from agent_rl.training.batch import concat_rows

        ref = ray.put(batch)
        outs = ray.get([h.call_on_shard.remote(_checked(method), ref, r, self.world_size) for r, h in enumerate(self.hosts)])
        parts = [o for o, idx in outs if len(idx)]
        idxs = [idx for o, idx in outs if len(idx)]
        return concat_rows(parts, [list(i) for i in idxs], len(batch))

    def update(self, method: WorkerMethod, batch: Any) -> dict[str, float]:
        """Run an update on every rank's shard (gradients are summed across ranks inside);
        the workers reduce metrics over all ranks, so rank 0's are the batch's."""
        ref = ray.put(batch)
        outs = ray.get([h.call_on_shard.remote(_checked(method), ref, r, self.world_size) for r, h in enumerate(self.hosts)])
        return outs[0][0]

    def rank0(self, method: WorkerMethod, *args: Any) -> Any:
        """`method(worker, *args)` on rank 0 only (questions every rank would answer alike)."""
        return ray.get(self.hosts[0].call.remote(_checked(method), *args))

    def shutdown(self) -> None:
        for h in self.hosts:
            ray.kill(h)
        self.hosts = []
        if self.spread is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.spread)
            self.spread = None
