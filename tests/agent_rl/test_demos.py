"""Cold-start demonstrations: query plans, grounding, wording, and the one tokenization path.

Integration tests build demonstrations from the tiny knowledge base against a real retriever
server (BM25, own process) with the real tokenizer, then check them against (a) an
independent assembly from `agent_rl.rollout.protocol` and the server's results, and (b) the rollout
manager driven by a scripted engine that replays the stored model turns, with the real
HTTP retriever client.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace

import hypothesis
import pytest
from hypothesis import strategies as st

from agent_rl.coldstart import cli
from agent_rl.coldstart import demo_file as DF
from agent_rl.coldstart import demos as D
from agent_rl.coldstart import plan as PL
from agent_rl.config import TrainConfig
from agent_rl.rollout import observation as O
from agent_rl.rollout import protocol as PR
from agent_rl.rollout.protocol import SEARCH_R1 as P
from agent_rl.rollout import reward as R


def _cfg(topk: int = 1, **data) -> TrainConfig:
    """RL settings of the tests: by default one passage per search, never truncated."""
    cfg = TrainConfig()
    cfg.max_turns = 2
    cfg.retriever.topk = topk
    cfg.data.max_obs_length = 256
    cfg.data.max_response_length = 640
    cfg.actor_rollout_ref.rollout.max_tokens_per_turn = 64
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


# observations of 3 passages cut to 96 tokens
TRUNCATING = dict(topk=3, max_obs_length=96, max_response_length=512)


# ----------------------------------------------------------------------------- pure logic
KB_BRIDGE = {
    "id": "b", "question": "Where was the author of The Zocond Bridge born?", "golden_answers": ["Grulcrest"],
    "kind": "bridge", "hop_queries": ["author of The Zocond Bridge", "Zimette Heirard birthplace"],
    "hop_answers": ["Zimette Heirard", "Grulcrest"],
}


def test_plan_uses_kb_hops_decompositions_or_the_question():
    p = PL.plan_queries(KB_BRIDGE, max_searches=2)
    assert p.queries == KB_BRIDGE["hop_queries"] and p.hop_answers == ["Zimette Heirard", "Grulcrest"]
    assert not p.comparison
    assert PL.plan_queries({**KB_BRIDGE, "kind": "comparison"}, 2).comparison
    musique = {"id": "m", "question": "When was the publisher of Crux launched?", "golden_answers": ["1998"],
               "question_decomposition": json.dumps([{"question": "Crux >> publisher", "answer": "Taylor & Francis"},
                                                     {"question": "When was #1 launched?", "answer": "1998"}])}
    p = PL.plan_queries(musique, 3)
    assert p.queries == ["Crux >> publisher", "When was Taylor & Francis launched?"]
    assert p.hop_answers == ["Taylor & Francis", "1998"]
    plain = {"id": "q", "question": " who wrote x ", "golden_answers": ["y"]}
    assert PL.plan_queries(plain, 1).queries == ["who wrote x"] and PL.plan_queries(plain, 1).hop_answers == [None]
    with pytest.raises(PL.Drop) as e:
        PL.plan_queries(KB_BRIDGE, max_searches=1)
    assert e.value.reason == "too_many_searches"
    with pytest.raises(PL.Drop) as e:
        PL.plan_queries({**KB_BRIDGE, "hop_queries": ["a", " "]}, 2)
    assert e.value.reason == "no_query"


def test_contains_matches_whole_normalised_words():
    assert PL.contains("Doc 1(Title: \"X\") born in 1850 in Grulcrest.", "1850")
    assert PL.contains("founded by The Zentrix Labs", "zentrix labs")
    assert not PL.contains("population of about 18503", "1850")
    assert not PL.contains("Annette Holt was", "Ann")
    assert PL.contains("Thyrald Clouvwick (1940–1999) was", "1940")
    assert not PL.contains("anything", "the")  # normalises to nothing: never a match
    assert PL.grounded_answer(["Zumwyn Baxine Grestner", "Zumwyn Grestner"], ["x", "Zumwyn Grestner was"]) == "Zumwyn Grestner"
    assert PL.grounded_answer(["a b"], ["nothing here"]) is None


def test_segments_close_one_action_each_vary_and_form_a_valid_response():
    plan = PL.plan_queries(KB_BRIDGE, 2)
    firsts, finals = set(), set()
    for seed in range(60):
        segs = PL.write_segments(plan, "Grulcrest", random.Random(seed))
        assert [(a.kind if a.kind == "answer" else "search", a.query or a.content) for a in map(P.parse, segs)] == [
            ("search", KB_BRIDGE["hop_queries"][0]), ("search", KB_BRIDGE["hop_queries"][1]), ("answer", "Grulcrest")]
        firsts.add(segs[0])
        finals.add(segs[-1])
        # as the rollout assembles it (observations between the turns) it is well formed
        text = "".join(s + O.format_observation("Doc 1(Title: x) y") for s in segs[:-1]) + segs[-1]
        assert R.format_error(text) is None
        assert "Zimette Heirard" in segs[1]  # the second turn states the intermediate answer
    assert len(firsts) >= 4 and len(finals) >= 4


def test_the_first_think_says_how_many_searches_and_a_chain_does_not():
    single = PL.Plan(["Grulcrest country"], ["Tadyvia"])
    chain = PL.Plan(["Who founded X?", "Ann Lee"], ["Ann Lee", None], chain=True)
    for seed in range(20):
        rng = lambda: random.Random(seed)  # noqa: E731
        assert PL.write_segments(PL.plan_queries(KB_BRIDGE, 2), "Grulcrest", rng())[0].endswith(
            "This needs 2 searches. </think>\n<search> author of The Zocond Bridge </search>")
        assert "Grulcrest country. This needs 1 search. </think>" in PL.write_segments(single, "Tadyvia", rng())[0]
        assert "This needs" not in PL.write_segments(chain, "Boston", rng())[0]
        # one search or two: the same opening up to the count, so the count is decided after the query
        one = PL.write_segments(PL.Plan(["Ann Lee birth year"], ["1901"]), "1901", rng())[0]
        many = PL.write_segments(PL.Plan(["Ann Lee birth year", "Bo Li birth year"], ["1901", "1899"],
                                         comparison=True), "Bo Li", rng())[0]
        assert one.replace("1 search", "2 searches") == many


def test_after_each_observation_the_count_is_said_again_right_before_searching_on_or_answering():
    """"That was search i of n", where n is the opening's count, is followed by the next search
    when i < n and by the answer when i == n, for every kind and phrasing; so what the model
    does after an observation is a copy of the count it opened with. A chain (no count in its
    opening) says none."""
    plans = {"single": (PL.Plan(["Grulcrest country"], ["Tadyvia"]), "Tadyvia"),
             "bridge": (PL.plan_queries(KB_BRIDGE, 2), "Grulcrest"),
             "comparison": (PL.Plan(["Ann Lee birth year", "Bo Li birth year"], ["1901", "1899"], comparison=True), "Bo Li"),
             "unknown hop": (PL.Plan(["q one", "q two"], [None, None]), "Zed")}
    for kind, (plan, answer) in plans.items():
        n = len(plan.queries)
        for seed in range(30):
            segs = PL.write_segments(plan, answer, random.Random(seed))
            assert f"This needs {n} search" in segs[0], kind
            for i, seg in enumerate(segs[1:], start=1):
                think, action = seg.split(" </think>\n")
                head, after = think.split(f"That was search {i} of {n}.")  # exactly once, in every turn
                assert "search" not in head.replace("search results", "")  # nothing about searching before it
                if i < n:
                    assert action == f"<search> {plan.queries[i]} </search>" and plan.queries[i] in after, kind
                else:
                    assert action == f"<answer> {answer} </answer>" and answer in after, kind
    chain = PL.Plan(["Who founded X?", "Ann Lee"], ["Ann Lee", None], chain=True)
    assert not any("That was search" in s for s in PL.write_segments(chain, "Boston", random.Random(0)))


def test_where_the_data_names_what_the_question_asks_for_the_opening_says_it_before_the_query():
    """The KB's relation ("author>birthplace": the question asks for a birthplace) opens the
    first think, so the count after the query is whether the query names it: "Ann Lee
    birthplace" does (1 search), "author of The Zocond Bridge" does not (2). Comparisons, search
    chains and rows without a relation (NQ, HotpotQA) open as before."""
    bridge = PL.plan_queries({**KB_BRIDGE, "relation": "author>birthplace"}, 2)
    single = PL.plan_queries({"question": "Where was Ann Lee born?", "kind": "single", "relation": "birthplace",
                              "hop_queries": ["Ann Lee birthplace"], "hop_answers": ["Grulcrest"]}, 2)
    founded = PL.plan_queries({"question": "In what year was Jepo Institute founded?", "kind": "single",
                               "relation": "founding_year", "hop_queries": ["Jepo Institute founding year"],
                               "hop_answers": ["1851"]}, 2)
    compare = PL.plan_queries({"question": "Who was born first, A or B?", "kind": "comparison", "relation": "born_first",
                               "hop_queries": ["A birth year", "B birth year"], "hop_answers": ["1901", "1899"]}, 2)
    assert (bridge.asks, single.asks, founded.asks, compare.asks) == ("birthplace", "birthplace", "founding year", None)
    assert PL.plan_queries(KB_BRIDGE, 2).asks is None  # no relation in the row
    for seed in range(20):
        first = PL.write_segments(bridge, "Grulcrest", random.Random(seed))[0]
        assert first.startswith("<think> The question asks for the birthplace. ") and "This needs 2 searches." in first
        first = PL.write_segments(single, "Grulcrest", random.Random(seed))[0]
        assert first.startswith("<think> The question asks for the birthplace. ") and "This needs 1 search." in first
        assert "founding year" in PL.write_segments(founded, "1851", random.Random(seed))[0].split(".")[0]
        assert "asks for" not in PL.write_segments(compare, "B", random.Random(seed))[0]
        assert "asks for" not in PL.write_segments(PL.plan_queries(KB_BRIDGE, 2), "Grulcrest", random.Random(seed))[0]


def test_a_comparison_of_years_pairs_each_year_with_its_entity_then_the_earlier_with_the_answer():
    plan = PL.Plan(["Coubei Foundation founding year", "Coubei Observatory founding year"], ["1885", "1878"],
                   comparison=True)
    thinks = {PL.write_segments(plan, "Coubei Observatory", random.Random(seed))[-1] for seed in range(30)}
    assert len(thinks) == 3
    for t in thinks:
        reasoning = t.split("</think>")[0]
        # each year stands before its entity, and the earlier year is said again before the answer
        assert "1885 for Coubei Foundation" in reasoning and reasoning.count("1878 for Coubei Observatory") == 2
        assert reasoning.rindex("1878") > reasoning.index("1885")
        assert t.endswith("<answer> Coubei Observatory </answer>")
    # not two numbers: the wording that names both facts
    words = PL.Plan(["Ann Lee nationality", "Bo Lee nationality"], ["Dutch", "Danish"], comparison=True)
    last = PL.write_segments(words, "Ann Lee", random.Random(0))[-1]
    assert "Dutch" in last and "Danish" in last and "earlier" not in last


KB_PHRASES = ("asks for", "This needs", "That was search")
"""The knowledge base's phrasing (`kb_phrasing`): what the question asks for, the count, which search it was."""
KB_ONLY = re.compile(r"The question asks for the [^.]*\. | This needs \d+ search(?:es)?\."
                     r"|That was search \d+ of \d+\. ")


