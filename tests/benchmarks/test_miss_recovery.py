"""benchmarks/miss_recovery.py: its counting against cases worked by hand, and one real run (a
generated knowledge base behind the real retriever, the real vLLM engine on the 2-block policy)
whose hop ranks are checked against the retriever's own answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_rl.demo.records import read_record  # noqa: E402
from benchmarks import miss_recovery as M  # noqa: E402
from benchmarks import records  # noqa: E402


def test_hop_ranks_count_top1_near_and_missing():
    ranked = [["a", "b"], ["x", "c", "y"], ["p", "q"], ["d"]]
    assert M.hop_ranks(["a", "c", "z", "d"], ranked) == {1: 2, "2-5": 1, "missing": 1}
    with pytest.raises(ValueError):
        M.hop_ranks(["a"], ranked)  # a hop without its retrieval is an error, not a silent cut


def test_look_alike_is_the_best_ranked_passage_not_needed():
    assert M.look_alike(["s1", "x", "s2"], {"s1", "s2"}) == 1
    assert M.look_alike(["x", "s1"], {"s1"}) == 0
    assert M.look_alike(["s1", "s2"], {"s1", "s2"}) is None


@pytest.mark.parametrize("text, query", [
    ("<think> more </think>\n<search>  Kora Vell birth year </search>", "Kora Vell birth year"),
    ("<think> done </think>\n<answer> 1921 </answer>", None),
    ("<answer> 1921 </answer> <search> late </search>", None),  # answered first: the episode ends there
    ("<search> unclosed", None),
    ("no tags at all", None),
])
def test_next_search(text, query):
    assert M.next_search(text) == query


def test_tally_shares_by_condition_and_kind():
    base = {"first_query": "q0", "needed": {"s1", "s2"}}
    samples = [
        # after a look-alike that stood in for s1: 4 samples, 3 search again, 1 repeats the
        # query, 1 finds s1, 2 find a needed passage (s1; s2)
        {**base, "condition": "look-alike", "kind": "bridge", "query": "q1", "found": "s1", "missed": "s1"},
        {**base, "condition": "look-alike", "kind": "bridge", "query": "q0", "found": "x", "missed": "s1"},
        {**base, "condition": "look-alike", "kind": "bridge", "query": "q2", "found": "s2", "missed": "s1"},
        {**base, "condition": "look-alike", "kind": "bridge", "query": None, "found": None, "missed": "s1"},
        # after the right passage: nothing can count as finding a missed one
        {**base, "condition": "right passage", "kind": "single", "query": "q1", "found": "s1", "missed": None},
        {**base, "condition": "right passage", "kind": "single", "query": None, "found": None, "missed": None},
    ]
    t = M.tally(samples)
    assert t["look-alike"]["bridge"] == {"samples": 4, "search_again": 0.75, "same_query": 0.25,
                                         "finds_missed": 0.25, "finds_needed": 0.5}
    assert t["right passage"]["single"] == {"samples": 2, "search_again": 0.5, "same_query": 0.0,
                                            "finds_missed": 0.0, "finds_needed": 0.5}
    text = M.table({"split": "test", "hops": {"1": 3, "2-5": 1}, "questions": 2, "samples": 4, "temperature": 1.0,
                    "after": t})
    assert "top 1 0.750, rank 2-5 0.250, not in the top 5 0.000" in text
    assert "| look-alike | bridge | 4 | 0.750 | 0.250 | 0.250 | 0.500 |" in text


@pytest.mark.slow  # starts a retriever process and a vLLM engine (the suite's check found it unmarked)
def test_a_real_run_counts_hops_as_the_retriever_ranks_them(tiny_policy, tmp_path):
    import pandas as pd

    from agent_rl.rollout.retrieval_client import SyncRetrieverClient
    from benchmarks.kb_server import kb_retriever

    with kb_retriever("test-miss-recovery-", n_entities=120) as (work, url):
        out = tmp_path / "r.json"
        res = M.main(["--model", str(tiny_policy), "--kb", str(work / "kb"), "--retriever-url", url,
                      "--questions", "6", "--samples", "2", "--json", str(out), "--record-dir", str(tmp_path / "record")])
        rows = pd.read_parquet(work / "kb" / "test.parquet")
        support = [str(s) for v in rows.support_ids for s in v]
        queries = [str(q) for v in rows.hop_queries for q in v]
        client = SyncRetrieverClient(url)
        try:
            ranked = [[d.document.id for d in docs] for docs in client.search(queries, 5)]
        finally:
            client.close()
    assert res["hops"] == {str(k): v for k, v in M.hop_ranks(support, ranked).items()}
    assert sum(res["hops"].values()) == len(queries) > 0
    assert res["questions"] == 6 and 0 <= res["searched_first"] <= 6
    assert "native_bf16=" in res["hardware"] and "engine=" in res["hardware"]
    for by_kind in res["after"].values():  # whatever the 2-block policy wrote, shares stay shares
        for r in by_kind.values():
            assert r["samples"] > 0 and all(0.0 <= r[k] <= 1.0 for k in r if k != "samples")
    assert json.loads(out.read_text())["hops"] == res["hops"]
    rec = read_record(tmp_path / "record")  # the record's headline is computed from the same result
    assert rec.headline == records.miss_recovery_headline(res) and rec.host == res["hardware"]
