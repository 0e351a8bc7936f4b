"""Rollout engine: a thin async wrapper over vLLM, token ids in, token ids + logprobs out.

`RolloutEngine` is the interface and the factory; one subclass per backend, chosen by
`RolloutConfig.engine_mode` in `RolloutEngine.create`:

- "inproc" (default): `agent_rl.rollout.vllm_inproc.InprocEngine`, vLLM's V1 `LLMEngine` with
  the engine core in this process, stepped by one asyncio task.
- "mp": `agent_rl.rollout.vllm_mp.MultiprocEngine`, vLLM's `AsyncLLM` (engine core in a child
  process).
- "hf": `agent_rl.rollout.hf_engine.HfEngine`, plain transformers, one sequence at a time, no
  vLLM imported: the same contract for tests of the training loop (resume, the clock, async
  continuation), where vLLM is not the subject and its start-up would be most of the time.

The code vLLM runs inside its worker (weight reload) is in `agent_rl.rollout.vllm_worker`.

vLLM reads its environment at import, so `configure_vllm_env` must run before the first
`import vllm`; `RolloutEngine.create` calls it (for the vLLM backends) and imports vLLM lazily.

Logprob semantics (`logprobs_mode="processed_logprobs"`): the logprob of each sampled token
under the distribution it was sampled from, after temperature (and top-p, renormalised over
the nucleus). The trainer computes its log-probs under the same temperature
(`actor_rollout_ref.rollout.temperature`, as veRL), so with top-p 1 the two agree up to
numerics at any temperature; greedy calls get the raw model's log-probs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from agent_rl.config import RolloutConfig

from agent_rl.rollout.protocol import SEARCH_R1

log = logging.getLogger(__name__)

STOP_STRINGS: tuple[str, ...] = SEARCH_R1.stop
"""The default stop strings (Search-R1's two actions); the rollout passes its protocol's."""


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
    from data_prep.hardware import default_device, resolve_dtype

    return resolve_dtype(setting, default_device())


def _tied_embeddings(model_dir: str) -> bool:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(cfg.get("tie_word_embeddings", False))


def config_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the tensors a checkpoint of `path`'s config.json holds (the model built on
    the meta device: no memory, no weights; a tied lm_head left out, as save_pretrained does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = getattr(config, "tie_word_embeddings", False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def _checkpoint_shapes(model_dir: str, load_format: str = "auto") -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint tensors (read from safetensors headers only); with
    `load_format` dummy (no weight files) those its config.json gives (`config_shapes`)."""
    from safetensors import safe_open

    if load_format == "dummy":
        return config_shapes(model_dir)

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


@functools.cache
def _prompt_builder() -> Callable[[list[int]], Any]:
    """vLLM 0.3x takes a rendered `tokens_input` (a raw `TokensPrompt` there is deprecated and
    re-rendered per request); releases without it (the GPU extra's) take the `TokensPrompt`.
    Resolved once: `engine_prompt` runs for every turn."""
    try:
        from vllm.inputs import tokens_input
    except ImportError:
        from vllm.inputs import TokensPrompt

        return lambda ids: TokensPrompt(prompt_token_ids=ids)
    return tokens_input


def engine_prompt(prompt_ids: list[int]) -> Any:
    """Token ids as the engine's input (see `_prompt_builder`)."""
    return _prompt_builder()(list(prompt_ids))


class RolloutEngine:
    """Async generation from token ids on vLLM, plus in-place weight loading.

    Create with `await RolloutEngine.create(model_path, cfg, max_model_len)` (the backend
    follows `cfg.engine_mode`); every call must come from the event loop that created it.
    `generate` is safe to call concurrently (that is the point); `load_weights` must run
    between rollouts.
    """

    BACKENDS = {"inproc": "agent_rl.rollout.vllm_inproc:InprocEngine",
                "mp": "agent_rl.rollout.vllm_mp:MultiprocEngine",
                "hf": "agent_rl.rollout.hf_engine:HfEngine"}
    uses_vllm = True
    """The backend runs vLLM: `create` sets vLLM's environment and guards its start-up scan."""

    def __init__(self, model_path: str, cfg: RolloutConfig, max_model_len: int) -> None:
        self.model_path = str(model_path)
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.tie_word_embeddings = _tied_embeddings(self.model_path)
        self._expected_shapes = _checkpoint_shapes(self.model_path, cfg.load_format)
        self._ids = itertools.count()
        self._engine: Any = None
        self._closed = False
        self.num_generated_tokens = 0

    # -- construction
    @classmethod
    async def create(cls, model_path: str, cfg: RolloutConfig, max_model_len: int = 2048) -> RolloutEngine:
        if cfg.engine_mode not in cls.BACKENDS:
            raise ValueError(f"rollout.engine_mode must be one of {sorted(cls.BACKENDS)}, got {cfg.engine_mode!r}")
        import importlib

        from data_prep.quiet import install

        install()  # vLLM's notices that are not problems (a no-op where the entry point ran it)
        module, _, name = cls.BACKENDS[cfg.engine_mode].partition(":")
        backend = getattr(importlib.import_module(module), name)
        dtype, why = engine_dtype(cfg.dtype)
        cfg = dataclasses.replace(cfg, dtype=dtype)  # the resolved dtype, as reported downstream
        log.info("rollout engine dtype: %s (%s)", dtype, why)
        self = backend(model_path, cfg, max_model_len)
        if self.uses_vllm:
            configure_vllm_env(cfg)
        t0 = time.perf_counter()
        with _kernel_scan_guard() if self.uses_vllm else nullcontext():
            await self._start(self._engine_args())
        log.info("%s engine (%s, %s) ready in %.1fs", "vLLM" if self.uses_vllm else "transformers", cfg.engine_mode,
                 cfg.dtype, time.perf_counter() - t0)
        return self

    def _engine_args(self) -> dict:
        cfg = self.cfg
        kwargs = dict(
            model=self.model_path,
            dtype=cfg.dtype,
            enforce_eager=cfg.enforce_eager,
            max_num_seqs=cfg.max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_model_len=self.max_model_len,
            seed=cfg.seed,
            tensor_parallel_size=cfg.tensor_model_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            disable_log_stats=True,
            use_tqdm_on_load=False,  # a bar for a load our own line times ("vLLM engine ... ready in")
            logprobs_mode="processed_logprobs",  # the sampler's own distribution (module docstring)
            worker_extension_cls="agent_rl.rollout.vllm_worker.WeightLoaderExtension",
            load_format=cfg.load_format,
        )
        if cfg.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        return kwargs

    def get_tokenizer(self) -> Any:
        return self._engine.get_tokenizer() if self._engine is not None else None

    # -- the backend's part
    async def _start(self, engine_args: dict) -> None:
        """Build the vLLM engine from `engine_args` (EngineArgs keywords)."""
        raise NotImplementedError

    def _prompt(self, prompt_ids: list[int]) -> Any:
        """Token ids as the backend's input."""
        return engine_prompt(prompt_ids)

    async def _generate(self, rid: str, prompt: Any, params: Any) -> GenerateResult:
        raise NotImplementedError

    async def _load_validated(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    async def reset_prefix_cache(self) -> None:
        raise NotImplementedError

    async def _shutdown(self) -> None:
        raise NotImplementedError

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
        rid = f"r{next(self._ids)}"
        result = await self._generate(rid, self._prompt(prompt_ids), self._sampling_params(sampling))
        self.num_generated_tokens += len(result.token_ids)
        return result

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
        await self._load_validated(self._validate(list(named_tensors)))
        return time.perf_counter() - t0

    async def shutdown(self) -> None:
        """Stop and free the engine (idempotent)."""
        if self._engine is None:
            return
        self._closed = True
        await self._shutdown()
        self._engine = None


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
