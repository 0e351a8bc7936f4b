"""benchmarks/kb_headroom.py: the scripted policies against a search worked by hand, the
demonstrations' queries on the lookalike kind, and one small real run (a generated lookalike
knowledge base, a flat index with the default encoder, the retriever in its own process)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import kb_headroom as H  # noqa: E402


def _doc(pid: str, title: str, text: str):
    from retriever_server.schemas import Document, ScoredDocument

    return ScoredDocument(document=Document(id=pid, contents=f'"{title}"\n{text}'), score=1.0)


BIO_1850 = _doc("1", "Orla Venn", "Orla Venn (1850–1920) was a painter born in Varnholt. She studied in Kelmere.")
BIO_1790 = _doc("2", "Orla Venn", "Born in Tremmere in 1790, Orla Venn was a chemist who died in 1850.")
BIO_KELL = _doc("3", "Tam Kell", "Tam Kell was born in 1820 in Dromere and became a poet; he died in 1890.")
ORG = _doc("4", "Zentrix Labs", "Founded in 1890 by Orla Venn, Zentrix Labs is a research laboratory with its "
                                "headquarters in Dromere.")
SEARCH = {  # what the hand-made retriever ranks first for each query
    "Orla Venn birth year": [BIO_1790, BIO_1850], "Orla Venn Varnholt birth year": [BIO_1850],
    "Tam Kell birth year": [BIO_KELL], "Tam Kell Dromere birth year": [BIO_KELL],
    "founder of Zentrix Labs": [ORG],
}


async def _search(queries, topk):
    return {q: SEARCH.get(q, [])[:topk] for q in queries}


ROWS = [
    {"kind": "single", "relation": "birth_year", "golden_answers": ["1850"], "support_ids": ["1"],
     "hop_queries": ["Orla Venn birth year"], "attribute_queries": ["Orla Venn Varnholt birth year"],
     "hop_answers": ["1850"], "namesakes": [2]},
    {"kind": "comparison", "relation": "born_first", "golden_answers": ["Tam Kell"], "support_ids": ["1", "3"],
     "hop_queries": ["Orla Venn birth year", "Tam Kell birth year"],
     "attribute_queries": ["Orla Venn Varnholt birth year", "Tam Kell Dromere birth year"],
     "hop_answers": ["1850", "1820"], "namesakes": [2, 1]},
    {"kind": "bridge", "relation": "founder>birth_year", "golden_answers": ["1850"], "support_ids": ["4", "1"],
     "hop_queries": ["founder of Zentrix Labs", "Orla Venn birth year"],
     "attribute_queries": ["founder of Zentrix Labs", "Orla Venn Varnholt birth year"],
     "hop_answers": ["Orla Venn", "1850"], "namesakes": [1, 2]},
    {"kind": "single", "relation": "birth_year", "golden_answers": ["1850"], "support_ids": ["1"],  # the standard
     "hop_queries": ["Orla Venn birth year"], "hop_answers": ["1850"]},                          # kind's columns
]


def test_scripted_policies_search_hop_by_hop_and_read_the_top_passage():
    name_only = asyncio.run(H.play(ROWS, "hop_queries", _search))
    # the namesake's biography comes first: its year is read, and the comparison turns over
    assert [o["answer"] for o in name_only] == ["1790", "Orla Venn", "1790", "1790"]
    assert name_only[2]["queries"] == ["founder of Zentrix Labs", "Orla Venn birth year"]
    assert name_only[1]["top_ids"] == ["2", "3"]
    better = asyncio.run(H.play(ROWS, "attribute_queries", _search))
    assert [o["answer"] for o in better] == ["1850", "Tam Kell", "1850", "1790"]  # the last row has no such column
    assert better[2]["queries"] == ["founder of Zentrix Labs", "Orla Venn Varnholt birth year"]
    # a top-2 reader still reads the first passage that states the fact
    assert asyncio.run(H.play(ROWS[:1], "hop_queries", _search, topk=2))[0]["answer"] == "1790"

    t = H.tally(ROWS, {"name only": name_only, "name + attribute": better})
    assert t["all"] == {"questions": 4, "with_namesakes": 3, "name only": 0.0, "name + attribute": 75.0, "gap": 75.0}
    assert t["comparison"]["gap"] == 100.0 and t["bridge"]["name + attribute"] == 100.0
    # hops whose name has namesakes: rows 0, 1 (hop 0) and 2 (hop 1); the support first 0 of 3, then 3 of 3
    assert t["namesake_hops"] == {"name only": {"hops": 3, "support_first": 0.0},
                                  "name + attribute": {"hops": 3, "support_first": 1.0}}
    text = H.table("train", t)
    assert "| all | 4 | 3 | 0.0 | 75.0 | +75.0 |" in text and "name only 0.000, name + attribute 1.000" in text


def test_a_bridge_whose_first_hop_reads_nothing_does_not_search_on():
    rows = [{**ROWS[2], "hop_queries": ["founder of Nothing", "Orla Venn birth year"]}]
    out = asyncio.run(H.play(rows, "hop_queries", _search))
    assert out[0]["queries"] == ["founder of Nothing"] and out[0]["answer"] is None


def test_earlier_and_entities():
    assert H._entities(["Ann Lee birth year", "Bo Li birth year"]) == ["Ann Lee", "Bo Li"]
    assert H._entities(["X Labs founding year", "X Press founding year"]) == ["X Labs", "X Press"]
    assert H.earlier(["a", "b"], ["1900", "1850"]) == "b"
    assert H.earlier(["a", "b"], ["1850", "1850"]) == "a"
    assert H.earlier(["a", "b"], [None, "1900"]) == "b"
    assert H.earlier(["a", "b"], [None, None]) is None


def test_demonstrations_of_the_lookalike_kind_search_the_name_only(tmp_path):
    """The demonstration builder plans its searches from the rows' hop queries (`plan_queries`):
    on the lookalike kind those leave out the attribute the question gives."""
    import pandas as pd

    from agent_rl.coldstart.plan import plan_queries
    from data_prep.synthetic import generate_kb

    generate_kb(tmp_path / "kb", seed=7, n_entities=150, n_train=150, n_test=30, kind="lookalike")
    rows = pd.read_parquet(tmp_path / "kb" / "train.parquet").to_dict("records")
    with_attribute = 0
    for row in rows:
        plan = plan_queries(row, max_searches=2)
        assert plan.queries == list(row["hop_queries"])
        for q, aq, attr in zip(plan.queries, row["attribute_queries"], row["hop_attributes"]):
            with_attribute += bool(attr)
            assert (attr not in q) if attr else q == aq
    assert with_attribute > len(rows) / 2


@pytest.mark.slow
def test_a_small_real_run_leaves_room_above_the_demonstrations(tmp_path, capsys):
    """Generates a small lookalike KB (the dev seed), builds a flat index of it and serves it;
    the attribute strategy leads the demonstrations' by more than the bar here too (about 30 s
    on 2 CPU cores)."""
    from data_prep.synthetic import generate_kb

    kb = tmp_path / "kb"
    generate_kb(kb, seed=H.DEV_KB_SEED, n_entities=150, n_train=300, n_test=30, kind="lookalike")
    out = tmp_path / "r.json"
    res = H.main(["--kb", str(kb), "--index", str(tmp_path / "index"), "--splits", "train", "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith("[hardware] ") and "bar (15 points, name + attribute over name only) on train" in printed
    assert "| all | 300 |" in printed
    t = res["splits"]["train"]
    assert res["kind"] == "lookalike" and res["topk"] == 1 and json.loads(out.read_text())["splits"] == res["splits"]
    assert sum(t[k]["questions"] for k in H.KINDS if k in t) == t["all"]["questions"] == 300
    assert t["all"]["gap"] >= H.BAR, t
    hops = t["namesake_hops"]
    assert hops["name + attribute"]["support_first"] > hops["name only"]["support_first"] + 0.3
