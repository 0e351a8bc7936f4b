"""data_prep.quiet: each listed third-party notice is dropped where it is logged; other warnings
and every error from the same loggers still show; environment defaults yield to the user's."""

from __future__ import annotations

import logging
import warnings

import pytest

from data_prep import quiet

# The notices as the libraries print them (vLLM 0.32 CPU and 0.24 CUDA, Ray 2.60, transformers 5)
SEEN = [
    ("vllm.engine.arg_utils", "The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to "
                              "False, this may affect the random state of the Python process that launched vLLM."),
    ("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is "
                         "equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                         "--kernel_config.enable_jit_warmup=False"),
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings, optimizations settings that are only "
                         "active during inductor compilation will be ignored."),
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend. Disabling Triton."),
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
    ("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead."),
    ("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the "
                                  "section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/"
                                  "installation/cpu/ to setup required pre-loaded libraries."),
    ("vllm.v1.worker.cpu_worker", "libiomp is not found in LD_PRELOAD. For best performance, please follow the "
                                  "section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/"
                                  "installation/cpu/ to setup required pre-loaded libraries."),
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads` after the thread "
                                  "binding, skip it."),
    ("vllm.utils.torch_utils", "OMP_NUM_THREADS=2 is set; leaving Torch threads at 2 for serving. Multi-threaded "
                               "torch CPU ops during serving can degrade performance through spin-wait contention "
                               "and cgroup CPU-quota throttling."),
    ("vllm.model_executor.models.utils", "Attempted to load weight model.layers.0.mlp.down_proj.weight with dtype "
                                         "torch.float32 into parameter with dtype torch.bfloat16"),
    ("vllm.model_executor.model_loader.reload.layerwise", "RotaryEmbedding: Failed to load weights"),
    ("vllm.model_executor.model_loader.reload.layerwise", "ParallelLMHead: Failed to load weights"),
    ("vllm.platforms.cuda", "Failed to import from vllm._moe_C_stable_libtorch: ModuleNotFoundError(\"No module "
                            "named 'vllm._moe_C_stable_libtorch'\")"),
    ("vllm.platforms.interface", "Unknown vLLM environment variable detected: VLLM_DIST_IDENT"),
    ("ray._private.authentication.authentication_token_setup",
     "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. For more "
     "information, see https://docs.ray.io/en/latest/ray-security/token-auth.html"),
    ("transformers.tokenization_utils_tokenizers",
     "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer TokenizersBackend. The clean_up_tokenization "
     "post-processing step is designed for WordPiece tokenizers and is destructive for BPE (it strips spaces before "
     "punctuation)."),
]

# Real problems the same loggers may report: they must stay
REAL = [
    ("vllm.v1.worker.cpu_worker", logging.WARNING, "sleep mode is not supported on CPU, ignore it."),
    ("vllm.v1.worker.cpu_worker", logging.WARNING, "Node 1 is not in available memory nodes [0]."),
    ("vllm.model_executor.models.utils", logging.WARNING, "Attempted to load weight lm_head.weight with dtype "
                                                          "torch.bfloat16 into parameter with dtype torch.float16"),
    ("vllm.model_executor.models.utils", logging.WARNING, "Attempted to load nested weight 'x' into a single "
                                                          "parameter 'y'"),
    ("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, "LlamaAttention: Failed to load weights"),
    ("vllm.platforms.cuda", logging.WARNING, "Failed to import from vllm._C_stable_libtorch: ImportError('x')"),
    ("vllm.engine.arg_utils", logging.ERROR, "The model's max seq len (4096) is larger than the KV cache can hold"),
    ("ray._private.authentication.authentication_token_setup", logging.WARNING,
     "Token authentication is disabled for this Ray cluster. Anyone with network access to the cluster can run "
     "arbitrary code and access its data."),
    ("transformers.tokenization_utils_tokenizers", logging.WARNING, "Token indices sequence length is longer than "
                                                                    "the specified maximum sequence length"),
    ("vllm.platforms.interface", logging.WARNING, "Unknown vLLM environment variable detected: VLLM_DIST_IDENTX"),
    ("vllm.platforms.interface", logging.WARNING, "Unknown vLLM environment variable detected: VLLM_MY_TYPO"),
    # a listed text at ERROR level is not the notice any more
    ("vllm.platforms.cpu", logging.ERROR, "Triton is not installed. triton-cpu is expected on x86 CPUs."),
]


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def installed(monkeypatch):
    for name in [*quiet.ENV, *quiet.ENGINE_ENV, quiet.SWITCH_ENV]:
        monkeypatch.delenv(name, raising=False)
    quiet.install()
    quiet.install()  # idempotent
    return quiet


def _logged(name: str, level: int, message: str) -> bool:
    """Log through the real logger (its filters, then a handler of ours); True when it came out."""
    logger = logging.getLogger(name)
    out = Collect()
    logger.addHandler(out)
    old_level, logger.level = logger.level, logging.DEBUG
    try:
        logger.log(level, "%s", message)
    finally:
        logger.removeHandler(out)
        logger.setLevel(old_level)
    return out.messages == [message]


@pytest.mark.parametrize("name,message", SEEN, ids=[m[:40] for _, m in SEEN])
def test_each_listed_notice_is_dropped_at_its_logger(installed, name, message):
    assert not _logged(name, logging.WARNING, message)


@pytest.mark.parametrize("name,level,message", REAL, ids=[m[:40] for _, _, m in REAL])
def test_other_warnings_and_errors_from_the_same_loggers_stay(installed, name, level, message):
    assert _logged(name, level, message)


def test_every_row_of_the_table_has_a_seen_message_and_a_reason():
    """A row no real message matches filters nothing; each says why it is harmless."""
    for n in quiet.NOTICES:
        assert any(name == n.logger and quiet.FILTER.filter(logging.makeLogRecord(
            {"name": name, "levelno": logging.WARNING, "msg": msg})) is False for name, msg in SEEN), n
        assert len(n.why) > 20, n
    for n in quiet.NOTICES:
        assert logging.getLogger(n.logger).filters.count(quiet.FILTER) <= 1


def test_our_loggers_and_other_libraries_pass(installed):
    assert _logged("agent_rl.rollout.engine", logging.WARNING, "Triton is not installed. triton-cpu is expected")
    assert _logged("vllm.some.other.module", logging.WARNING, "Triton is not installed. triton-cpu is expected")


def test_python_warnings(installed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.install()  # catch_warnings restored the filters; install adds its own on top
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
                      FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


def test_environment_defaults_yield_to_the_user(monkeypatch):
    for name in [*quiet.ENV, *quiet.ENGINE_ENV, quiet.SWITCH_ENV]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    quiet.install()
    import os

    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ  # only processes that run an engine
    quiet.install(engine=True)
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "WARNING")
    assert quiet.engine_env() == {"TORCH_CPP_LOG_LEVEL": "WARNING"}


def test_switched_off(monkeypatch):
    for name in [*quiet.ENV, *quiet.ENGINE_ENV]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(quiet.SWITCH_ENV, "0")
    quiet.install(engine=True)
    import os

    assert not any(name in os.environ for name in [*quiet.ENV, *quiet.ENGINE_ENV])
    assert quiet.engine_env() == {}
