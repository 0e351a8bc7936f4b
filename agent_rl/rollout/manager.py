"""Multi-turn, tool-interleaved rollouts: one coroutine per trajectory, token ids end to end.

Each trajectory loops: generate (engine, from ids) -> parse the action of the turn's text ->
search: call the retriever, append the observation ids (mask 0) | answer: stop | neither:
append Search-R1's invalid-action feedback (mask 0) -> generate again. After `max_turns`
turns one last turn runs without search (Search-R1 `run_llm_loop`: same context, the search
is not executed). The total response (sampled + appended tokens) never exceeds
`max_response_length`: each turn's max_tokens is capped by the remaining budget and an
observation is cut to what is left.

Unlike Search-R1's batch-per-turn loop (all sequences generate, then all search, then the
next turn), trajectories proceed independently, so the engine's batch stays full while some
wait on the retriever; and nothing is decoded and re-encoded: the ids the engine sampled are
the ids the trainer sees (Search-R1 re-tokenizes decoded text each turn, which can change ids
and break the logprob/mask alignment).

Modes (evaluation reuses this): "agent" (search allowed), "direct" (no retrieval, one turn),
"rag" (retrieve top-k for the question once, put the passages in the prompt, one turn).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agent_rl.config import TrainConfig
from agent_rl.rollout import observation as O
from agent_rl.rollout import prompts as P
from agent_rl.rollout.engine import GenerateResult, Sampling
from agent_rl.rollout.retrieval_client import RetrieverAuthError, RetrieverRequestError
from agent_rl.types import Trajectory

log = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], Awaitable[list[list[Any]]]]
"""async (queries, topk) -> one list of ScoredDocument per query (retriever_server.schemas)."""

MODES = ("agent", "direct", "rag")
QUERY_REJECTED = (413, 422)
"""Statuses of a query the retriever refused as such (too long, empty, too large)."""


class Engine(Protocol):
    max_model_len: int

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> GenerateResult: ...


@dataclass
class _State:
    """One trajectory under construction; the loss mask is built where tokens are appended."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turns: int = 0
    searches: int = 0
    invalid: int = 0
    tool_failures: int = 0
    obs_truncated: int = 0
    rejected: int = 0

    def append_sampled(self, ids: list[int], logprobs: list[float]) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs

    def append_context(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)