def test_plain_wording_is_the_kb_wording_without_its_phrases():
    """kb_phrasing=False: the same turns (same queries, facts, answer, the same phrasings drawn)
    with the relation sentence, "This needs N searches" and "That was search i of n" left out."""
    plans = {"bridge": (PL.plan_queries({**KB_BRIDGE, "relation": "author>birthplace"}, 2), "Grulcrest"),
             "single": (PL.Plan(["Grulcrest country"], ["Tadyvia"], asks="country"), "Tadyvia"),
             "years": (PL.Plan(["Ann Lee birth year", "Bo Li birth year"], ["1901", "1899"], comparison=True), "Bo Li"),
             "words": (PL.Plan(["Ann Lee nationality", "Bo Lee nationality"], ["Dutch", "Danish"], comparison=True),
                       "Ann Lee"),
             "unknown hop": (PL.Plan(["q one", "q two"], [None, None]), "Zed"),
             "chain": (PL.Plan(["Who founded X?", "Ann Lee"], ["Ann Lee", None], chain=True), "Boston"),
             "question only": (PL.plan_queries({"question": "who wrote x", "golden_answers": ["y"]}, 2), "y")}
    for kind, (plan, answer) in plans.items():
        for seed in range(30):
            kb = PL.write_segments(plan, answer, random.Random(seed))
            plain = PL.write_segments(plan, answer, random.Random(seed), kb_phrasing=False)
            assert [KB_ONLY.sub("", s) for s in kb] == plain, kind
            assert not any(p in s for p in KB_PHRASES for s in plain), kind
            acts = [P.parse(s) for s in plain]
            assert [a.query for a in acts[:-1]] == plan.queries and acts[-1].content == answer, kind


