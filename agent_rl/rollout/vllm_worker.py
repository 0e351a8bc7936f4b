"""Code that runs inside vLLM's worker (the model runner's process): in-place weight reload.

Kept apart from the engines because vLLM imports it by name (`worker_extension_cls`) in its
own process, where nothing else of agent_rl is needed.
"""

from __future__ import annotations

import time
from typing import Any

from data_prep.hardware import hide_amx
from data_prep.quiet import install

install()  # with engine_mode=mp this module loads in vLLM's own process, where no entry point ran
hide_amx()  # under the AVX2 emulation switches vLLM must not pick AMX kernels (data_prep.hardware)


def _reload_in_worker(worker: Any, weights: Any, tie_word_embeddings: bool) -> float:
    """Runs inside the vLLM worker: reload weights in place, then fix the tied lm_head.

    `weights` is a list of (name, tensor) or a safetensors path (multiprocess backend).
    Returns the seconds spent. Pitfalls handled:
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
