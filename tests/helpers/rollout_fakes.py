"""Fakes for rollout tests: a scripted engine (non-canonical ids, distinct logprobs), an
in-process retriever, a small config, a tokenizer that records what it encodes. Shared by tests/agent_rl (pytest's `pythonpath`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agent_rl.config import TrainConfig
from agent_rl.rollout.engine import GenerateResult, Sampling
from agent_rl.rollout.retrieval_client import RetrieverUnavailable
from retriever_server.schemas import Document, ScoredDocument


def make_cfg(max_turns=3, max_response_length=512, max_obs_length=256, n=1, **rollout) -> TrainConfig:
    cfg = TrainConfig()
    cfg.max_turns = max_turns
    cfg.data.max_response_length = max_response_length
    cfg.data.max_obs_length = max_obs_length
    cfg.actor_rollout_ref.rollout.n = n
    cfg.actor_rollout_ref.rollout.chat_template = False
    for k, v in rollout.items():
        setattr(cfg.actor_rollout_ref.rollout, k, v)
    return cfg


@dataclass
class Q:
    question: str
    golden_answers: list[str] = field(default_factory=lambda: ["x"])
    data_source: str = "test"


# ----------------------------------------------------------------------------- fakes
class ScriptedEngine:
    """Plays a script of turn texts (a list, or a function of the decoded context). Each text is tokenized piece by piece ("|" separates
    pieces), which gives NON-canonical ids like a real sampler can produce; logprobs are
    distinct negative numbers. Records every request and result."""

    def __init__(self, tok, script, max_model_len=4096, delay=0.0):
        self.tok, self.max_model_len, self.delay = tok, max_model_len, delay
        self.script = script if callable(script) else list(script)
        self.calls: list[tuple[list[int], Sampling]] = []
        self.results: list[GenerateResult] = []
        self.in_flight = self.max_in_flight = 0
        self._lp = 0

    async def generate(self, prompt_ids, sampling):
        self.calls.append((list(prompt_ids), sampling))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        if callable(self.script):
            text = self.script(self.tok.decode(prompt_ids))
        else:
            text = self.script.pop(0) if self.script else "rambling"
        ids = [i for piece in text.split("|") for i in self.tok.encode(piece, add_special_tokens=False)]
        ids = ids[: sampling.max_tokens]
        lps = [-(self._lp + k + 1) / 1000 for k in range(len(ids))]
        self._lp += len(ids)
        full = self.tok.decode(ids)
        stop = next((s for s in sampling.stop if s in full), None)
        out = GenerateResult(ids, lps, "stop" if stop else "length", stop, full[: full.index(stop) + len(stop)] if stop else full)
        self.results.append(out)
        return out


class FakeRetriever:
    def __init__(self, fail=False, hang=False, delay=0.0):
        self.fail, self.hang, self.delay = fail, hang, delay
        self.queries: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def search(self, queries, topk):
        self.queries += queries
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.delay)
            if self.fail:
                raise RetrieverUnavailable("down")
            return [self.docs(q, topk) for q in queries]
        finally:
            self.in_flight -= 1

    @staticmethod
    def docs(q, topk):
        return [ScoredDocument(document=Document(id=str(i), contents=f'"{q} {i}"\nText about {q}, part {i}.'), score=1.0 / (i + 1))
                for i in range(topk)]


class CountingTokenizer:
    """The real tokenizer, recording the longest text it was asked to encode."""

    def __init__(self, tok):
        self._tok, self.longest = tok, 0

    def encode(self, text, *a, **kw):
        self.longest = max(self.longest, len(text))
        return self._tok.encode(text, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)
