"""Multi-turn, tool-interleaved rollouts: one coroutine per trajectory, token ids end to end.

Each trajectory loops: generate (engine, from ids) -> the protocol parses the turn's action
(`agent_rl.rollout.protocol`) -> a tool call: invoke the tool, append its output in the
protocol's frame (mask 0) | answer: stop | neither (or a malformed call): append the
protocol's feedback (mask 0) -> generate again. After `max_turns` turns one last turn runs
without tools (Search-R1 `run_llm_loop`: same context, the call is not executed). The total
response (sampled + appended tokens) never exceeds `max_response_length`: each turn's
max_tokens is capped by the remaining budget and an observation is cut to what is left.

Unlike Search-R1's batch-per-turn loop (all sequences generate, then all search, then the
next turn), trajectories proceed independently, so the engine's batch stays full while some
wait on a tool; and nothing is decoded and re-encoded: the ids the engine sampled are the ids
the trainer sees (Search-R1 re-tokenizes decoded text each turn, which can change ids and
break the logprob/mask alignment).

Tools (`actor_rollout_ref.rollout.tools`): the retriever as `search`, the `calculator`, and
MCP servers' tools (`agent_rl.rollout.mcp_tools`, connected on the first rollout; `aclose()`
ends them). Each tool holds its own concurrency limit, made once per manager, so concurrent
`rollout()` calls (evaluation's questions) share it.

Modes (evaluation reuses this, `protocol.MODES`): "agent" (tools offered), "direct" (no
retrieval, one turn), "rag" (retrieve top-k for the question once into the prompt, one turn).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from agent_rl.config import ToolConfig, TrainConfig
from agent_rl.rollout import observation
from agent_rl.rollout.engine import GenerateResult, Sampling
from agent_rl.rollout.gate import PolicyGate
from agent_rl.rollout.protocol import Action, ActionProtocol, Segment, encode_text, get_mode, get_protocol, repeated
from agent_rl.rollout.retrieval_client import RetrieverAuthError, RetrieverRequestError
from agent_rl.rollout.tools import (Tool, ToolFatalError, ToolInputError, ToolStats, calculator_tool, search_tool,
                                    tool_metrics)
from agent_rl.types import Trajectory

log = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], Awaitable[list[list[Any]]]]
"""async (queries, topk) -> one list of ScoredDocument per query (retriever_server.schemas)."""

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
    versions: list[int] = field(default_factory=list)
    """Per response token: the policy version that sampled it (-1: appended context)."""
    segments: list[Segment] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    turns: int = 0
    searches: int = 0
    tool_calls: int = 0
    invalid: int = 0
    bad_calls: int = 0
    repeated: int = 0
    tool_failures: int = 0
    obs_truncated: int = 0
    rejected: int = 0

    def append_sampled(self, ids: list[int], logprobs: list[float], text: str, version: int = 0) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += [version] * len(ids)
        self.segments.append(("sampled", text))

    def append_context(self, ids: list[int], kind: str, text: str) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        self.segments.append((kind, text))

    def copy(self) -> _State:
        """A copy to keep (lists copied): what a checkpoint saves of a trajectory in flight."""
        return replace(self, **{f.name: list(getattr(self, f.name)) for f in fields(self)
                                if isinstance(getattr(self, f.name), list)})


class RolloutManager:
    """Runs trajectories for a batch of prompts on a shared engine and tools.

    `retriever`: an object with `async search(queries, topk)` (agent_rl.rollout.retrieval_client.
    RetrieverClient) or such a function itself; None: no search tool (direct mode, or other tools).
    `tokenizer`: defaults to the engine's (the same files vLLM detokenizes with).
    `tools`: more `Tool`s beside those of the config (e.g. plain functions a user wrote).
    """

    def __init__(self, engine: Engine, retriever: Any, cfg: TrainConfig, tokenizer: Any = None,
                 tools: Sequence[Tool] = ()) -> None:
        self.engine = engine
        self.gate = PolicyGate(engine)
        """Every generation goes through it: policy versions per token, weight swaps between turns."""
        self.search: SearchFn | None = getattr(retriever, "search", retriever)
        self.tokenizer = tokenizer if tokenizer is not None else engine.get_tokenizer()
        self.cfg = cfg
        self.rcfg = cfg.actor_rollout_ref.rollout
        self.max_turns = cfg.max_turns
        self.max_response_length = cfg.data.max_response_length
        self.max_obs_length = cfg.data.max_obs_length
        self.topk = cfg.retriever.topk
        self.template = self.rcfg.template
        self.tools: dict[str, Tool] = {}
        for t in self.rcfg.tools:
            if t.is_mcp:
                continue
            if t.name == "search" and self.search is None:
                continue  # no retriever (direct mode): no search tool
            self.tools[t.name] = self._builtin(t)
        for t in tools:
            self.tools[t.name] = t
        self._mcp_configs = [t for t in self.rcfg.tools if t.is_mcp]
        self._mcp_servers: list[Any] = []
        self._dropped_seen: dict[str, int] = {}  # per MCP server: dropped_notifications at the last step's metrics
        self._mcp_lock: asyncio.Lock | None = None
        self.protocol: ActionProtocol = get_protocol(self.rcfg.protocol, self.rcfg.tool_chat_template)
        self.protocol.check_tools(self.tools)
        self._bind()

    def _builtin(self, t: Any) -> Tool:
        timeout = t.timeout_s if t.timeout_s is not None else self.rcfg.tool_timeout_s
        limit = t.max_concurrency if t.max_concurrency is not None else self.rcfg.max_concurrent_tool_calls
        if t.name == "search":
            return search_tool(self._search_text, timeout, limit, failure_text=observation.SEARCH_ERROR_TEXT,
                               fatal=(RetrieverAuthError,))
        return calculator_tool(timeout, limit)

    def _bind(self) -> None:
        self.protocol = self.protocol.bind(self.tokenizer, list(self.tools.values()))

    async def start_tools(self) -> None:
        """Connect the MCP servers of the config (once; the first rollout does it). Every step
        is bounded (initialize: the server's connect timeout; tools/list: the tool timeout), and
        a failure closes the servers this call started and adds none of their tools, so the
        error reaches the caller and a later call starts over, never with half the tools."""
        if not self._mcp_configs or self._mcp_servers:
            return
        if self._mcp_lock is None:
            self._mcp_lock = asyncio.Lock()
        async with self._mcp_lock:
            if self._mcp_servers:
                return
            from agent_rl.rollout.mcp_tools import McpServer

            servers: list[Any] = []
            tools = dict(self.tools)
            try:
                for t in self._mcp_configs:
                    server = McpServer(command=t.mcp_command, url=t.mcp_url, name=t.name)
                    servers.append(server)
                    await server.start()
                    timeout = t.timeout_s if t.timeout_s is not None else self.rcfg.tool_timeout_s
                    limit = t.max_concurrency if t.max_concurrency is not None else self.rcfg.max_concurrent_tool_calls
                    for tool in await server.tools(t.include, timeout_s=timeout, max_concurrency=limit):
                        if tool.name in tools:
                            raise ValueError(f"MCP server {t.name!r} offers a tool named {tool.name!r}, which exists already")
                        tools[tool.name] = tool
                self.protocol.check_tools(tools)
            except BaseException:
                for server in servers:
                    await server.aclose()
                raise
            self.tools, self._mcp_servers = tools, servers
            self._bind()

    async def aclose(self) -> None:
        """End the MCP servers' connections (stdio servers' processes exit)."""
        servers, self._mcp_servers = self._mcp_servers, []
        for server in servers:
            await server.aclose()

    def tool_stats(self) -> dict[str, ToolStats]:
        return {name: t.stats.copy() for name, t in self.tools.items()}

    # ------------------------------------------------------------------ public
    async def rollout(
        self,
        prompts: Sequence[Any],
        n: int | None = None,
        greedy: bool = False,
        mode: str = "agent",
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """n trajectories per prompt (group_id = index of the prompt), in prompt order, and
        `rollout/*` and `tool/*` metrics. `prompts` have .question, .golden_answers,
        .data_source (agent_rl.training.data.Prompt) and optionally .prompt_ids (pre-built ids,
        used as they are). greedy: temperature 0 (evaluation)."""
        m = get_mode(mode)
        if m.retrieve_first and self.search is None:
            raise ValueError(f"mode {mode!r} needs a retriever")
        if m.tools:
            await self.start_tools()
            if not self.tools:
                raise ValueError(f"mode {mode!r} needs a tool (a retriever, or tools in the config)")
        n = self.rcfg.n if n is None else n
        sampling = self.sampling(greedy)
        max_turns = self.max_turns if m.tools else 0
        traj_sem = asyncio.Semaphore(self.rcfg.max_concurrent_trajectories)
        before = self.tool_stats()
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
        after = self.tool_stats()
        metrics.update(tool_metrics({k: v.minus(before.get(k, ToolStats())) for k, v in after.items()}))
        for server in self._mcp_servers:  # unread notifications (dropped by mcp_tools' relay) since the last step
            seen, self._dropped_seen[server.name] = self._dropped_seen.get(server.name, 0), server.dropped_notifications
            metrics[f"mcp/{server.name}/dropped_notifications"] = float(server.dropped_notifications - seen)
        return trajs, metrics

    def sampling(self, greedy: bool = False) -> Sampling:
        """Sampling settings of a turn (greedy: temperature 0, evaluation)."""
        return Sampling(
            temperature=0.0 if greedy else self.rcfg.temperature,
            top_p=1.0 if greedy else self.rcfg.top_p,
            max_tokens=self.rcfg.max_tokens_per_turn,
            stop=self.protocol.stop,
        )

    async def run_trajectory(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        max_turns: int,
        group_id: int = 0,
        meta: Any = None,
        state: _State | None = None,
        on_turn: Callable[[_State], None] | None = None,
    ) -> Trajectory:
        """One trajectory: up to max_turns turns with tools, then one last turn without.

        `state`: continue a trajectory saved at the start of a turn (a checkpoint's, see
        `on_turn`) instead of starting from `prompt_ids`. `on_turn(copy)`: called with a copy of
        the state at the start of every turn (what a checkpoint saves of a trajectory in flight)."""
        st = state.copy() if state is not None else _State(list(prompt_ids), [], [], [])
        finish = "max_turns"
        for turn in range(st.turns, max_turns + 1):
            if on_turn is not None:
                on_turn(st.copy())
            budget = min(
                self.max_response_length - len(st.response_ids),
                self.engine.max_model_len - len(st.prompt_ids) - len(st.response_ids),
            )
            if budget <= 0:
                finish = "length"
                break
            out, version = await self.gate.generate(
                st.prompt_ids + st.response_ids, replace(sampling, max_tokens=min(sampling.max_tokens, budget))
            )
            st.turns += 1
            # vLLM cuts `text` right after the stop string; the ids may run a few characters on
            # (a token spanning the end of the tag). Parse the text, keep the ids.
            st.append_sampled(out.token_ids, out.logprobs, out.text, version)
            action = self._parse(out.text)
            if action.kind == "answer":
                finish = "answer"
                break
            if action.kind == "invalid":
                st.invalid += 1
                st.bad_calls += action.error is not None
            if len(st.response_ids) >= self.max_response_length:
                finish = "length"
                break
            if turn == max_turns:  # last turn: no tool is executed (Search-R1)
                finish = "max_turns"
                break
            room = self.max_response_length - len(st.response_ids)
            kind, text, ids = await self._respond(action, st, min(self.max_obs_length, room))
            st.append_context(ids[:room], kind, text)
            if len(ids) > room:
                finish = "length"
                break
        response_text = self.tokenizer.decode(st.response_ids, skip_special_tokens=True)
        return Trajectory(
            prompt_ids=st.prompt_ids,
            response_ids=st.response_ids,
            loss_mask=st.loss_mask,
            rollout_logprobs=st.logprobs,
            policy_versions=st.versions,
            group_id=group_id,
            num_turns=st.turns,
            num_searches=st.searches,
            finish_reason=finish,
            response_text=response_text,
            reward_text=self.protocol.reward_text(response_text, st.segments),
            data_source=str(getattr(meta, "data_source", "") or ""),
            golden_answers=list(getattr(meta, "golden_answers", []) or []),
            question=str(getattr(meta, "question", "") or ""),
            num_invalid=st.invalid,
            num_tool_failures=st.tool_failures,
            num_obs_truncated=st.obs_truncated,
            num_rejected_queries=st.rejected,
            num_tool_calls=st.tool_calls,
            num_bad_tool_calls=st.bad_calls,
            num_repeated_queries=st.repeated,
        )

    # ------------------------------------------------------------------ tools
    async def _search_text(self, query: str) -> str:
        """Passages for one query (the search tool's function). A query the server refused as
        such (413/422: the policy's mistake, an observation it is scored on) is a
        ToolInputError; a refused API key (RetrieverAuthError) is raised through: every search
        would fail, so the run must stop; any other error (RetrieverUnavailable after the
        client's retries, other 4xx, a timeout) is a tool failure: the trajectory continues
        with an error observation instead of killing the batch."""
        assert self.search is not None
        try:
            docs = await self.search([query], self.topk)
        except RetrieverRequestError as e:
            if e.status in QUERY_REJECTED and not isinstance(e, RetrieverAuthError):
                raise ToolInputError(observation.rejected_query_text(e.detail)) from None
            raise
        return observation.format_passages(docs[0])

    def _framed(self, text: str, frame: tuple[str, str], st: _State, limit: int) -> tuple[list[int], bool]:
        """Ids of our own `text` (feedback, an error observation) in `frame`, cut to `limit`."""
        ids, truncated = observation.encode_observation(self.tokenizer, text, limit, frame)
        return self._without_repeated_end(ids, st), truncated

    def _without_repeated_end(self, ids: list[int], st: _State) -> list[int]:
        """A turn that ended in the template's end-of-turn token (the model closed its message
        itself) has it already: the frame's copy of that special token is not appended twice."""
        if (ids and st.loss_mask and st.loss_mask[-1] == 1 and ids[0] == st.response_ids[-1]
                and ids[0] in set(getattr(self.tokenizer, "all_special_ids", ()))):
            return ids[1:]
        return ids

    def _parse(self, text: str) -> Action:
        """The turn's action; `parse` is total by design, and should it still raise, the turn is
        the model's invalid action, not the end of the batch (a TaskGroup cancels every
        trajectory of the step when one raises)."""
        try:
            return self.protocol.parse(text, self.tools)
        except Exception as e:  # noqa: BLE001 - last resort: one turn's text must not stop the batch
            log.exception("could not parse a turn (%d characters); it is an invalid action", len(text))
            return Action("invalid", error=f"the turn could not be read ({type(e).__name__})")

    async def _respond(self, action: Action, st: _State, limit: int) -> tuple[str, str, list[int]]:
        """(kind, text, ids) appended after a turn: the protocol's feedback, or the tool's
        observation (at most `limit` ids). A tool call never raises but a tool's fatal error
        (e.g. a refused API key: every call would fail, the run stops): anything else that
        escapes the checks (a tool's output the path cannot handle) gives this trajectory an
        error observation, counted as a tool failure, and the batch goes on (a TaskGroup
        cancels every trajectory of the step when one raises)."""
        if action.kind != "tool":
            return self._feedback(action, st)
        try:
            return await self._observation(action, st, limit)
        except Exception as e:  # noqa: BLE001 - last resort, see the docstring
            tool = self.tools.get(action.tool or "")
            if isinstance(e, ToolFatalError) or (tool is not None and isinstance(e, tool.fatal)):
                raise
            log.exception("tool %r: its call or output failed outside the tool; an error observation", action.tool)
            st.tool_failures += 1
            text = f"Tool {action.tool} failed: {type(e).__name__}."
            ids, _ = self._framed(text, self.protocol.observation_frame(), st, limit)
            return "observation", text, ids

    async def _observation(self, action: Action, st: _State, limit: int) -> tuple[str, str, list[int]]:
        tool = self.tools[action.tool]
        st.tool_calls += 1
        if action.tool == "search":
            st.searches += 1
            q = action.query
            if q is not None:
                st.repeated += repeated(q, st.queries)
                st.queries.append(q)
        res = await tool.invoke(action.arguments)
        if res.error == "rejected" and action.tool == "search":
            st.rejected += 1
        if res.error == "bad_args":
            st.invalid += 1
            st.bad_calls += 1
        if not res.ok:
            st.tool_failures += 1
        obs = observation.tool_observation(self.tokenizer, res.text, limit, self.protocol.observation_frame())
        st.obs_truncated += int(obs.truncated)
        return "observation", obs.text, self._without_repeated_end(obs.ids, st)

    def _feedback(self, action: Action, st: _State) -> tuple[str, str, list[int]]:
        text = self.protocol.feedback(action)
        frame = self.protocol.feedback_frame(action)
        if frame == ("", ""):
            return "feedback", text, encode_text(self.tokenizer, text)
        ids, _ = self._framed(text, frame, st, 1 << 30)
        return "feedback", text, ids

    async def _build_prompts(self, prompts: Sequence[Any], mode: str) -> tuple[list[list[int]], int]:
        """Prompt ids per prompt; rag mode retrieves once per prompt (shared by its n samples)."""
        docs: list[str | None] = [None] * len(prompts)
        failures = 0
        if get_mode(mode).retrieve_first:
            search = self.tools.get("search") or self._builtin(ToolConfig(name="search"))
            got = await asyncio.gather(*(search.invoke({"query": p.question}) for p in prompts))
            failures = sum(not r.ok for r in got)
            # The passages reach the prompt as a search's reach a trajectory (tool_observation:
            # tags and special tokens neutralised, at most data.max_obs_length tokens). Raw, a
            # passage holding `<|im_start|>` opened a turn and a 2 MB one made a 400k-token prompt.
            docs = [observation.tool_observation(self.tokenizer, r.text, self.max_obs_length, ("", "")).text for r in got]
        return [
            list(p.prompt_ids) if getattr(p, "prompt_ids", None) is not None
            else self.protocol.prompt_ids(self.tokenizer, p.question, self.template, mode, d)
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
        "rollout/invalid_action_rate": sum(t.num_invalid for t in trajs) / max(1, sum(turns)),
        "rollout/invalid_actions": float(sum(t.num_invalid for t in trajs)),
        "rollout/bad_tool_calls": float(sum(t.num_bad_tool_calls for t in trajs)),
        "rollout/tool_calls_mean": sum(t.num_tool_calls for t in trajs) / k,
        "rollout/repeated_query_rate": sum(t.num_repeated_queries for t in trajs) / max(1, sum(t.num_searches for t in trajs)),
        "rollout/answered_without_search": sum(t.finish_reason == "answer" and t.num_searches == 0 for t in trajs) / k,
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