# ----------------------------------------------------------------------------- real server
@pytest.fixture(scope="module")
def kb_rows(tiny_kb):
    from data_prep.qa import read_qa

    return read_qa(tiny_kb / "train.parquet").to_dict("records")


@pytest.fixture(scope="module")
def built(aio, kb_rows, retriever_url, tokenizer):
    """Demonstrations for every train question of the tiny KB (real retriever, real tokenizer)."""
    from agent_rl.rollout.retrieval_client import RetrieverClient

    async def run():
        async with RetrieverClient(retriever_url) as client:
            return await D.build_demos(kb_rows, client.search, tokenizer, _cfg(), max_searches=2, seed=0)

    return aio(run())


def test_demos_are_grounded_well_formed_and_use_the_hops(built, kb_rows):
    res = built
    assert res.candidates == len(kb_rows) and sum(res.dropped.values()) == len(res.dropped_ids)
    assert len(res.rows) >= 0.5 * len(kb_rows), res.dropped
    by_kind = {k: [r for r in res.rows if r["kind"] == k] for k in ("single", "bridge", "comparison")}
    assert all(by_kind.values()), {k: len(v) for k, v in by_kind.items()}
    rows_by_id = {r["id"]: r for r in kb_rows}
    for r in res.rows:
        text = r["response_text"]
        assert R.format_error(text) is None, text
        assert R.extract_answer(text) == r["answer"] and R.em(r["answer"], r["golden_answers"]) == 1.0
        assert R.retrieval_hit(text, [r["answer"]])  # grounded in what the model read
        src = rows_by_id[r["id"]]
        assert r["queries"] == src["hop_queries"] and r["num_searches"] == len(src["hop_queries"])
        assert text.count("<information>") == r["num_searches"]
    for r in by_kind["bridge"]:  # hop 2 searches with the intermediate answer read in hop 1
        hop1 = rows_by_id[r["id"]]["hop_answers"][0]
        assert hop1 in r["queries"][1] and hop1 in R.information_blocks(r["response_text"])[0]
    assert all(r["num_searches"] == 2 for r in by_kind["comparison"])


@pytest.mark.parametrize("settings", [{}, TRUNCATING], ids=["whole", "truncated"])
def test_token_ids_equal_an_assembly_from_the_rollout_functions(aio, settings, built, kb_rows, retriever_url, tokenizer):
    """Independent of the builder: prompt ids, encode_text of each model turn (mask 1) and
    encode_observation of the server's passages (mask 0), in order."""
    from agent_rl.rollout.observation import format_passages
    from agent_rl.rollout.retrieval_client import RetrieverClient, SyncRetrieverClient

    cfg = _cfg(**settings)
    rows = built.rows
    if settings:
        async def run():
            async with RetrieverClient(retriever_url) as client:
                return await D.build_demos(kb_rows[:40], client.search, tokenizer, cfg, max_searches=2)

        rows = aio(run()).rows
        assert rows and all(r["num_obs_truncated"] == r["num_searches"] for r in rows)
    with SyncRetrieverClient(retriever_url) as client:
        for r in rows[:40]:
            assert r["prompt_ids"] == P.prompt_ids(tokenizer, r["question"], "chat")
            ids, mask = [], []
            docs = client.search(r["queries"], cfg.retriever.topk)
            for k, seg in enumerate(r["segments"]):
                seg_ids = PR.encode_text(tokenizer, seg)
                ids += seg_ids
                mask += [1] * len(seg_ids)
                if k < len(docs):
                    obs, _ = O.encode_observation(tokenizer, format_passages(docs[k]), cfg.data.max_obs_length)
                    ids += obs
                    mask += [0] * len(obs)
            assert r["response_ids"] == ids and r["loss_mask"] == mask


def _spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The mask-1 runs of a response: the model's turns as the engine emitted them."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


class _ReplayEngine:
    """Scripted engine emitting stored ids (not re-encoded text) turn by turn."""

    def __init__(self, tokenizer, turns, max_model_len):
        self.tokenizer, self.turns, self.max_model_len = tokenizer, list(turns), max_model_len

    def get_tokenizer(self):
        return self.tokenizer

    async def generate(self, prompt_ids, sampling):
        from agent_rl.rollout.engine import GenerateResult

        ids = self.turns.pop(0)
        assert len(ids) <= sampling.max_tokens
        return GenerateResult(ids, [0.0] * len(ids), "stop", None, self.tokenizer.decode(ids))


