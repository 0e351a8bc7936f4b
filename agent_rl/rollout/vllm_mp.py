"""The multiprocess backend (`rollout.engine_mode=mp`): vLLM's `AsyncLLM`, engine core in a
child process.

Weight sync goes through a safetensors file in /dev/shm and `collective_rpc` (tensors inside
rpc arguments would arrive as plain lists).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from agent_rl.rollout.engine import GenerateResult, RolloutEngine, _to_result


class MultiprocEngine(RolloutEngine):
    async def _start(self, engine_args: dict) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

    async def _generate(self, rid: str, prompt: Any, params: Any) -> GenerateResult:
        final = None
        async for out in self._engine.generate(prompt, params, rid):
            final = out
        assert final is not None
        return _to_result(final)

    async def _load_validated(self, weights: list) -> None:
        if self._engine.get_num_unfinished_requests():
            raise RuntimeError("load_weights called while requests are in flight")
        from safetensors.torch import save_file

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=shm) as f:
            save_file(dict(weights), f.name)
            await self._engine.collective_rpc("agent_rl_reload_weights", args=(f.name, self.tie_word_embeddings))
        await self._engine.reset_prefix_cache()

    async def reset_prefix_cache(self) -> None:
        await self._engine.reset_prefix_cache()

    async def _shutdown(self) -> None:
        self._engine.shutdown()