class RolloutManager:
    """Runs trajectories for a batch of prompts on a shared engine and retriever.

    `retriever`: an object with `async search(queries, topk)` (agent_rl.rollout.retrieval_client.
    RetrieverClient) or such a function itself; None disables search (direct mode only).
    `tokenizer`: defaults to the engine's (the same files vLLM detokenizes with).
    """

    def __init__(self, engine: Engine, retriever: Any, cfg: TrainConfig, tokenizer: Any = None) -> None:
        self.engine = engine
        self.search: SearchFn | None = getattr(retriever, "search", retriever)
        self.tokenizer = tokenizer if tokenizer is not None else engine.get_tokenizer()
        self.cfg = cfg
        self.rcfg = cfg.actor_rollout_ref.rollout
        self.max_turns = cfg.max_turns
        self.max_response_length = cfg.data.max_response_length
        self.max_obs_length = cfg.data.max_obs_length
        self.topk = cfg.retriever.topk
        self.template = self.rcfg.template
        self._tool_sem: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ public
    async def rollout(
        self,
        prompts: Sequence[Any],
        n: int | None = None,
        greedy: bool = False,
        mode: str = "agent",
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """n trajectories per prompt (group_id = index of the prompt), in prompt order, and
        `rollout/*` metrics. `prompts` have .question, .golden_answers, .data_source
        (agent_rl.training.data.Prompt) and optionally .prompt_ids (pre-built ids, used as they are).
        greedy: temperature 0 (evaluation)."""
        if mode not in MODES:
            raise ValueError(f"rollout mode must be one of {MODES}, got {mode!r}")
        if mode != "direct" and self.search is None:
            raise ValueError(f"mode {mode!r} needs a retriever")
        n = self.rcfg.n if n is None else n
        sampling = Sampling(
            temperature=0.0 if greedy else self.rcfg.temperature,
            top_p=1.0 if greedy else self.rcfg.top_p,
            max_tokens=self.rcfg.max_tokens_per_turn,
        )
        max_turns = self.max_turns if mode == "agent" else 0
        self._tool_sem = asyncio.Semaphore(self.rcfg.max_concurrent_tool_calls)
        traj_sem = asyncio.Semaphore(self.rcfg.max_concurrent_trajectories)
        t0 = time.perf_counter()

        prompt_ids, rag_failures = await self._build_prompts(prompts, mode)

        async def one(g: int) -> Trajectory:
            async with traj_sem:
                return await self.run_trajectory(prompt_ids[g], sampling, max_turns, group_id=g, meta=prompts[g])

        # A TaskGroup cancels the other trajectories if one fails (e.g. the engine died, or the
        # retriever refused the API key); the first error is raised as itself, not as a group.
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(one(g)) for g in range(len(prompts)) for _ in range(n)]
        except ExceptionGroup as eg:
            raise eg.exceptions[0] from None
        trajs = [t.result() for t in tasks]
        metrics = rollout_metrics(trajs, time.perf_counter() - t0)
        metrics["rollout/tool_failures"] += rag_failures
        return trajs, metrics

    async def run_trajectory(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        max_turns: int,
        group_id: int = 0,
        meta: Any = None,
    ) -> Trajectory:
        """One trajectory: up to max_turns turns with search, then one last turn without."""
        st = _State(list(prompt_ids), [], [], [])
        finish = "max_turns"
        for turn in range(max_turns + 1):
            budget = min(
                self.max_response_length - len(st.response_ids),
                self.engine.max_model_len - len(st.prompt_ids) - len(st.response_ids),
            )
            if budget <= 0:
                finish = "length"
                break
            out = await self.engine.generate(
                st.prompt_ids + st.response_ids, replace(sampling, max_tokens=min(sampling.max_tokens, budget))
            )
            st.turns += 1
            st.append_sampled(out.token_ids, out.logprobs)
            # vLLM cuts `text` right after the stop string; the ids may run a few characters on
            # (a token spanning the end of the tag). Parse the text, keep the ids.
            action, content = P.parse_action(out.text)
            if action == "answer":
                finish = "answer"
                break
            if action is None:
                st.invalid += 1
            if len(st.response_ids) >= self.max_response_length:
                finish = "length"
                break
            if turn == max_turns:  # last turn: no search is executed (Search-R1)
                finish = "max_turns"
                break
            if action == "search":
                st.searches += 1
                obs = await self._observation(content, st)
            else:
                obs = P.encode_text(self.tokenizer, P.FEEDBACK_INVALID)
            room = self.max_response_length - len(st.response_ids)
            st.append_context(obs[:room])
            if len(obs) > room:
                finish = "length"
                break
        return Trajectory(
            prompt_ids=st.prompt_ids,
            response_ids=st.response_ids,
            loss_mask=st.loss_mask,
            rollout_logprobs=st.logprobs,
            group_id=group_id,
            num_turns=st.turns,
            num_searches=st.searches,
            finish_reason=finish,
            response_text=self.tokenizer.decode(st.response_ids, skip_special_tokens=True),
            data_source=str(getattr(meta, "data_source", "") or ""),
            golden_answers=list(getattr(meta, "golden_answers", []) or []),
            question=str(getattr(meta, "question", "") or ""),
            num_invalid=st.invalid,
            num_tool_failures=st.tool_failures,
            num_obs_truncated=st.obs_truncated,
            num_rejected_queries=st.rejected,
        )

    # ------------------------------------------------------------------ tools
    async def _retrieve(self, query: str) -> tuple[str | None, bool]:
        """(formatted passages, False) for one query; (the refusal's text, True) when the server
        rejected the query itself (413/422: the policy's mistake, an observation it is scored
        on); (None, False) when the retriever failed. Any other error (RetrieverUnavailable
        after the client's retries, other 4xx, timeout) becomes None: the trajectory continues
        with an error observation instead of killing the batch. A refused API key
        (RetrieverAuthError) is raised: every search would fail, so the run must stop."""
        assert self.search is not None
        if self._tool_sem is None:
            self._tool_sem = asyncio.Semaphore(self.rcfg.max_concurrent_tool_calls)
        async with self._tool_sem:
            try:
                docs = await asyncio.wait_for(self.search([query], self.topk), self.rcfg.tool_timeout_s)
            except RetrieverAuthError:
                raise
            except RetrieverRequestError as e:
                if e.status in QUERY_REJECTED:
                    return O.rejected_query_text(e.detail), True
                log.warning("search failed for %r: %r", query[:80], e)
                return None, False
            except Exception as e:  # noqa: BLE001 - every failure has the same recovery
                log.warning("search failed for %r: %r", query[:80], e)
                return None, False
        return O.format_passages(docs[0]), False

    async def _observation(self, query: str, st: _State) -> list[int]:
        text, rejected = await self._retrieve(query)
        st.rejected += rejected
        if text is None:
            st.tool_failures += 1
            text = O.SEARCH_ERROR_TEXT
        ids, truncated = O.encode_observation(self.tokenizer, text, self.max_obs_length)
        st.obs_truncated += int(truncated)
        return ids

    async def _build_prompts(self, prompts: Sequence[Any], mode: str) -> tuple[list[list[int]], int]:
        """Prompt ids per prompt; rag mode retrieves once per prompt (shared by its n samples)."""
        docs: list[str | None] = [None] * len(prompts)
        failures = 0
        if mode == "rag":
            got = [text for text, _ in await asyncio.gather(*(self._retrieve(p.question) for p in prompts))]
            failures = sum(t is None for t in got)
            docs = [O.SEARCH_ERROR_TEXT if t is None else t for t in got]
        return [
            list(p.prompt_ids) if getattr(p, "prompt_ids", None) is not None
            else P.build_prompt_ids(self.tokenizer, p.question, self.template, mode, d)
            for p, d in zip(prompts, docs)
        ], failures


