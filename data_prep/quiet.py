"""Third-party notices that are not problems, silenced where they arise, each with its reason.

The commands print our lines (stages, progress, the hardware line, reports); what vLLM, torch,
Ray and transformers add at every start reads to a newcomer as trouble. `install()` runs
before those libraries load (every entry point calls it through
`data_prep.hardware.offline_env`; Ray workers through `init_ray`'s setup hook) and sets:

- ENV / ENGINE_ENV: defaults the libraries read from the environment (a value already set wins);
- NOTICES: a logging filter on each logger named there that drops exactly those messages;
- WARNINGS: Python warnings filters.

A message qualifies when it reports a choice we made on purpose or a performance hint our
measured figures already include. Everything else stays visible: other warnings from the same
loggers, every error, torch's C++ warnings outside engine processes, Ray's notice when token
authentication is off. A message moved to another logger by a new release shows again.
`AGENT_RL_QUIET=0` turns all of it off (a bug hunt wants every line).

Standard library only, like the rest of data_prep's import-time code.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass

SWITCH_ENV = "AGENT_RL_QUIET"
"""0 / false / no: install() does nothing."""

ENV = {
    "VLLM_LOGGING_LEVEL": ("WARNING", "vLLM's INFO lines: its whole config and ~25 start-up steps per engine; "
                                      "our own lines name the engine's dtype and its start-up time"),
    "HF_HUB_DISABLE_PROGRESS_BARS": ("1", "transformers' \"Loading weights\" bar at every model load (the SFT, the "
                                          "actor, the calibration), which fills a log with its redraws; nothing is "
                                          "downloaded at run time, so no hub bar has anything to show"),
}
"""Every process: name -> (default, why)."""

ENGINE_ENV = {
    "TORCH_CPP_LOG_LEVEL": ("ERROR", "vLLM's CPU worker reports its NUMA memory binding (\"NUMA binding: Using "
                                     "MEMBIND policy\", vLLM's fixed policy) through torch's C++ log at every start; "
                                     "engine processes run no C++ code of ours that warns there"),
}
"""Processes that run a vLLM engine (calibration, evaluation, the rollout actor), set before torch
loads: torch reads it once. Other processes keep torch's C++ warnings."""


@dataclass(frozen=True)
class Notice:
    logger: str
    """The logger that emits it (exactly: the filter sits on that logger)."""
    text: str
    """Regular expression matched at the start of the formatted message."""
    why: str
    """Why it is harmless here."""


