"""The transformers backend (`rollout.engine_mode=hf`): no vLLM, for tests of the training loop.

A plain `AutoModelForCausalLM` samples one sequence at a time with its KV cache, token by
token, under vLLM's contract (`agent_rl.rollout.engine`): the same ids, the same logprob
semantics (the module docstring there), the same finish and stop reasons, stop strings cut the
same way. It starts in seconds where vLLM takes tens, so lifecycle tests whose subject is the
trainer (resume, the clock, async continuation, outages) run on the real policy without vLLM;
it is not for speed (no batching, no prefix cache).

Every model call (generation, weight load) runs in one worker thread, which serialises them
(a request waits its turn, FIFO) and keeps the event loop free for retriever I/O meanwhile,
as the in-process vLLM backend does with its stepper thread.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agent_rl.rollout.engine import GenerateResult, RolloutEngine, Sampling

if TYPE_CHECKING:  # pragma: no cover
    import torch


class Cancelled(Exception):
    """A request whose caller went away stops at its next token."""


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The log-distribution a token is sampled from, as vLLM's `processed_logprobs`: logits /
    temperature, then top-p (tokens outside the nucleus at -inf, the rest renormalised);
    temperature 0 (greedy) gives the raw model's log-softmax. `logits`: [V] float32."""
    import torch

    if temperature <= 0:
        return torch.log_softmax(logits, -1)
    logits = logits / temperature
    if top_p < 1.0:
        # vLLM's rule: drop a token once the mass of the tokens more likely than it reaches
        # top_p (the most likely token always stays)
        probs, order = torch.softmax(logits, -1).sort(descending=True)
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return torch.log_softmax(logits, -1)


def find_stop(text: str, new_chars: int, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """(stop string, end of the text to keep) for the first of `stops` (in their order) that
    ends in the last `new_chars` characters of `text`, or None (vLLM's detokenizer looks only
    there, so a stop string in earlier text, already checked, is not found twice)."""
    for stop in stops:
        i = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if i != -1:
            return stop, i + len(stop)
    return None


class HfEngine(RolloutEngine):
    """`RolloutEngine` on transformers: one sequence at a time in one worker thread."""

    uses_vllm = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tokenizer: Any = None
        self._eos: int | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._pool: ThreadPoolExecutor | None = None
        self._rng: Any = None
        self._in_flight = 0

    async def _start(self, engine_args: dict) -> None:
        loop = asyncio.get_running_loop()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        await loop.run_in_executor(self._pool, self._load, engine_args)

    def _load(self, engine_args: dict) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        dtype = getattr(torch, engine_args["dtype"])
        path = engine_args["model"]
        if engine_args.get("load_format") == "dummy":  # random weights: the first sync replaces them
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        self._engine = model.eval()
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._eos = self._tokenizer.eos_token_id
        # vLLM also stops on the generation config's other EOS ids, reported as the stop reason
        extra = getattr(model.generation_config, "eos_token_id", None)
        extra = {extra} if isinstance(extra, int) else set(extra or ())
        self._stop_ids = frozenset(extra - {self._eos})
        # calls without a seed draw from one engine generator seeded by rollout.seed, as vLLM's
        self._rng = torch.Generator().manual_seed(int(engine_args.get("seed") or 0))

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def _prompt(self, prompt_ids: list[int]) -> Any:
        return list(prompt_ids)

    def _sampling_params(self, s: Sampling) -> Sampling:
        return s

    # -- generation
    async def _generate(self, rid: str, prompt: Any, params: Sampling) -> GenerateResult:
        cancelled = threading.Event()
        self._in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._sample, prompt, params, cancelled)
        except asyncio.CancelledError:
            cancelled.set()  # a request already running stops at its next token; a queued one never runs
            raise
        finally:
            self._in_flight -= 1

    def _sample(self, prompt_ids: list[int], s: Sampling, cancelled: threading.Event) -> GenerateResult:
        import torch

        model, tok = self._engine, self._tokenizer
        rng = torch.Generator().manual_seed(s.seed) if s.seed is not None else self._rng
        ids: list[int] = []
        lps: list[float] = []
        text, finish, stop_reason = "", "length", None
        with torch.inference_mode():
            out = model(torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=1)  # not [P, V] logits
            while len(ids) < s.max_tokens:
                if cancelled.is_set():
                    raise Cancelled
                logp = processed_logprobs(out.logits[0, -1].float(), s.temperature, s.top_p)
                if s.temperature <= 0:
                    token = int(logp.argmax())
                else:
                    token = int(torch.multinomial(logp.exp(), 1, generator=rng))
                ids.append(token)
                lps.append(float(logp[token]))
                if not s.ignore_eos and (token == self._eos or token in self._stop_ids):
                    # EOS stays in the ids (it was sampled; vLLM keeps it); no text, no stop string
                    finish, stop_reason = "stop", (None if token == self._eos else token)
                    break
                new_text = tok.decode(ids, skip_special_tokens=True)
                hit = find_stop(new_text, len(new_text) - len(text), s.stop) if s.stop else None
                text = new_text
                if hit is not None:
                    finish, stop_reason = "stop", hit[0]
                    text = text[: hit[1]]  # cut right after the stop string; the ids keep the whole token
                    break
                if len(ids) < s.max_tokens:
                    out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        return GenerateResult(token_ids=ids, logprobs=lps, finish_reason=finish, stop_reason=stop_reason, text=text)

    # -- weights
    async def _load_validated(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if self._in_flight:
            raise RuntimeError("load_weights called while requests are in flight")
        await asyncio.get_running_loop().run_in_executor(self._pool, self._copy_weights, weights)

    def _copy_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        model = self._engine
        # load_state_dict copies into the parameters (converting to the engine dtype), so the
        # caller's tensors, possibly read-only views of Ray's object store, are not kept
        missing, unexpected = model.load_state_dict(dict(weights), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"load_weights: model and weights disagree: missing {missing}, unexpected {unexpected}")
        if self.tie_word_embeddings:  # the head is the embedding again, whatever the load did
            model.lm_head.weight = model.get_input_embeddings().weight

    async def reset_prefix_cache(self) -> None:
        """Nothing to reset: every call prefills its prompt afresh."""

    async def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