def rollout_metrics(trajs: Sequence[Trajectory], seconds: float) -> dict[str, float]:
    """Batch statistics, namespaced rollout/... (the driver logs them)."""
    if not trajs:
        return {"rollout/num_trajectories": 0.0, "rollout/tool_failures": 0.0}
    k = len(trajs)
    turns = [t.num_turns for t in trajs]
    lengths = [len(t.response_ids) for t in trajs]
    sampled = sum(sum(t.loss_mask) for t in trajs)
    m = {
        "rollout/num_trajectories": float(k),
        "rollout/turns_mean": sum(turns) / k,
        "rollout/turns_max": float(max(turns)),
        "rollout/searches_mean": sum(t.num_searches for t in trajs) / k,
        "rollout/valid_action_rate": 1.0 - sum(t.num_invalid for t in trajs) / max(1, sum(turns)),
        "rollout/invalid_actions": float(sum(t.num_invalid for t in trajs)),
        "rollout/tool_failures": float(sum(t.num_tool_failures for t in trajs)),
        "rollout/rejected_queries": float(sum(t.num_rejected_queries for t in trajs)),
        "rollout/obs_truncations": float(sum(t.num_obs_truncated for t in trajs)),
        "rollout/response_length_mean": sum(lengths) / k,
        "rollout/response_length_max": float(max(lengths)),
        "rollout/gen_tokens": float(sampled),
        "rollout/gen_tokens_per_s": sampled / seconds if seconds > 0 else 0.0,
        "rollout/seconds": seconds,
    }
    reasons = Counter(t.finish_reason for t in trajs)
    for r in ("answer", "max_turns", "length"):
        m[f"rollout/finish_{r}"] = reasons.get(r, 0) / k
    return m
