"""Cold-start demonstrations: grounded trajectories in exactly the rollout's format.

`agent-rl-prep demos --qa FILE --retriever-url URL --out demos.parquet [--max-searches K]
[--limit N [--rest]] [--kinds K1,K2:N] [--seed S] [--plain-wording] [--config configs/train/X.yaml key=value ...]`
(parsed in `agent_rl.coldstart.cli`).

A demonstration is a rollout of a scripted policy: the real `RolloutManager` runs with an
engine that "samples" the demonstration's model turns (`<think> .. </think>` + `<search> q
</search>`, then `<think> .. </think>` + `<answer> gold </answer>`) and a retriever that
returns what the running retriever service answered for those queries. So the prompt
template, the observation text and truncation, the response budget and the loss mask come
from the rollout code itself (one tokenization path and one protocol: `agent_rl.rollout.protocol`), with the RL run's
settings (`--config`: template, max_obs_length, max_response_length, max_tokens_per_turn,
retriever.topk, max_turns).

Grounded: a candidate is kept only when the text the model would have read (each
observation after truncation) contains a gold answer, and, when the data gives each hop's
answer (the embedded knowledge base's `hop_answers`), each hop's observation contains its
hop answer. Everything else is dropped and counted by reason.

Search chains (`--chains K`, on by default with K = 4 when max_searches >= 2): a question
whose own search does not retrieve a gold answer gets up to K second searches, from its
supporting titles and the names its first observation mentions (`plan.chain_candidates`);
the first that finds a passage titled with that name (the search looked the name up) and
whose observation contains a gold answer becomes a two-search demonstration.

Queries, grounding checks and the wording of the model turns: `agent_rl.coldstart.plan`;
the file format SFT reads: `agent_rl.coldstart.demo_file`.

Output parquet, one row per demonstration: `prompt_ids`, `response_ids`, `loss_mask` (1 on
the model's turns, 0 on observations), the `segments` (model turns as text), `prompt_text`,
`response_text`, `queries`, `answer`, plus the QA row's id, question, golden_answers,
data_source and kind. The settings used are stored in the file's metadata, which
`agent-rl-sft` checks.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_rl.coldstart.plan import (
    DROP_REASONS,
    Drop,
    Plan,
    chain_candidates,
    contains,
    grounded_answer,
    plan_queries,
    row_kind,
    support_titles,
    write_segments,
)
from agent_rl.config import TrainConfig
from agent_rl.rollout import observation
from agent_rl.rollout.protocol import ActionProtocol, encode_text, neutralize_tags, protocol_for, special_texts
from agent_rl.rollout.engine import GenerateResult, Sampling
from agent_rl.types import Trajectory

SearchFn = Callable[[list[str], int], Awaitable[list[list[Any]]]]


class ScriptedEngine:
    """Stands in for the vLLM engine: "samples" the demonstration's turns, one per call.

    Token ids are `protocol.encode_text` of each turn (the engine's own sampled ids for that
    text would differ only in how the model chose to split it), then `end_ids`: the protocol's
    `turn_end_ids`, so that SFT teaches a chat-format model to close its turns (hermes:
    `<|im_end|>` after `</tool_call>` and `</answer>`), which a consumer without our stop
    strings needs. A turn longer than the call's max_tokens is cut, as the engine would.
    """

    def __init__(self, tokenizer: Any, segments: list[str], max_model_len: int, end_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.turns = [encode_text(tokenizer, s) + list(end_ids) for s in segments]
        self.max_model_len = max_model_len
        self.calls = 0

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> GenerateResult:
        if self.calls >= len(self.turns):
            raise RuntimeError("scripted engine: the rollout asked for more turns than the demonstration has")
        ids = self.turns[self.calls]
        self.calls += 1
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        return GenerateResult(ids, [0.0] * len(ids), finish, None, self.tokenizer.decode(ids, skip_special_tokens=True))


class CachedSearch:
    """`async search(queries, topk)` answering from results fetched from the retriever."""

    def __init__(self, results: dict[str, list[Any]]):
        self.results = results

    async def search(self, queries: list[str], topk: int) -> list[list[Any]]:
        return [self.results[q] for q in queries]


def visible_observation(tokenizer: Any, docs: list[Any], max_obs_length: int, protocol: ActionProtocol | None = None) -> str:
    """The observation text the policy reads for `docs` (formatted, framed by the protocol and
    truncated by the rollout's own functions)."""
    frame = (observation.OBS_OPEN, observation.OBS_CLOSE) if protocol is None else protocol.observation_frame()
    ids = observation.tool_observation(tokenizer, observation.format_passages(docs), max_obs_length, frame).ids
    return tokenizer.decode(ids, skip_special_tokens=True)


# ----------------------------------------------------------------------------- building
@dataclass
class BuildResult:
    rows: list[dict]
    """One output row per kept demonstration."""
    dropped: Counter = field(default_factory=Counter)
    """Dropped candidates by reason."""
    dropped_ids: list[tuple[str, str]] = field(default_factory=list)
    """(QA id, reason) of every dropped candidate."""

    @property
    def candidates(self) -> int:
        return len(self.rows) + sum(self.dropped.values())


async def fetch_results(search: SearchFn, queries: list[str], topk: int, chunk: int = 128) -> dict[str, list[Any] | None]:
    """Results per unique query (batched requests); None for a query the server rejected."""
    from agent_rl.rollout.retrieval_client import RetrieverRequestError

    out: dict[str, list[Any] | None] = {}
    for i in range(0, len(queries), chunk):
        part = queries[i : i + chunk]
        try:
            got = await search(part, topk)
        except RetrieverRequestError:  # one bad query must not sink its batch: ask one by one
            got = []
            for q in part:
                try:
                    got.append((await search([q], topk))[0])
                except RetrieverRequestError:
                    got.append(None)
        out.update(zip(part, got))
    return out


async def _one_demo(row: dict, plan: Plan, results: dict, tokenizer: Any, cfg: TrainConfig, seed: int,
                    kb_phrasing: bool = True) -> dict:
    """Ground, write and roll out one demonstration; raises Drop."""
    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.training.data import Prompt

    docs = [results[q] for q in plan.queries]
    if any(d is None for d in docs):
        raise Drop("retriever_rejected")
    protocol = protocol_for(cfg.actor_rollout_ref.rollout, tokenizer)
    obs = [visible_observation(tokenizer, d, cfg.data.max_obs_length, protocol) for d in docs]
    for q, a, o in zip(plan.queries, plan.hop_answers, obs):
        if a is not None and not contains(o, a):
            raise Drop("hop_answer_not_retrieved", f"{a!r} not in the observation for {q!r}")
    golds = [str(g) for g in row["golden_answers"]]
    answer = grounded_answer(golds, obs)
    if answer is None:
        raise Drop("answer_not_retrieved")
    rng = random.Random(f"{seed}:{row['id']}")  # per row: wording independent of order and --limit
    segments = write_segments(plan, answer, rng, protocol, kb_phrasing)

    engine = ScriptedEngine(tokenizer, segments, cfg.data.max_prompt_length + cfg.data.max_response_length,
                            protocol.turn_end_ids())
    if max(map(len, engine.turns)) > cfg.actor_rollout_ref.rollout.max_tokens_per_turn:
        raise Drop("turn_too_long")
    manager = RolloutManager(engine, CachedSearch(results), cfg, tokenizer=tokenizer)
    prompt = Prompt(id=str(row["id"]), question=str(row["question"]), golden_answers=golds,
                    data_source=str(row.get("data_source") or ""))
    (traj,), _ = await manager.rollout([prompt], n=1, greedy=True, mode="agent")
    if traj.finish_reason != "answer" or traj.num_searches != len(plan.queries) or traj.num_invalid:
        raise Drop("too_long", f"finish={traj.finish_reason} searches={traj.num_searches}")
    return demo_row(row, traj, segments, plan.queries, answer, tokenizer)


def demo_row(row: dict, traj: Trajectory, segments: list[str], queries: list[str], answer: str, tokenizer: Any) -> dict:
    return {
        "id": str(row["id"]),
        "question": str(row["question"]),
        "golden_answers": [str(g) for g in row["golden_answers"]],
        "data_source": str(row.get("data_source") or ""),
        "kind": row_kind(row),
        "answer": answer,
        "queries": list(queries),
        "segments": list(segments),
        "num_searches": traj.num_searches,
        "num_obs_truncated": traj.num_obs_truncated,
        "prompt_ids": list(traj.prompt_ids),
        "response_ids": list(traj.response_ids),
        "loss_mask": list(traj.loss_mask),
        "prompt_text": tokenizer.decode(traj.prompt_ids, skip_special_tokens=False),
        "response_text": traj.response_text,
    }


async def _chains(unanswered: list[tuple[dict, str]], results: dict, search: SearchFn, tokenizer: Any,
                  cfg: TrainConfig, seed: int, per_row: int, kb_phrasing: bool = True) -> list[dict | None]:
    """Two-search demonstrations for (row, first query) pairs whose first search retrieved no
    gold answer: the first chain candidate that finds a passage titled with its name and
    grounds the answer (`_one_demo`); None where none does."""
    protocol = protocol_for(cfg.actor_rollout_ref.rollout, tokenizer)
    cands = [chain_candidates(str(row["question"]), visible_observation(tokenizer, results[first], cfg.data.max_obs_length, protocol),
                              support_titles(row), per_row) for row, first in unanswered]
    wanted = [c for cs in cands for c in cs if c not in results]
    results.update(await fetch_results(search, list(dict.fromkeys(wanted)), cfg.retriever.topk))
    out: list[dict | None] = []
    for (row, first), cs in zip(unanswered, cands):
        demo = None
        for c in cs:
            if not any(contains(observation.split_passage(d)[0], c) for d in results.get(c) or []):  # found what it looked up
                continue
            try:
                demo = await _one_demo(row, Plan([first, c], [c, None], chain=True), results, tokenizer, cfg, seed,
                                       kb_phrasing)
                break
            except Drop:
                continue
        out.append(demo)
    return out


def plain_row(row: dict, specials: Sequence[str]) -> dict:
    """`row` with its question and gold answers as plain text (`protocol.neutralize_tags`): the
    queries come from the question and the answer turn from a gold answer, both written into the
    model's turns, where `<|im_end|>` would be encoded as the token that ends the turn. A gold
    answer is then found in an observation neutralised the same way."""
    return {**row, "question": neutralize_tags(str(row["question"]), specials),
            "golden_answers": [neutralize_tags(str(g), specials) for g in row["golden_answers"]]}


async def build_demos(rows: Sequence[dict], search: SearchFn, tokenizer: Any, cfg: TrainConfig,
                      max_searches: int, seed: int = 0, progress: Callable[[int], None] | None = None,
                      chunk: int = 256, chains: int = 4, kb_phrasing: bool = True) -> BuildResult:
    """Demonstrations for QA `rows` (dicts with id, question, golden_answers, ...).

    `search`: async (queries, topk) -> results per query (RetrieverClient.search).
    `chains`: second searches tried per question whose own search retrieves no gold answer
    (0: none; needs max_searches >= 2).
    `kb_phrasing`: the knowledge base's wording (`plan.write_segments`); False: plain Search-R1 turns.
    """
    if max_searches > cfg.max_turns:
        raise ValueError(f"max_searches={max_searches} exceeds max_turns={cfg.max_turns}: the rollout "
                         f"executes at most max_turns searches")
    template = cfg.actor_rollout_ref.rollout.template
    protocol = protocol_for(cfg.actor_rollout_ref.rollout, tokenizer)
    out = BuildResult(rows=[])

    def drop(row: dict, reason: str) -> None:
        out.dropped[reason] += 1
        out.dropped_ids.append((str(row["id"]), reason))

    specials = special_texts(tokenizer)
    for start in range(0, len(rows), chunk):
        part = [plain_row(row, specials) for row in rows[start : start + chunk]]
        plans: list[Plan | None] = []
        for row in part:
            try:
                plan = plan_queries(row, max_searches)
                if len(protocol.prompt_ids(tokenizer, str(row["question"]), template)) > cfg.data.max_prompt_length:
                    raise Drop("prompt_too_long")
                plans.append(plan)
            except Drop as e:
                drop(row, e.reason)
                plans.append(None)
        wanted = list(dict.fromkeys(q for p in plans if p is not None for q in p.queries))
        results = await fetch_results(search, wanted, cfg.retriever.topk)
        unanswered = []
        for row, plan in zip(part, plans):
            if plan is None:
                continue
            try:
                out.rows.append(await _one_demo(row, plan, results, tokenizer, cfg, seed, kb_phrasing))
            except Drop as e:
                single = len(plan.queries) == 1 and results.get(plan.queries[0]) is not None
                if e.reason == "answer_not_retrieved" and single and chains > 0 and max_searches >= 2:
                    unanswered.append((row, plan.queries[0]))
                else:
                    drop(row, e.reason)
        if unanswered:
            chained = await _chains(unanswered, results, search, tokenizer, cfg, seed, chains, kb_phrasing)
            for (row, _), demo in zip(unanswered, chained):
                if demo is None:
                    drop(row, "no_chain")
                else:
                    out.rows.append(demo)
        if progress is not None:
            progress(len(part))
    return out


# ----------------------------------------------------------------------------- files
def report_lines(res: BuildResult, seconds: float) -> list[str]:
    n, kept = res.candidates, len(res.rows)
    lines = [f"[demos] {n} candidates: kept {kept} ({100 * kept / max(1, n):.1f}%), "
             f"dropped {n - kept} in {seconds:.1f}s"]
    for reason, c in res.dropped.most_common():
        lines.append(f"[demos]   dropped {c:6d}  {reason}: {DROP_REASONS[reason]}")
    if kept:
        kinds = Counter(r["kind"] or "-" for r in res.rows)
        searches = Counter(r["num_searches"] for r in res.rows)
        lens = [len(r["response_ids"]) for r in res.rows]
        sampled = sum(sum(r["loss_mask"]) for r in res.rows)
        lines.append("[demos] kept by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
                     + "; by searches: " + ", ".join(f"{k}: {v}" for k, v in sorted(searches.items())))
        lines.append(f"[demos] response tokens: mean {sum(lens) / kept:.0f}, max {max(lens)}; "
                     f"{100 * sampled / sum(lens):.0f}% are model tokens (loss mask 1)")
        cut = sum(r["num_obs_truncated"] > 0 for r in res.rows)
        if cut:
            lines.append(f"[demos] {cut} demonstrations have observations cut to data.max_obs_length tokens "
                         "(as the rollout cuts them: the passages are cut, the tags kept)")
    return lines


# ----------------------------------------------------------------------------- the QA rows tried
def select_rows(rows: list, limit: int | None, seed: int, rest: bool = False) -> list:
    """A seeded random sample of `limit` rows, in file order (all rows without a limit).

    `rest`: the rows outside that sample instead, i.e. the questions a build with the same
    `limit` and `seed` did not try (none without a limit)."""
    if limit is None or limit >= len(rows):
        return [] if rest else rows
    keep = set(random.Random(seed).sample(range(len(rows)), limit))
    return [r for i, r in enumerate(rows) if (i in keep) != rest]


def kind_caps(kinds: Sequence[str]) -> dict[str, int | None]:
    """`["single", "bridge:40"]` -> `{"single": None, "bridge": 40}`: each kind to keep, with the
    most rows of it to keep (None: all). ValueError names a bad entry."""
    caps: dict[str, int | None] = {}
    for spec in kinds:
        kind, sep, n = spec.partition(":")
        if not kind or (sep and not (n.isascii() and n.isdigit())) or kind in caps:
            raise ValueError(f"bad kind {spec!r}: give KIND or KIND:N (N >= 0), each kind once")
        caps[kind] = int(n) if sep else None
    return caps


def of_kinds(rows: list[dict], kinds: Sequence[str] | None, seed: int = 0) -> tuple[list[dict], int]:
    """The rows whose kind is one of `kinds` (all rows for None), and how many were left out.
    `KIND:N` keeps a seeded random N of that kind's rows (all of them when it has fewer), so a
    kind the demonstrations should show rarely can be given in a known number. Rows stay in
    file order. A row that names no kind is left out whenever kinds are given."""
    if kinds is None:
        return rows, 0
    caps = kind_caps(kinds)
    by_kind: dict[str, list[int]] = {k: [] for k in caps}
    for i, r in enumerate(rows):
        by_kind.get(row_kind(r), []).append(i)
    picked = set().union(*(select_rows(idx, caps[k], seed) for k, idx in by_kind.items()))
    keep = [rows[i] for i in sorted(picked)]
    return keep, len(rows) - len(keep)
