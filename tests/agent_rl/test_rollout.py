"""Rollout manager: pure-logic tests with a scripted engine and fake retriever, then
integration tests with the real vLLM engine and a real retriever server.

The untrained 135M model rarely writes tags by itself, so the real-engine tests steer it with
prompts: a few-shot prefix makes it search; a prompt ending in `<answer>` makes it close the
answer. Every assertion below can fail on a real bug (ids, masks, logprobs, limits)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import pytest

from agent_rl.rollout import observation as O
from agent_rl.rollout import protocol as PR
from agent_rl.rollout.protocol import SEARCH_R1 as P
from agent_rl.rollout.engine import Sampling
from agent_rl.rollout.manager import RolloutManager
from agent_rl.rollout.observation import format_passages
from agent_rl.rollout.retrieval_client import RetrieverAuthError, RetrieverClient, RetrieverRequestError
from rollout_fakes import FakeRetriever, Q, ScriptedEngine, make_cfg


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def run(coro):
    return asyncio.run(coro)


def sampled_spans(traj):
    """(start, end) of each maximal run of loss_mask == 1."""
    spans, start = [], None
    for i, m in enumerate(traj.loss_mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


# ----------------------------------------------------------------------------- logic (fakes)
def test_ids_masks_logprobs_are_exactly_engine_output_plus_observations(tok):
    script = ["<think> look up </think> <sea|rch> Krad|holt </sea|rch>", "<search>second</search>", "So <ans|wer> Kradholt </answer>"]
    eng, ret = ScriptedEngine(tok, script), FakeRetriever()
    cfg = make_cfg(max_turns=3)
    traj = run(RolloutManager(eng, ret, cfg, tokenizer=tok).run_trajectory([1, 2, 3], Sampling(), 3))
    obs = [O.encode_observation(tok, format_passages(FakeRetriever.docs(q, 3)), 256)[0] for q in ["Kradholt", "second"]]
    r = eng.results
    assert ret.queries == ["Kradholt", "second"]
    # 1. token-in-token-out: response = turn ids + observation ids, nothing re-encoded
    assert traj.response_ids == r[0].token_ids + obs[0] + r[1].token_ids + obs[1] + r[2].token_ids
    # ... and the engine was always called with prompt + everything so far
    assert eng.calls[1][0] == [1, 2, 3] + r[0].token_ids + obs[0]
    assert eng.calls[2][0] == [1, 2, 3] + traj.response_ids[: -len(r[2].token_ids)]
    # the scripted ids are non-canonical: decode -> encode would change them
    assert tok.encode(tok.decode(r[0].token_ids), add_special_tokens=False) != r[0].token_ids
    # 2. mask 1 exactly on sampled tokens, 0 on observations; logprobs where sampled, 0 elsewhere
    assert traj.loss_mask == [1] * len(r[0].token_ids) + [0] * len(obs[0]) + [1] * len(r[1].token_ids) + [0] * len(obs[1]) + [1] * len(r[2].token_ids)
    assert traj.rollout_logprobs == r[0].logprobs + [0.0] * len(obs[0]) + r[1].logprobs + [0.0] * len(obs[1]) + r[2].logprobs
    assert (traj.finish_reason, traj.num_turns, traj.num_searches, traj.num_invalid) == ("answer", 3, 2, 0)
    assert '<information>Doc 1(Title: "Kradholt 0") Text about Kradholt' in traj.response_text
    assert traj.response_text.endswith("<answer> Kradholt </answer>")


def test_invalid_action_gets_search_r1_feedback_with_mask_zero(tok):
    eng = ScriptedEngine(tok, ["I am not sure.", "<answer> 42 </answer>"])
    traj = run(RolloutManager(eng, FakeRetriever(), make_cfg(), tokenizer=tok).run_trajectory([5], Sampling(), 3))
    fb = PR.encode_text(tok, PR.FEEDBACK_INVALID)
    r = eng.results
    assert traj.response_ids == r[0].token_ids + fb + r[1].token_ids
    assert traj.loss_mask == [1] * len(r[0].token_ids) + [0] * len(fb) + [1] * len(r[1].token_ids)
    assert (traj.num_invalid, traj.num_searches, traj.finish_reason) == (1, 0, "answer")


def test_max_turns_then_one_last_turn_without_search(tok):
    eng, ret = ScriptedEngine(tok, ["<search> q </search>"] * 10), FakeRetriever()
    traj = run(RolloutManager(eng, ret, make_cfg(max_turns=2), tokenizer=tok).run_trajectory([5], Sampling(), 2))
    assert len(ret.queries) == 2 and traj.num_searches == 2  # the last turn's search is not run
    assert traj.num_turns == 3 and traj.finish_reason == "max_turns"
    assert traj.response_ids[-len(eng.results[-1].token_ids):] == eng.results[-1].token_ids  # ends with sampled ids


def test_total_length_limit_caps_turns_and_observations(tok):
    long_turn = "<search> " + " ".join(["word"] * 40) + " </search>"
    n1 = len(tok.encode(long_turn, add_special_tokens=False))
    assert 40 < n1 < 64
    eng = ScriptedEngine(tok, [long_turn, long_turn, long_turn])
    cfg = make_cfg(max_turns=5, max_response_length=100, max_obs_length=30, max_tokens_per_turn=64)
    traj = run(RolloutManager(eng, FakeRetriever(), cfg, tokenizer=tok).run_trajectory([5], Sampling(max_tokens=64), 5))
    # turn 1: n1 sampled; observation cut to 30 tokens; turn 2 capped by what is left
    assert [s.max_tokens for _, s in eng.calls] == [64, 100 - n1 - 30]
    assert len(traj.response_ids) == 100 and traj.finish_reason == "length"
    assert traj.num_obs_truncated == 1
    assert traj.loss_mask == [1] * n1 + [0] * 30 + [1] * (100 - n1 - 30)


def test_retriever_failure_becomes_error_observation_and_trajectory_continues(tok):
    eng = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"])
    traj = run(RolloutManager(eng, FakeRetriever(fail=True), make_cfg(), tokenizer=tok).run_trajectory([5], Sampling(), 3))
    err = O.encode_observation(tok, O.SEARCH_ERROR_TEXT, 256)[0]
    assert traj.response_ids == eng.results[0].token_ids + err + eng.results[1].token_ids
    assert (traj.num_tool_failures, traj.num_searches, traj.finish_reason) == (1, 1, "answer")


class RefusingRetriever:
    def __init__(self, error):
        self.error = error

    async def search(self, queries, topk):
        raise self.error


def test_the_policys_own_bad_query_is_an_observation_not_an_outage(tok):
    """Issue 33: a query the server refuses as such (422: longer than its max_query_chars) was
    counted as a retriever failure, so the trajectory was left out of the update as an outage."""
    eng = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"])
    refused = RetrieverRequestError(422, "queries[0] has 3000 characters, more than max_query_chars=2048")
    traj = run(RolloutManager(eng, RefusingRetriever(refused), make_cfg(), tokenizer=tok).run_trajectory([5], Sampling(), 3))
    obs = O.encode_observation(tok, O.rejected_query_text(refused.detail), 256)[0]
    assert traj.response_ids == eng.results[0].token_ids + obs + eng.results[1].token_ids
    assert (traj.num_tool_failures, traj.num_rejected_queries, traj.finish_reason) == (0, 1, "answer")
    assert "max_query_chars=2048" in tok.decode(obs)
    other = RetrieverRequestError(404, "Not Found")  # not the query's fault: a failed search, as before
    eng = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"])
    traj = run(RolloutManager(eng, RefusingRetriever(other), make_cfg(), tokenizer=tok).run_trajectory([5], Sampling(), 3))
    assert (traj.num_tool_failures, traj.num_rejected_queries) == (1, 0)


def test_a_refused_api_key_stops_the_rollout(tok):
    """A 401 is no outage to wait out and no observation: every search would fail the same way."""
    eng = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"])
    mgr = RolloutManager(eng, RefusingRetriever(RetrieverAuthError(401, "missing or wrong X-API-Key header",
                                                                   "http://h:1")), make_cfg(), tokenizer=tok)
    with pytest.raises(RetrieverAuthError, match="refused the API key"):
        run(mgr.rollout([Q("q?")], n=2))


def test_hanging_retriever_is_bounded_by_tool_timeout(tok):
    eng = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"])
    cfg = make_cfg(tool_timeout_s=0.3)
    t0 = time.perf_counter()
    traj = run(RolloutManager(eng, FakeRetriever(hang=True), cfg, tokenizer=tok).run_trajectory([5], Sampling(), 3))
    assert time.perf_counter() - t0 < 5
    assert traj.num_tool_failures == 1 and traj.finish_reason == "answer"


def test_groups_concurrency_limits_and_metrics(tok):
    policy = lambda ctx: "<answer> a </answer>" if "<information>Doc" in ctx else "<search> q </search>"  # noqa: E731
    eng, ret = ScriptedEngine(tok, policy, delay=0.01), FakeRetriever(delay=0.02)
    cfg = make_cfg(n=3, max_concurrent_trajectories=4, max_concurrent_tool_calls=2)
    trajs, m = run(RolloutManager(eng, ret, cfg, tokenizer=tok).rollout([Q("a"), Q("b"), Q("c"), Q("d")]))
    assert [t.group_id for t in trajs] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [t.question for t in trajs[::3]] == ["a", "b", "c", "d"]
    assert eng.max_in_flight <= 4 and ret.max_in_flight <= 2
    assert eng.max_in_flight >= 2 and ret.max_in_flight == 2  # trajectories and tool calls really overlap
    assert m["rollout/num_trajectories"] == 12 and m["rollout/finish_answer"] == 1.0
    assert m["rollout/searches_mean"] == 1.0 and m["rollout/turns_mean"] == 2.0 and m["rollout/valid_action_rate"] == 1.0
    assert m["rollout/gen_tokens"] == sum(sum(t.loss_mask) for t in trajs)
    for k in ["rollout/turns_max", "rollout/tool_failures", "rollout/obs_truncations", "rollout/response_length_mean",
              "rollout/response_length_max", "rollout/finish_max_turns", "rollout/finish_length"]:
        assert k in m


def test_direct_and_rag_modes(tok):
    eng, ret = ScriptedEngine(tok, ["<search> q </search>", "<answer> a </answer>"]), FakeRetriever()
    mgr = RolloutManager(eng, ret, make_cfg(), tokenizer=tok)
    (t,), _ = run(mgr.rollout([Q("who is x")], n=1, mode="direct"))
    assert t.num_turns == 1 and ret.queries == [] and t.finish_reason == "max_turns"  # no search in direct mode
    assert eng.calls[0][0] == P.prompt_ids(tok, "who is x", "base", "direct")
    (t,), _ = run(mgr.rollout([Q("who is y")], n=1, mode="rag"))
    assert ret.queries == ["who is y"] and t.finish_reason == "answer"
    docs = format_passages(FakeRetriever.docs("who is y", 3))
    assert eng.calls[1][0] == P.prompt_ids(tok, "who is y", "base", "rag", docs)
    with pytest.raises(ValueError, match="mode"):
        run(mgr.rollout([Q("q")], mode="cot"))


def test_prebuilt_prompt_ids_are_used_as_given(tok):
    @dataclass
    class Pre(Q):
        prompt_ids: list = field(default_factory=lambda: [7, 8, 9])

    eng = ScriptedEngine(tok, ["<answer> a </answer>"])
    (t,), _ = run(RolloutManager(eng, FakeRetriever(), make_cfg(), tokenizer=tok).rollout([Pre("q")], n=1))
    assert eng.calls[0][0] == [7, 8, 9] and t.prompt_ids == [7, 8, 9]


# ----------------------------------------------------------------------------- real engine
class Recording:
    """Wraps an engine / retriever and keeps what it returned."""

    def __init__(self, inner):
        self.inner, self.results, self.search_results = inner, [], []
        self.max_model_len = getattr(inner, "max_model_len", 0)

    async def generate(self, prompt_ids, sampling):
        out = await self.inner.generate(prompt_ids, sampling)
        self.results.append(out)
        return out

    async def search(self, queries, topk):
        out = await self.inner.search(queries, topk)
        self.search_results.append(out)
        return out


@pytest.fixture(scope="module")
def kb_questions(tiny_kb):
    import pandas as pd

    df = pd.read_parquet(tiny_kb / "test.parquet")
    single = df[df["kind"] == "single"]
    return [Q(r.question, list(r.golden_answers), r.data_source) for r in single.head(3).itertuples()]


@pytest.fixture(scope="module")
def client(aio, retriever_url):
    c = RetrieverClient(retriever_url, timeout=10.0, max_retries=1)
    yield c
    aio(c.aclose())


@pytest.mark.slow
def test_real_engine_search_trajectory_ids_masks_and_logprobs(aio, engine, tokenizer, hf_model, hf_logprobs, client, kb_questions,
                                                               few_shot_prompt):
    """Tests 1-4 on the real engine + real retriever: ids = engine ids + observation ids, mask,
    logprobs == an fp32 transformers pass over the whole interleaved sequence, max_turns."""
    eng, ret = Recording(engine), Recording(client)
    mgr = RolloutManager(eng, ret, make_cfg(max_turns=1, max_tokens_per_turn=48), tokenizer=tokenizer)
    prompt = tokenizer.encode(few_shot_prompt(kb_questions[0].question))
    traj = aio(mgr.run_trajectory(prompt, Sampling(temperature=0.0, max_tokens=48), max_turns=1))

    assert traj.num_searches == 1 and len(ret.search_results) == 1, eng.results[0].text
    obs = O.encode_observation(tokenizer, format_passages(ret.search_results[0][0]), 256)[0]
    r = eng.results
    assert len(r) == 2 and traj.num_turns == 2
    assert traj.response_ids == r[0].token_ids + obs + r[1].token_ids
    assert traj.loss_mask == [1] * len(r[0].token_ids) + [0] * len(obs) + [1] * len(r[1].token_ids)
    passage = ret.search_results[0][0][0].document.contents.split("\n", 1)[1][:40]
    assert passage in tokenizer.decode(obs)  # real retrieved text reached the context
    assert traj.finish_reason in ("max_turns", "answer")
    # logprobs of the sampled tokens, in the context of the observation, match transformers
    ref = hf_logprobs(hf_model, prompt, traj.response_ids)
    d = [abs(a - b) for a, b, m in zip(traj.rollout_logprobs, ref, traj.loss_mask) if m]
    print(f"\ntrajectory logprobs, fp32 engine vs transformers ({len(d)} tokens): mean |d|={statistics.mean(d):.2e} max={max(d):.2e}")
    assert max(d) < 2e-4
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if not m)


def direct_few_shot_prompt(question: str, examples) -> str:
    """Answer-only examples: the model writes `<answer> ... </answer>` itself."""
    return "".join(f"Question: {q}\n<answer> {a} </answer>\n\n" for q, _, _, a in examples) + f"Question: {question}\n"


@pytest.mark.slow
def test_real_engine_stops_at_answer_and_respects_length(aio, engine, tokenizer, client, kb_questions, few_shot_examples):
    eng = Recording(engine)
    mgr = RolloutManager(eng, client, make_cfg(max_turns=2), tokenizer=tokenizer)
    ans = aio(mgr.run_trajectory(tokenizer.encode(direct_few_shot_prompt(kb_questions[0].question, few_shot_examples)),
                                 Sampling(temperature=0.0, max_tokens=32), 2))
    assert ans.finish_reason == "answer" and ans.num_turns == 1, ans.response_text
    assert eng.results[0].stop_reason == "</answer>" and eng.results[0].text.endswith("</answer>")
    assert ans.response_ids == eng.results[0].token_ids and sum(ans.loss_mask) == len(ans.response_ids)
    # the untrained chat model with sampling: whatever it does, the 40-token budget holds
    cfg = make_cfg(max_turns=2, max_response_length=40, n=4, chat_template=True, max_tokens_per_turn=32)
    mgr = RolloutManager(engine, client, cfg)  # default: the engine's own tokenizer
    q = kb_questions[0].question
    assert P.prompt_ids(mgr.tokenizer, q, "chat") == P.prompt_ids(tokenizer, q, "chat")
    assert PR.encode_text(mgr.tokenizer, PR.FEEDBACK_INVALID) == PR.encode_text(tokenizer, PR.FEEDBACK_INVALID)
    trajs, m = aio(mgr.rollout(kb_questions[:2]))
    assert [t.prompt_ids for t in trajs[::4]] == [P.prompt_ids(tokenizer, p.question, "chat") for p in kb_questions[:2]]
    assert len(trajs) == 8 and all(len(t.response_ids) <= 40 for t in trajs)
    assert all(len(t.response_ids) == len(t.loss_mask) == len(t.rollout_logprobs) for t in trajs)
    assert all(t.num_turns <= 3 for t in trajs) and m["rollout/response_length_max"] <= 40
    print("\nchat model rollout metrics:", {k: round(v, 3) for k, v in m.items()})


@pytest.mark.slow
def test_retriever_down_gives_error_observation_and_does_not_hang(aio, engine, tokenizer, kb_questions, few_shot_prompt):
    from retriever_server.launch import free_port

    dead = RetrieverClient(f"http://127.0.0.1:{free_port()}", timeout=2.0, connect_timeout=0.5, max_retries=2, backoff=0.05)
    try:
        mgr = RolloutManager(engine, dead, make_cfg(max_turns=1, max_tokens_per_turn=48), tokenizer=tokenizer)
        prompt = tokenizer.encode(few_shot_prompt(kb_questions[0].question))
        t0 = time.perf_counter()
        traj = aio(mgr.run_trajectory(prompt, Sampling(temperature=0.0, max_tokens=48), 1), timeout=60)
        elapsed = time.perf_counter() - t0
    finally:
        aio(dead.aclose())
    assert traj.num_searches == 1 and traj.num_tool_failures == 1
    assert O.SEARCH_ERROR_TEXT in traj.response_text
    assert traj.num_turns == 2  # it continued after the failure
    assert elapsed < 30