def test_rollout_manager_replaying_the_turns_reproduces_the_demonstration(aio, built, retriever_url, tokenizer):
    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from agent_rl.training.data import Prompt

    cfg = _cfg()

    async def replay(rows):
        out = []
        async with RetrieverClient(retriever_url) as client:
            for r in rows:
                eng = _ReplayEngine(tokenizer, _spans(r["response_ids"], r["loss_mask"]),
                                    cfg.data.max_prompt_length + cfg.data.max_response_length)
                mgr = RolloutManager(eng, client, cfg, tokenizer=tokenizer)
                (t,), _ = await mgr.rollout([Prompt(r["id"], r["question"], r["golden_answers"])], n=1, greedy=True)
                out.append(t)
        return out

    rows = [r for r in built.rows if r["num_searches"] == 2][:15] + [r for r in built.rows if r["num_searches"] == 1][:5]
    for r, t in zip(rows, aio(replay(rows))):
        assert t.finish_reason == "answer" and t.num_searches == r["num_searches"]
        assert t.prompt_ids == r["prompt_ids"]
        assert t.response_ids == r["response_ids"]
        assert t.loss_mask == r["loss_mask"]
        assert t.response_text == r["response_text"]


def test_hermes_demonstrations_close_each_model_turn_with_the_end_of_turn_token(aio, kb_rows, retriever_url, tokenizer):
    """A chat-format model must end its turns itself where no stop string does (TRL's tool loop,
    a chat server): each model turn of a hermes demonstration ends in the template's
    `<|im_end|>`, trained (mask 1), and the frame after it does not repeat it; replayed through
    the rollout manager the demonstration is the same, and the reward reads the same answer."""
    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from agent_rl.training.data import Prompt

    cfg = _cfg()
    cfg.actor_rollout_ref.rollout.protocol = "hermes"
    cfg.actor_rollout_ref.rollout.max_tokens_per_turn = 128  # a tool call's JSON is longer than a tag
    hermes = PR.protocol_for(cfg.actor_rollout_ref.rollout, tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert hermes.turn_end_ids() == [end] and P.turn_end_ids() == []

    async def run():
        async with RetrieverClient(retriever_url) as client:
            res = await D.build_demos(kb_rows[:24], client.search, tokenizer, cfg, max_searches=2, seed=0)
            replayed = []
            for r in res.rows:
                eng = _ReplayEngine(tokenizer, _spans(r["response_ids"], r["loss_mask"]),
                                    cfg.data.max_prompt_length + cfg.data.max_response_length)
                mgr = RolloutManager(eng, client, cfg, tokenizer=tokenizer)
                (t,), _ = await mgr.rollout([Prompt(r["id"], r["question"], r["golden_answers"])], n=1, greedy=True)
                replayed.append(t)
            return res, replayed

    res, replayed = aio(run())
    rows = res.rows
    assert len(rows) >= 8, res.dropped
    for r, t in zip(rows, replayed):
        spans = _spans(r["response_ids"], r["loss_mask"])
        assert len(spans) == r["num_searches"] + 1
        assert all(s[-1] == end and end not in s[:-1] for s in spans), r["id"]
        ids = r["response_ids"]
        # one closes each model turn, one each tool message: the frame's own copy after a model
        # turn is not repeated
        assert ids.count(end) == len(spans) + r["num_searches"] and (ids[-1], r["loss_mask"][-1]) == (end, 1)
        assert (t.response_ids, t.loss_mask, t.finish_reason) == (ids, r["loss_mask"], "answer")
        assert R.extract_answer(t.reward_text) == r["answer"]


def test_ungrounded_candidates_are_dropped_and_counted(aio, built, kb_rows, retriever_url, tokenizer):
    from agent_rl.rollout.retrieval_client import RetrieverClient

    kept_ids = {r["id"] for r in built.rows}
    good = [r for r in kb_rows if r["id"] in kept_ids and r["kind"] == "bridge"][:3]
    single = [r for r in kb_rows if r["id"] in kept_ids and r["kind"] == "single"][:2]
    assert len(good) == 3 and len(single) == 2
    rows = [
        {**good[0], "id": "fake_gold", "golden_answers": ["Qwertyvillex"], "hop_answers": [good[0]["hop_answers"][0], "Qwertyvillex"]},
        {**good[1], "id": "fake_hop", "hop_answers": ["Nobody Atall", good[1]["hop_answers"][1]]},
        {**single[0], "id": "fake_answer_no_hops", "golden_answers": ["Qwertyvillex"], "hop_answers": []},
        {**good[2], "id": "three_hops", "hop_queries": good[2]["hop_queries"] + ["x"], "hop_answers": []},
        single[1],
    ]

    async def run():
        async with RetrieverClient(retriever_url) as client:
            return await D.build_demos(rows, client.search, tokenizer, _cfg(), max_searches=2, seed=0)

    res = aio(run())
    assert [r["id"] for r in res.rows] == [single[1]["id"]]
    # the single-search row also tried second searches (chains) before it was dropped
    assert dict(res.dropped) == {"hop_answer_not_retrieved": 2, "no_chain": 1, "too_many_searches": 1}
    assert set(res.dropped_ids) == {("fake_gold", "hop_answer_not_retrieved"), ("fake_hop", "hop_answer_not_retrieved"),
                                    ("fake_answer_no_hops", "no_chain"), ("three_hops", "too_many_searches")}


def test_search_chains_find_the_bridge_from_the_first_observation(aio, kb_rows, retriever_url, tokenizer):
    """KB bridge questions without their hops: the question's own search shows the bridge
    entity, not the answer; a chain searches that entity next and is kept only when the gold
    answer first appears in the second observation. Without chains they are all dropped."""
    from agent_rl.rollout.retrieval_client import RetrieverClient

    bridges = [{**r, "hop_queries": [], "hop_answers": []} for r in kb_rows if r["kind"] == "bridge"]

    async def run(chains: int):
        async with RetrieverClient(retriever_url) as client:
            return await D.build_demos(bridges, client.search, tokenizer, _cfg(), max_searches=2, chains=chains)

    direct, chained = aio(run(0)), aio(run(4))
    kept_direct = {r["id"] for r in direct.rows}
    assert direct.dropped["answer_not_retrieved"] == len(bridges) - len(kept_direct) > 0
    two = [r for r in chained.rows if r["num_searches"] == 2]
    assert len(two) >= 0.3 * (len(bridges) - len(kept_direct)), (len(two), chained.dropped)
    assert chained.dropped["no_chain"] == len(bridges) - len(chained.rows)
    by_id = {r["id"]: r for r in bridges}
    for r in two:
        first, second = R.information_blocks(r["response_text"])
        assert r["queries"][0] == by_id[r["id"]]["question"] and r["queries"][1] in first
        assert not any(PL.contains(first, g) for g in r["golden_answers"])
        assert PL.contains(second, r["answer"]) and R.format_error(r["response_text"]) is None
    # how often the chain found the data's own bridge entity (hop 1's answer)
    hop1 = {k["id"]: k["hop_answers"][0] for k in kb_rows if k["kind"] == "bridge"}
    hits = sum(r["queries"][1] == hop1[r["id"]] for r in two)
    print(f"\n[chains] {len(two)} two-search demonstrations from {len(bridges) - len(kept_direct)} unanswered "
          f"bridge questions; {hits} searched the data's bridge entity")


# ----------------------------------------------------------------------------- rows without hops
# Real NQ / HotpotQA rows: a question and gold answers, no hops, no relation, no kind.
PLAIN_ROWS = [
    {"id": "nq_1", "question": "who wrote he ain't heavy he's my brother lyrics",
     "golden_answers": ["Bobby Scott", "Bob Russell"]},
    {"id": "nq_2", "question": "how many seasons of the bastard executioner are there",
     "golden_answers": ["one", "one season"]},
    {"id": "hp_1", "question": "Were Scott Derrickson and Ed Wood of the same nationality?", "golden_answers": ["yes"]},
    {"id": "hp_2", "question": "What government position was held by the woman who portrayed Corliss Archer in the "
                               "film Kiss and Tell?", "golden_answers": ["Chief of Protocol"]},
]


def _answering_search(rows: list[dict]):
    """`search(queries, topk)` whose one passage for a row's question holds its first gold answer
    (and for any other query, a passage without it)."""
    gold = {str(r["question"]).strip(): str(r["golden_answers"][0]) for r in rows}

    async def search(queries, topk):
        return [[{"document": {"id": f"d{i}", "contents": f'"Passage {i}"\nThe record names {gold[q]} here.'
                               if q in gold else f'"Passage {i}"\nNothing of use.'}, "score": 1.0}]
                for i, q in enumerate(queries)]

    return search


def _check_demos_of_rows_without_hops(aio, tokenizer, rows: list[dict], kb_phrasing: bool) -> list[dict]:
    """Build demonstrations for `rows` and check each: the protocol parses every model turn as
    the search of the question or the answer, the answer is a gold answer, and the loss mask
    is 1 on exactly the model turns' tokens (the observations between them 0)."""
    cfg = _cfg()
    cfg.actor_rollout_ref.rollout.max_tokens_per_turn = 128  # a long question is written twice in the first turn
    res = aio(D.build_demos(rows, _answering_search(rows), tokenizer, cfg, max_searches=2, kb_phrasing=kb_phrasing))
    by_id = {str(r["id"]): r for r in rows}
    for d in res.rows:
        src = by_id[d["id"]]
        acts = [P.parse(seg) for seg in d["segments"]]
        assert [a.kind for a in acts] == ["tool", "answer"], d["segments"]
        assert acts[0].query == str(src["question"]).strip()
        assert acts[-1].content == d["answer"] and R.em(d["answer"], list(src["golden_answers"])) == 1.0
        assert R.format_error(d["response_text"]) is None
        assert _spans(d["response_ids"], d["loss_mask"]) == [PR.encode_text(tokenizer, seg) for seg in d["segments"]]
        observed = [t for t, m in zip(d["response_ids"], d["loss_mask"]) if not m]
        assert tokenizer.decode(observed).strip().startswith("<information>") and d["num_searches"] == 1
        assert any(p in d["segments"][0] for p in KB_PHRASES) == kb_phrasing  # "This needs 1 search." or nothing
        if not kb_phrasing:
            assert not any(p in seg for p in KB_PHRASES for seg in d["segments"])
    return res.rows


@pytest.mark.parametrize("kb_phrasing", [True, False], ids=["kb_phrasing", "plain"])
def test_rows_without_hops_or_relation_make_well_formed_demonstrations(aio, tokenizer, kb_phrasing):
    built = _check_demos_of_rows_without_hops(aio, tokenizer, PLAIN_ROWS, kb_phrasing)
    assert [d["id"] for d in built] == [r["id"] for r in PLAIN_ROWS]


def test_real_qa_rows_make_well_formed_plain_demonstrations(aio, tokenizer, shared_data):
    """The first NQ and HotpotQA questions of ../shared/data, as the CLI reads them (skipped without it)."""
    from data_prep.qa import read_qa

    rows = [r for f in ("qa/nq/test.jsonl", "qa/hotpotqa/dev.jsonl")
            for r in read_qa(shared_data / f).head(20).to_dict("records")]
    built = _check_demos_of_rows_without_hops(aio, tokenizer, rows, kb_phrasing=False)
    assert len(built) >= 0.9 * len(rows)


def test_chain_candidates_are_titles_then_new_names_of_the_observation():
    obs = ('Doc 1(Title: "Journal of Psychotherapy Integration") The Journal of Psychotherapy Integration is '
           "published by the American Psychological Association on behalf of the Society for the Exploration of "
           "Psychotherapy Integration. It was established in 1991 by George Stricker.\nDoc 2(Title: APA) The "
           "U.S. APA is in Washington.")
    q = "Who was the first president of the association which published Journal of Psychotherapy Integration?"
    assert PL.chain_candidates(q, obs) == ["American Psychological Association",
                                           "Society for the Exploration of Psychotherapy Integration",
                                           "George Stricker", "Washington"]  # not "APA": a title already shown
    assert PL.chain_candidates(q, obs, ["Stanley Hall"], limit=2) == ["Stanley Hall", "American Psychological Association"]
    assert PL.support_titles({"support_titles": '["A", " ", "B"]'}) == ["A", "B"]
    # sentence-initial common words and months are not names; a one-word name seen in lower case neither
    common = 'Doc 1(Title: "Bill") Each bill is printed in August. Summer sales rose; each summer Gaston Lagaffe came.'
    assert PL.chain_candidates("What is the largest bill?", common) == ["Gaston Lagaffe"]


def test_chain_demonstrations_say_what_they_search_next():
    plan = PL.Plan(["Who founded X?", "Ann Lee"], ["Ann Lee", None], chain=True)
    segs = PL.write_segments(plan, "Boston", random.Random(0))
    assert len(segs) == 3 and "Ann Lee" in segs[1].split("</think>")[0] and segs[1].endswith("<search> Ann Lee </search>")
    assert R.format_error(segs[0] + "\n\n<information>x</information>\n\n" + segs[1]
                          + "\n\n<information>y</information>\n\n" + segs[2]) is None


def test_length_limits_of_the_rl_config_drop_what_the_rollout_could_not_produce(aio, built, kb_rows, retriever_url, tokenizer):
    from agent_rl.rollout.retrieval_client import RetrieverClient

    kept = {r["id"]: r for r in built.rows}
    two = [r for r in kb_rows if kept.get(r["id"], {}).get("num_searches") == 2][:4]
    short = min(len(kept[r["id"]]["response_ids"]) for r in two) - 1
    tight = _cfg(max_response_length=short)
    narrow = _cfg()
    narrow.actor_rollout_ref.rollout = replace(narrow.actor_rollout_ref.rollout, max_tokens_per_turn=8)

    async def run(cfg):
        async with RetrieverClient(retriever_url) as client:
            return await D.build_demos(two, client.search, tokenizer, cfg, max_searches=2, seed=0)

    assert aio(run(tight)).dropped == {"too_long": 4}
    assert aio(run(narrow)).dropped == {"turn_too_long": 4}
    with pytest.raises(ValueError, match="max_turns"):
        aio(run(replace(_cfg(), max_turns=1)))


def test_cli_writes_parquet_with_settings_and_a_drop_report(kb_rows, tiny_kb, retriever_url, model_dir, tmp_path, capsys):
    from data_prep.cli import main as prep_main

    out, dropped = tmp_path / "d.parquet", tmp_path / "dropped.jsonl"
    rc = prep_main(["demos", "--qa", str(tiny_kb / "train.parquet"), "--retriever-url", retriever_url + "/retrieve",
                    "--out", str(out), "--limit", "30", "--seed", "3", "--model", str(model_dir),
                    "--dropped", str(dropped), "max_turns=2", "retriever.topk=1", "data.max_obs_length=256",
                    "data.max_response_length=640"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "30 candidates: kept" in printed
    meta = DF.read_settings(out)
    assert meta["candidates"] == 30 and meta["kept"] + sum(meta["dropped"].values()) == 30
    assert meta["max_obs_length"] == 256 and meta["topk"] == 1 and meta["template"] == "chat" and meta["max_searches"] == 2
    trajs = DF.read_demos(out)
    assert len(trajs) == meta["kept"] and len(dropped.read_text().splitlines()) == 30 - meta["kept"]
    for t in trajs:
        assert len(t.loss_mask) == len(t.response_ids) and t.loss_mask[0] == 1 and t.loss_mask[-1] == 1
        assert R.is_valid_format(t.response_text)


def test_cli_plain_wording_writes_plain_demonstrations_and_says_so(tiny_kb, retriever_url, model_dir, tmp_path):
    import pandas as pd

    from data_prep.cli import main as prep_main

    args = ["--qa", str(tiny_kb / "train.parquet"), "--retriever-url", retriever_url, "--limit", "12",
            "--model", str(model_dir), "max_turns=2", "retriever.topk=1", "data.max_response_length=640"]
    kb, plain = tmp_path / "kb.parquet", tmp_path / "plain.parquet"
    assert prep_main(["demos", *args, "--out", str(kb)]) == 0
    assert prep_main(["demos", *args, "--out", str(plain), "--plain-wording"]) == 0
    assert DF.read_settings(kb)["kb_phrasing"] is True and DF.read_settings(plain)["kb_phrasing"] is False
    kb_rows, plain_rows = pd.read_parquet(kb), pd.read_parquet(plain)
    assert list(kb_rows["id"]) == list(plain_rows["id"]) and len(kb_rows)  # the same questions, grounded alike
    for k, p in zip(kb_rows["segments"], plain_rows["segments"]):
        assert [KB_ONLY.sub("", s) for s in k] == list(p)


def test_of_kinds_keeps_the_named_kinds_and_counts_the_rest():
    rows = [{"id": 1, "kind": "single"}, {"id": 2, "kind": "bridge"}, {"id": 3, "type": "comparison"},
            {"id": 4}, {"id": 5, "kind": "comparison"}]
    keep, left = D.of_kinds(rows, ["single", "comparison"])
    assert [r["id"] for r in keep] == [1, 3, 5] and left == 2  # HotpotQA's `type` counts; no kind is left out
    assert D.of_kinds(rows, None) == (rows, 0)
    assert D.of_kinds(rows, ["yes/no"]) == ([], 5)


def test_of_kinds_caps_a_kind_at_a_seeded_sample_in_file_order():
    rows = [{"id": i, "kind": "bridge" if i % 2 else "single"} for i in range(20)]  # 10 bridge (odd ids), 10 single
    keep, left = D.of_kinds(rows, ["single", "bridge:3"], seed=5)
    bridge = [r["id"] for r in keep if r["kind"] == "bridge"]
    assert len(bridge) == 3 and left == 7 and sum(r["kind"] == "single" for r in keep) == 10
    assert [r["id"] for r in keep] == sorted(r["id"] for r in keep)  # file order kept
    assert D.of_kinds(rows, ["single", "bridge:3"], seed=5) == (keep, left)  # the seed decides which
    others = {tuple(r["id"] for r in D.of_kinds(rows, ["bridge:3"], seed=s)[0]) for s in range(6)}
    assert len(others) > 1
    assert D.of_kinds(rows, ["bridge:0", "single"])[1] == 10
    assert D.of_kinds(rows, ["bridge:99"]) == ([r for r in rows if r["kind"] == "bridge"], 10)  # fewer than N: all
    assert D.kind_caps(["single", "bridge:40"]) == {"single": None, "bridge": 40}
    for bad in (["bridge:"], ["bridge:-1"], ["bridge:x"], ["bridge:²"], [":3"], ["single", "single:2"]):
        with pytest.raises(ValueError, match="bad kind"):
            D.kind_caps(bad)


def test_cli_kinds_builds_from_those_kinds_only_and_records_them(tiny_kb, retriever_url, model_dir, tmp_path, capsys):
    import pandas as pd

    from data_prep.cli import main as prep_main

    args = ["--qa", str(tiny_kb / "train.parquet"), "--retriever-url", retriever_url, "--limit", "30", "--seed", "3",
            "--model", str(model_dir), "max_turns=2", "retriever.topk=1", "data.max_response_length=640"]
    every, some = tmp_path / "every.parquet", tmp_path / "some.parquet"
    assert prep_main(["demos", *args, "--out", str(every)]) == 0
    assert prep_main(["demos", "--kinds", "single,comparison", *args, "--out", str(some)]) == 0  # overrides after it kept
    sampled = D.select_rows(pd.read_parquet(tiny_kb / "train.parquet").to_dict("records"), 30, 3)
    n_bridge = sum(r["kind"] == "bridge" for r in sampled)
    assert 0 < n_bridge < 30
    assert f"--kinds single,comparison: {30 - n_bridge} questions, {n_bridge} of other kinds left out" in capsys.readouterr().out
    e, s = pd.read_parquet(every), pd.read_parquet(some)
    assert set(s["kind"]) <= {"single", "comparison"} and "bridge" in set(e["kind"])
    assert list(s["id"]) == [i for i, k in zip(e["id"], e["kind"]) if k != "bridge"]  # the same rows, grounded alike
    assert DF.read_settings(some)["kinds"] == ["single", "comparison"] and DF.read_settings(every)["kinds"] is None
    assert DF.read_settings(some)["candidates"] == 30 - n_bridge
    missing = tmp_path / "none.parquet"
    assert prep_main(["demos", *args, "--out", str(missing), "--kinds", "yes/no,"]) == 2 and not missing.exists()
    assert "no question of kinds ['yes/no']" in capsys.readouterr().err
    capped = tmp_path / "capped.parquet"
    assert prep_main(["demos", "--kinds", "single,comparison,bridge:1", *args, "--out", str(capped)]) == 0
    assert f"{30 - n_bridge + 1} questions, {n_bridge - 1} of other kinds left out" in capsys.readouterr().out
    assert DF.read_settings(capped)["kinds"] == ["single", "comparison", "bridge:1"]
    with pytest.raises(SystemExit):  # a bad entry stops at the command line, before the model loads
        prep_main(["demos", "--kinds", "bridge:many", *args, "--out", str(capped)])
    assert "bad kind 'bridge:many'" in capsys.readouterr().err


def test_cli_reports_bad_input_in_one_line(tiny_kb, model_dir, tmp_path, capsys):
    from retriever_server.launch import free_port

    out = tmp_path / "d.parquet"
    base = ["--out", str(out), "--model", str(model_dir)]
    assert cli.demos_main(["--qa", str(tmp_path / "missing.parquet"), "--retriever-url", "http://127.0.0.1:1", *base]) == 2
    assert "missing.parquet" in capsys.readouterr().err
    # a model directory that is not there is said as such, not read as a hub id ("couldn't connect to huggingface.co")
    no_model = ["--out", str(out), "--model", str(tmp_path / "no_model")]
    assert cli.demos_main(["--qa", str(tiny_kb / "test.parquet"), "--retriever-url", "http://127.0.0.1:1", *no_model]) == 2
    err = capsys.readouterr().err
    assert f"error: the tokenizer's directory {tmp_path / 'no_model'} does not exist (--model;" in err
    assert "agent-rl-prep model --out artifacts/model" in err and "huggingface" not in err
    down = f"http://127.0.0.1:{free_port()}"
    assert cli.demos_main(["--qa", str(tiny_kb / "test.parquet"), "--retriever-url", down, *base,
                   "trainer.retriever_health_timeout_s=0.5"]) == 1
    assert f"error: retriever at {down}" in capsys.readouterr().err and not out.exists()
    assert cli.demos_main(["--qa", str(tiny_kb / "test.parquet"), "--retriever-url", down, "--max-searches", "5", *base]) == 2
    assert "exceeds max_turns" in capsys.readouterr().err
    assert cli.demos_main(["--qa", str(tiny_kb / "test.parquet"), "--retriever-url", down, "--rest", *base]) == 2
    assert "--rest needs --limit" in capsys.readouterr().err


def test_cli_exits_3_and_writes_nothing_when_no_question_is_grounded(tiny_kb, retriever_url, model_dir, tmp_path, capsys):
    """A QA set this corpus cannot answer is not a failed run: its own exit status, so
    scripts/real_data.sh leaves the set out and goes on with the others."""
    import pandas as pd

    qa, out = tmp_path / "ungroundable.parquet", tmp_path / "d.parquet"
    pd.DataFrame({"id": ["u1", "u2"], "question": ["who painted the moon?", "where is nowhere?"],
                  "golden_answers": [["zqxwv plorth"], ["vvqzzk"]], "data_source": "x", "split": "train"}).to_parquet(qa)
    rc = cli.demos_main(["--qa", str(qa), "--retriever-url", retriever_url, "--out", str(out), "--model", str(model_dir),
                 "max_turns=2"])
    assert rc == cli.NONE_KEPT == 3 and not out.exists()
    assert "no grounded demonstration was kept" in capsys.readouterr().err


def test_rest_is_the_complement_of_the_limit_sample_in_file_order():
    rows = [{"id": str(i)} for i in range(50)]
    sample, rest = D.select_rows(rows, 20, seed=7), D.select_rows(rows, 20, seed=7, rest=True)
    assert len(sample) == 20 and len(rest) == 30
    assert not {r["id"] for r in sample} & {r["id"] for r in rest}
    assert rest == [r for r in rows if r not in sample]
    assert [int(r["id"]) for r in sample] == sorted(int(r["id"]) for r in sample)
    assert D.select_rows(rows, 20, seed=8) != sample  # the seed picks the sample
    assert D.select_rows(rows, None, 0) == rows and D.select_rows(rows, None, 0, rest=True) == []
    assert D.select_rows(rows, 50, 0, rest=True) == []


def test_read_demos_rejects_a_broken_row_naming_it(tmp_path):
    row = {"id": "x", "question": "q?", "golden_answers": ["a"], "data_source": "kb", "kind": "single",
           "answer": "a", "queries": ["q"], "segments": ["s"], "num_searches": 1, "prompt_ids": [1, 2],
           "response_ids": [3, 4, 5], "loss_mask": [1, 0], "prompt_text": "p", "response_text": "r"}
    DF.write_demos([row], tmp_path / "bad.parquet", {})
    with pytest.raises(ValueError, match=r"bad.parquet:row 1 \(id x\): loss_mask"):
        DF.read_demos(tmp_path / "bad.parquet")


_OK_DEMO = {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "loss_mask": [1, 0, 1], "text": b"r"}
_BAD_DEMOS = {"empty ids": {**_OK_DEMO, "prompt_ids": []}, "short mask": {**_OK_DEMO, "loss_mask": [1, 0]},
              "mask of 2": {**_OK_DEMO, "loss_mask": [1, 2, 1]}, "no sampled token": {**_OK_DEMO, "loss_mask": [0, 0, 0]},
              "latin-1 text": {**_OK_DEMO, "text": b"caf\xe9"}}


def _demo_file(path, rows: list[tuple[str, dict]], row_group_size: int | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(rows)
    pq.write_table(pa.table({
        "id": [i for i, _ in rows], "prompt_ids": pa.array([r["prompt_ids"] for _, r in rows], pa.list_(pa.int32())),
        "response_ids": pa.array([r["response_ids"] for _, r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r["loss_mask"] for _, r in rows], pa.list_(pa.int8())),
        # Arrow stores string bytes unchecked: a Latin-1 text is written as it is
        "response_text": pa.array([r["text"] for _, r in rows], pa.binary()).view(pa.string()),
        "golden_answers": [["a"]] * n, "data_source": ["kb"] * n, "question": ["q?"] * n, "num_searches": [1] * n,
    }), path, row_group_size=row_group_size)


def test_read_demos_with_a_report_keeps_the_good_rows(tmp_path):
    """Every kind of unusable row, including text that is not UTF-8, is reported by row and id
    and left out when a Report is given; without one they are an error naming the rows."""
    from data_prep.io import Report

    rows = [("g0", _OK_DEMO), *((f"b{i}", r) for i, r in enumerate(_BAD_DEMOS.values())),
            ("g1", {**_OK_DEMO, "response_ids": [7] * 3})]
    path = tmp_path / "d.parquet"
    _demo_file(path, rows)
    report = Report()
    trajs = DF.read_demos(path, report)
    assert [t.response_ids for t in trajs] == [[3, 4, 5], [7, 7, 7]]
    assert [p.split(": ")[0] for p in report.problems] == [f"{path}:row {i + 2} (id b{i})" for i in range(4)] + [
        f"{path}:row 6"]
    assert report.problems[-1].endswith("column 'response_text': invalid UTF-8 at byte 4 (0xe9)")
    assert report.read == 7 and report.skipped == 5
    with pytest.raises(ValueError, match=r"d.parquet: 5 unusable demonstration rows:\n  .*d.parquet:row 2 \(id b0\)"):
        DF.read_demos(path)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.lists(st.one_of(st.tuples(st.just("good"), st.lists(st.integers(0, 50_000), min_size=1, max_size=5)),
                          st.tuples(st.just("bad"), st.sampled_from(sorted(_BAD_DEMOS)))), max_size=20),
       st.integers(1, 6))
def test_read_demos_mixed_rows_property(tmp_path_factory, rows, group):
    """Good rows come out unchanged and in order, across row groups; read = kept + skipped."""
    from data_prep.io import Report

    demo = [(f"r{i}", {**_OK_DEMO, "response_ids": v, "loss_mask": [1] * len(v)} if kind == "good" else _BAD_DEMOS[v])
            for i, (kind, v) in enumerate(rows)]
    path = tmp_path_factory.mktemp("demos") / "d.parquet"
    _demo_file(path, demo, group)
    report = Report()
    trajs = DF.read_demos(path, report)
    assert [t.response_ids for t in trajs] == [v for kind, v in rows if kind == "good"]
    assert report.read == len(trajs) + report.skipped and report.skipped == sum(k == "bad" for k, _ in rows)


def test_cli_skips_malformed_qa_rows_and_builds_from_the_rest(kb_rows, retriever_url, model_dir, tmp_path, capsys):
    """A long job fed bad rows midway: they are reported by line and the build goes on."""
    qa = tmp_path / "qa.jsonl"
    lines = [json.dumps({k: v for k, v in r.items()}, default=list).encode() for r in kb_rows[:6]]
    lines.insert(1, b'{"id": "x1", "question": "caf\xe9?", "golden_answers": ["a"]}')
    lines.insert(4, b'{"id": "x2", "golden_answers": ["a"]}')
    qa.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "d.parquet"
    rc = cli.demos_main(["--qa", str(qa), "--retriever-url", retriever_url, "--out", str(out), "--model", str(model_dir),
                 "max_turns=2", "retriever.topk=1", "data.max_obs_length=256", "data.max_response_length=640"])
    printed = capsys.readouterr()
    assert rc == 0 and "6 candidates: kept" in printed.out
    assert "[demos] skipped 2 malformed QA rows of 8:" in printed.err
    assert f"{qa}:2: invalid UTF-8 at byte 30 (0xe9)" in printed.err and f"{qa}:5: missing field 'question'" in printed.err
    assert DF.read_settings(out)["candidates"] == 6