NOTICES = (
    # vLLM 0.32, CPU build: engine start-up
    Notice("vllm.platforms.interface", r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT$",
           "vLLM's own CPU worker sets VLLM_DIST_IDENT in the process that hosts an engine and does not list it; "
           "an engine started later from that process (or a child of it) inherits it"),
    Notice("vllm.platforms.cpu", r"Reset SSM cache type to float32 for accelerated GDN mamba backend",
           "a bf16 engine on the CPU sets the state cache of mamba layers; the policy is a dense transformer "
           "and has none (seen on native-bf16 hosts only, where `auto` picks bf16)"),
    Notice("vllm.engine.arg_utils", r"The global random seed is set to",
           "we run the engine in our process on purpose (rollout.engine_mode=inproc), seeded by the config"),
    Notice("vllm.config.vllm", r"Enforce eager set, disabling torch\.compile",
           "rollout.enforce_eager=true is our CPU default: compiling costs more than it saves here"),
    Notice("vllm.config.vllm", r"Inductor compilation was disabled by user settings",
           "the same choice (enforce_eager), said a second time"),
    Notice("vllm.triton_utils.importing", r"Triton is installed, but doesn't include CPU backend",
           "vLLM's CPU kernels run without Triton: the figures we measured are without it"),
    Notice("vllm.platforms.cpu", r"Triton is not installed\. triton-cpu is expected",
           "the same: triton-cpu is not part of the CPU install, the C++ kernels run instead"),
    Notice("vllm.config.vllm", r"Model Runner V2 requires Triton; using the V1 model runner",
           "follows from running without Triton; V1 is the runner our figures were measured with"),
    Notice("vllm.v1.worker.cpu_worker", r"(libtcmalloc|libiomp) is not found in LD_PRELOAD",
           "a speed hint (an allocator / OpenMP preloaded before Python starts); our figures are without it"),
    Notice("vllm.v1.worker.cpu_worker", r"CPU backend doesn't allow to use `torch\.set_num_threads` after",
           "vLLM refusing its own request to drop torch to 1 thread; threads stay as we set them before "
           "the engine started"),
    Notice("vllm.utils.torch_utils", r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads at",
           "our Ray actors set OMP_NUM_THREADS to all their cores on purpose (training.ray_workers)"),
    Notice("vllm.model_executor.models.utils",
           r"Attempted to load weight \S+ with dtype torch\.float32 into parameter with dtype torch\.(bfloat16|float16)",
           "the fp32 checkpoint narrowed into the bf16/fp16 engine the config chose, one line per tensor"),
    # vLLM: in-place weight reload (rollout.vllm_worker)
    Notice("vllm.model_executor.model_loader.reload.layerwise", r"RotaryEmbedding: Failed to load weights",
           "rotary tables are computed, not stored in checkpoints; vLLM keeps them"),
    Notice("vllm.model_executor.model_loader.reload.layerwise", r"ParallelLMHead: Failed to load weights",
           "a tied lm_head has no tensor of its own; vllm_worker re-ties it to the new embedding right after "
           "(RolloutEngine._validate rejects a push that lacks any checkpoint tensor)"),
    # vLLM 0.24, CUDA build
    Notice("vllm.platforms.cuda", r"Failed to import from vllm\._moe_C_stable_libtorch",
           "our GPU kit leaves the mixture-of-experts kernels out on purpose (scripts/gpu_kit.py): the policy is dense"),
    # Ray
    Notice("ray._private.authentication.authentication_token_setup",
           r"Token authentication is enabled for this Ray cluster",
           "Ray's secure default for the local cluster we start (the notice that it is off stays)"),
    # transformers
    Notice("transformers.tokenization_utils_tokenizers", r"Ignoring clean_up_tokenization_spaces=True for BPE",
           "transformers skips a clean-up that would corrupt BPE text: decoded text stays exact, as we want"),
)

WARNINGS = (
    # (category, message regex, why)
    (FutureWarning, r".*torch\.distributed\.reduce_op.* is deprecated",
     "vLLM's start-up scan of loaded modules touches torch's deprecated alias; no code of ours uses it"),
)


class KnownNotices(logging.Filter):
    """Drops the records NOTICES lists, up to WARNING level (an error is never a notice);
    attached to each logger named there."""

    def __init__(self, notices: tuple[Notice, ...] = NOTICES) -> None:
        super().__init__()
        by_logger: dict[str, list[str]] = {}
        for n in notices:
            by_logger.setdefault(n.logger, []).append(n.text)
        self.patterns = {name: re.compile("|".join(f"(?:{t})" for t in texts)) for name, texts in by_logger.items()}

    def filter(self, record: logging.LogRecord) -> bool:
        pattern = self.patterns.get(record.name)
        if pattern is None or record.levelno > logging.WARNING:
            return True
        try:
            return not pattern.match(record.getMessage())
        except Exception:  # noqa: BLE001 - a malformed record is the library's problem, shown as it is
            return True


FILTER = KnownNotices()


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no")


def engine_env() -> dict[str, str]:
    """ENGINE_ENV's values for a process about to start (a value set in ours wins)."""
    return {k: os.environ.get(k, v) for k, (v, _) in ENGINE_ENV.items()} if enabled() else {}


def install(engine: bool = False) -> None:
    """Set ENV's defaults (and ENGINE_ENV's where this process runs a vLLM engine), attach the
    filter to NOTICES' loggers and add WARNINGS' filters. Idempotent; run it before vLLM, torch
    and Ray load (ENGINE_ENV only takes effect then)."""
    if not enabled():
        return
    for k, (v, _) in {**ENV, **(ENGINE_ENV if engine else {})}.items():
        os.environ.setdefault(k, v)
    for name in FILTER.patterns:
        logger = logging.getLogger(name)
        if FILTER not in logger.filters:
            logger.addFilter(FILTER)
    for category, message, _ in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
