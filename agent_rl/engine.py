"""Rollout engine: a thin async wrapper over vLLM, token ids in, token ids + logprobs out.

Two backends behind one interface (`RolloutEngine`), chosen by `RolloutConfig.engine_mode`:

- "inproc" (default): vLLM's V1 `LLMEngine` with the engine core in this process
  (VLLM_ENABLE_V1_MULTIPROCESSING=0), stepped by one asyncio task. vLLM's `AsyncLLM` cannot
  run its core in-process (core_client.make_client raises NotImplementedError), so this
  module drives `LLMEngine.step()` itself. In-process loads ~3x faster on CPU and makes weight
  sync a direct call into the model runner (no serialisation). Works on CUDA too.
- "mp": vLLM's `AsyncLLM` (engine core in a child process). Weight sync goes through a
  safetensors file in /dev/shm and `collective_rpc` (tensors inside rpc args would arrive
  as plain lists).

vLLM reads its environment at import, so `configure_vllm_env` must run before the first
`import vllm`; `RolloutEngine.create` calls it and imports vLLM lazily.

Logprob semantics (vLLM default `logprobs_mode="raw_logprobs"`): the logprob of each sampled
token under the raw model distribution, before temperature / top-p. That is what the trainer
recomputes, so at temperature 1 the two agree up to numerics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from agent_rl.config import RolloutConfig

log = logging.getLogger(__name__)

STOP_STRINGS: tuple[str, ...] = ("</search>", "</answer>")
"""Generation stops when an action tag closes (Search-R1's two actions)."""


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling settings (one assistant turn)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    stop: tuple[str, ...] = STOP_STRINGS
    seed: int | None = None
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens


@dataclass
class GenerateResult:
    """What the engine sampled for one call.

    `token_ids` are exactly the ids the engine generated, including EOS and including the whole
    token that completed a stop string: when a stop string ends inside a token (e.g. the model
    samples `></` to close `</search`), `text` is cut right after the stop string but the ids
    keep the token, so `decode(token_ids)` may have a few characters after `text`.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop string or EOS) | "length" | "abort"
    stop_reason: str | int | None  # the matched stop string, a stop token id, or None (EOS)
    text: str


# ----------------------------------------------------------------------------- environment
def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return list(range(os.cpu_count() or 1))


def configure_vllm_env(cfg: RolloutConfig) -> dict[str, str]:
    """Set vLLM's environment from the config; must run before vLLM is imported.

    - VLLM_ENABLE_V1_MULTIPROCESSING: "0" for engine_mode="inproc".
    - VLLM_CPU_KVCACHE_SPACE (GiB, an integer for vLLM: rounded up): preallocated KV cache on CPU.
    - VLLM_CPU_OMP_THREADS_BIND: vLLM's own default binds its worker to one core and reserves
      the rest; we bind all allowed cores ("0-N" list; vLLM parses ids, not the word "all").
      It only takes effect for the multiprocess executor; the in-process engine uses torch's
      threads (all cores by default). A value already in the environment wins, except "all",
      which is expanded to the core list.
    Returns the values set.
    """
    if "vllm" in sys.modules:
        log.warning("vllm already imported: environment changes may not take effect")
    cpus = _allowed_cpus()
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all")
    if bind == "all":
        bind = ",".join(str(c) for c in cpus)
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if cfg.engine_mode == "inproc" else "1",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(cfg.kv_cache_space_gb))),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
    }
    os.environ.update(env)
    return env


def engine_dtype(setting: str) -> tuple[str, str]:
    """The engine's dtype for `setting` (auto | a dtype name) on this host, and why."""
    from data_prep.hardware import cuda_available, resolve_dtype

    return resolve_dtype(setting, "cuda" if cuda_available() else "cpu")


def _tied_embeddings(model_dir: str) -> bool:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(cfg.get("tie_word_embeddings", False))


def _checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint tensors (read from safetensors headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}: cannot validate weight loads")
    for f in files:
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                shapes[k] = tuple(h.get_slice(k).get_shape())
    return shapes


def _unscannable(mod: Any) -> bool:
    namespace = getattr(mod, "__dict__", None)
    if not isinstance(namespace, dict):
        return False
    for value in list(namespace.values()):
        try:
            if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                return True
        except Exception:  # noqa: BLE001 - vLLM's scan would raise here too
            return True
    return False


@contextmanager
def _kernel_scan_guard() -> Iterator[None]:
    """Hide modules that crash vLLM's start-up scan, for the duration of engine creation.

    vLLM 0.32's CPU platform rebinds Triton kernels by walking the globals of every module in
    sys.modules and calling `vars(obj).get("kernel")` on each object with a `__dict__`. An
    object whose `__dict__` is not a mapping kills start-up with AttributeError: llvmlite's
    `ffi.lib` (numba imports it; bm25s's numba backend imports numba) is one. No kernel lives
    in such modules, so skipping them changes nothing else.
    """
    hidden: dict[str, Any] = {}
    with warnings.catch_warnings():  # touching deprecated globals warns; vLLM's scan does too
        warnings.simplefilter("ignore")
        for name, mod in list(sys.modules.items()):
            if _unscannable(mod):
                hidden[name] = sys.modules.pop(name)
    if hidden:
        log.info("hiding %s from vLLM's kernel scan during start-up", sorted(hidden))
    try:
        yield
    finally:
        sys.modules.update(hidden)


# ----------------------------------------------------------------------------- worker side
def _reload_in_worker(worker: Any, weights: Any, tie_word_embeddings: bool) -> float:
    """Runs inside the vLLM worker: reload weights in place, then fix the tied lm_head.

    `weights` is a list of (name, tensor) or a safetensors path (multiprocess backend).
    Returns the seconds spent. Pitfalls handled (ARCHITECTURE.md):
    - model.load_weights alone fails on CPU (linear weights live in packed oneDNN handles);
      reload_weights restores them on meta, loads, re-runs process_weights_after_loading.
    - with tied embeddings vLLM skips lm_head.weight and keeps lm_head's old packed copy:
      re-tie it to the new embedding and re-pack it.
    """
    import torch

    t0 = time.perf_counter()
    if isinstance(weights, str):
        from safetensors.torch import load_file

        weights = list(load_file(weights).items())
    runner = worker.model_runner
    with torch.no_grad():
        runner.reload_weights(weights_iterator=iter(weights))
        model = runner.get_model()
        if tie_word_embeddings and hasattr(model, "lm_head"):
            embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            embed = embed if isinstance(embed, torch.nn.Module) else model.model.embed_tokens
            model.lm_head.weight = embed.weight
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

                dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
    return time.perf_counter() - t0


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`), so the reload is called by
    method name through `collective_rpc`: nothing has to be pickled into the engine process
    (vLLM refuses to send functions unless VLLM_ALLOW_INSECURE_SERIALIZATION=1)."""

    def agent_rl_reload_weights(self, weights: Any, tie_word_embeddings: bool) -> float:
        return _reload_in_worker(self, weights, tie_word_embeddings)


# ----------------------------------------------------------------------------- engine
class RolloutEngine:
    """Async generation from token ids on vLLM, plus in-place weight loading.

    Create with `await RolloutEngine.create(model_path, cfg, max_model_len)`; every call must
    come from the event loop that created it. `generate` is safe to call concurrently (that is
    the point); `load_weights` must run between rollouts.
    """

    def __init__(self, model_path: str, cfg: RolloutConfig, max_model_len: int) -> None:
        self.model_path = str(model_path)
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.tie_word_embeddings = _tied_embeddings(self.model_path)
        self._expected_shapes = _checkpoint_shapes(self.model_path)
        self._ids = itertools.count()
        self._engine: Any = None  # LLMEngine (inproc) or AsyncLLM (mp)
        # inproc backend state: requests are added and stepped only between steps, from the
        # loop thread, and the blocking step runs in one worker thread (the GIL is released
        # in torch kernels, so the loop keeps serving retriever I/O meanwhile).
        self._futures: dict[str, asyncio.Future] = {}
        self._pending: list[tuple[str, Any, Any]] = []
        self._to_abort: list[str] = []
        self._wake: asyncio.Event | None = None
        self._step_lock: asyncio.Lock | None = None
        self._stepper: asyncio.Task | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.num_generated_tokens = 0

    # -- construction
    @classmethod
    async def create(cls, model_path: str, cfg: RolloutConfig, max_model_len: int = 2048) -> RolloutEngine:
        if cfg.engine_mode not in ("inproc", "mp"):
            raise ValueError(f"rollout.engine_mode must be 'inproc' or 'mp', got {cfg.engine_mode!r}")
        dtype, why = engine_dtype(cfg.dtype)
        cfg = dataclasses.replace(cfg, dtype=dtype)  # the resolved dtype, as reported downstream
        log.info("rollout engine dtype: %s (%s)", dtype, why)
        self = cls(model_path, cfg, max_model_len)
        configure_vllm_env(cfg)
        from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

        kwargs = dict(
            model=self.model_path,
            dtype=cfg.dtype,
            enforce_eager=cfg.enforce_eager,
            max_num_seqs=cfg.max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_model_len=max_model_len,
            seed=cfg.seed,
            tensor_parallel_size=cfg.tensor_model_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            disable_log_stats=True,
            worker_extension_cls=f"{__name__}.WeightLoaderExtension",
        )
        if cfg.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        t0 = time.perf_counter()
        if cfg.engine_mode == "inproc":
            from vllm.v1.engine.llm_engine import LLMEngine

            loop = asyncio.get_running_loop()
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-step")
            with _kernel_scan_guard():
                self._engine = await loop.run_in_executor(
                    self._pool, lambda: LLMEngine.from_engine_args(EngineArgs(**kwargs))
                )
            self._wake = asyncio.Event()
            self._step_lock = asyncio.Lock()
            self._stepper = asyncio.create_task(self._step_loop(), name="vllm-stepper")
        else:
            from vllm.v1.engine.async_llm import AsyncLLM

            with _kernel_scan_guard():
                self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        log.info("vLLM engine (%s, %s) ready in %.1fs", cfg.engine_mode, cfg.dtype, time.perf_counter() - t0)
        return self

    def get_tokenizer(self) -> Any:
        return self._engine.get_tokenizer() if self._engine is not None else None

    # -- generation
    def _sampling_params(self, s: Sampling) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            stop=list(s.stop),
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's logprob only
            seed=s.seed,
            ignore_eos=s.ignore_eos,
            skip_special_tokens=True,
        )

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> GenerateResult:
        """Sample one continuation of `prompt_ids` (never re-tokenised text)."""
        if self._closed:
            raise RuntimeError("RolloutEngine is shut down")
        if not prompt_ids:
            raise ValueError("generate: empty prompt_ids")
        if sampling.max_tokens < 1:
            raise ValueError(f"generate: max_tokens must be >= 1, got {sampling.max_tokens}")
        if len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise ValueError(
                f"generate: prompt ({len(prompt_ids)}) + max_tokens ({sampling.max_tokens}) "
                f"exceeds max_model_len={self.max_model_len}"
            )
        from vllm.inputs import TokensPrompt

        rid = f"r{next(self._ids)}"
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        params = self._sampling_params(sampling)
        if self.cfg.engine_mode == "mp":
            final = None
            async for out in self._engine.generate(prompt, params, rid):
                final = out
            assert final is not None
            result = _to_result(final)
        else:
            fut = asyncio.get_running_loop().create_future()
            self._pending.append((rid, prompt, params))
            self._futures[rid] = fut
            self._wake.set()
            try:
                result = await fut
            except asyncio.CancelledError:
                self._abort(rid)
                raise
        self.num_generated_tokens += len(result.token_ids)
        return result

    def _abort(self, rid: str) -> None:
        self._futures.pop(rid, None)
        self._pending = [p for p in self._pending if p[0] != rid]
        # Aborting inside the engine is deferred to the stepper (not thread-safe mid-step).
        self._to_abort.append(rid)
        self._wake.set()

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        eng = self._engine
        try:
            while not self._closed:
                async with self._step_lock:
                    if self._to_abort:
                        eng.abort_request(self._to_abort)
                        self._to_abort = []
                    for rid, prompt, params in self._pending:
                        eng.add_request(rid, prompt, params)
                    self._pending.clear()
                    busy = eng.has_unfinished_requests()
                    if busy:
                        outputs = await loop.run_in_executor(self._pool, eng.step)
                        for out in outputs:
                            if out.finished:
                                fut = self._futures.pop(out.request_id, None)
                                if fut is not None and not fut.done():
                                    fut.set_result(_to_result(out))
                if not busy:
                    self._wake.clear()
                    if not self._pending:
                        await self._wake.wait()
                else:
                    await asyncio.sleep(0)  # let coroutines queue new requests between steps
        except Exception as e:  # engine died: fail every waiter instead of hanging them
            log.exception("vLLM stepper failed")
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"vLLM engine step failed: {e!r}"))
            self._futures.clear()
            self._closed = True
            raise

    # -- weights
    def _validate(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Check names, shapes and finiteness before anything reaches the engine: a failed
        reload leaves parameters on the meta device and kills the engine."""
        import torch

        expected = self._expected_shapes
        out, seen, errors = [], set(), []
        tied_head = None
        for name, t in named:
            if not isinstance(t, torch.Tensor):
                errors.append(f"{name}: not a tensor ({type(t).__name__})")
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings and name not in expected:
                tied_head = t  # tied: the engine re-ties lm_head to the new embedding
                continue
            if name not in expected:
                errors.append(f"{name}: not a parameter of {self.model_path}")
                continue
            if tuple(t.shape) != expected[name]:
                errors.append(f"{name}: shape {tuple(t.shape)} != expected {expected[name]}")
                continue
            if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                errors.append(f"{name}: non-floating or non-finite values")
                continue
            if name in seen:
                errors.append(f"{name}: given twice")
                continue
            seen.add(name)
            out.append((name, t.detach().to("cpu").contiguous()))
        embed = dict(out).get("model.embed_tokens.weight")
        if tied_head is not None and embed is not None and not torch.equal(tied_head.to(embed), embed):
            errors.append("lm_head.weight differs from model.embed_tokens.weight but the model ties them")
        missing = sorted(set(expected) - seen)
        if missing:
            errors.append(f"missing {len(missing)} tensor(s), e.g. {missing[:3]} (send the full state dict)")
        if errors:
            raise ValueError("load_weights rejected, engine unchanged:\n  " + "\n  ".join(errors[:20]))
        return out

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load a full HF-format state dict into the running engine, no restart.

        Validates names/shapes first, reloads in place, re-ties + re-packs a tied lm_head,
        and resets the prefix cache (cached KV was computed with the old weights). Call it
        between rollouts: requests in flight raise. Returns the seconds spent.
        """
        t0 = time.perf_counter()
        weights = self._validate(list(named_tensors))
        if self.cfg.engine_mode == "mp":
            if self._engine.get_num_unfinished_requests():
                raise RuntimeError("load_weights called while requests are in flight")
            from safetensors.torch import save_file

            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=shm) as f:
                save_file(dict(weights), f.name)
                await self._engine.collective_rpc(
                    "agent_rl_reload_weights", args=(f.name, self.tie_word_embeddings)
                )
            await self._engine.reset_prefix_cache()
        else:
            async with self._step_lock:
                if self._engine.has_unfinished_requests() or self._pending or self._futures:
                    raise RuntimeError("load_weights called while requests are in flight")
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(
                    self._pool,
                    lambda: self._engine.collective_rpc(
                        "agent_rl_reload_weights", args=(weights, self.tie_word_embeddings)
                    ),
                )
                if not self._engine.reset_prefix_cache():
                    raise RuntimeError("prefix cache reset failed after load_weights")
        return time.perf_counter() - t0

    async def reset_prefix_cache(self) -> None:
        if self.cfg.engine_mode == "mp":
            await self._engine.reset_prefix_cache()
        else:
            async with self._step_lock:
                self._engine.reset_prefix_cache()

    async def shutdown(self) -> None:
        """Stop the stepper and free the engine (idempotent)."""
        if self._engine is None:
            return
        self._closed = True
        if self._stepper is not None:
            self._wake.set()
            self._stepper.cancel()
            try:
                await self._stepper
            except (asyncio.CancelledError, Exception):
                pass
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(RuntimeError("RolloutEngine shut down"))
        if self._pool is not None:  # let a step still running in the thread finish first
            self._pool.shutdown(wait=True)
        eng, self._engine = self._engine, None
        if self.cfg.engine_mode == "mp":
            eng.shutdown()
        else:
            eng.engine_core.shutdown()


def _to_result(out: Any) -> GenerateResult:
    c = out.outputs[0]
    ids = list(c.token_ids)
    lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
    if len(lps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
    return GenerateResult(
        token_ids=ids,
        logprobs=lps,
        finish_reason=str(c.finish_reason),
        stop_reason=c.stop_reason,
        text=c.text,
    )
