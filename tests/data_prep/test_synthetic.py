"""The embedded knowledge base: invariants, split disjointness, determinism, sizes, and
the kbcheck figures (with real indexes when data_prep.indexing is available)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pandas as pd
import pytest

from data_prep.kb_check import check_invariants, check_kb, format_report, occurs, retrieval_recall
from data_prep.qa import read_qa
from data_prep.synthetic import _BLOCK, _build_world, generate_kb

SMALL = dict(seed=0, n_entities=200, n_train=400, n_test=60)


@pytest.fixture(scope="module")
def small_kb(tmp_path_factory):
    out = tmp_path_factory.mktemp("kb")
    stats = generate_kb(out, **SMALL)
    corpus = {p["id"]: p["contents"] for p in map(json.loads, open(out / "corpus.jsonl", encoding="utf-8"))}
    splits = {s: read_qa(out / f"{s}.parquet") for s in ("train", "test")}
    return out, stats, corpus, splits


def test_counts_and_schema(small_kb):
    out, stats, corpus, splits = small_kb
    assert stats["entities"] == 200 and stats["passages"] == len(corpus)
    assert (stats["train"], stats["test"]) == (400, 60)
    for split, df in splits.items():
        assert len(df) == stats[split]
        assert {"id", "question", "golden_answers", "data_source", "split", "kind", "support_ids",
                "hop_queries", "hop_answers"} <= set(df.columns)
        assert set(df.data_source) == {"kb"} and set(df.split) == {split}
        assert df.id.is_unique and df.question.is_unique
        assert Counter(df.kind) == Counter(stats["kinds"][split])
        assert all(stats["kinds"][split][k] > 0 for k in ("single", "bridge", "comparison"))
        for r in df.itertuples():
            assert all(type(v) is list for v in (r.golden_answers, r.support_ids, r.hop_queries, r.hop_answers))
            n = 1 if r.kind == "single" else 2
            assert len(r.support_ids) == len(r.hop_queries) == len(r.hop_answers) == n


def test_passages_are_wikipedia_style(small_kb):
    _, _, corpus, _ = small_kb
    for pid, contents in corpus.items():
        m = re.fullmatch(r'"([^"\n]+)"\n([^\n]+)', contents)
        assert m, contents
        assert 40 <= len(m.group(2).split()) <= 120
    assert list(corpus) == [str(i) for i in range(len(corpus))]


def test_answers_are_in_their_support_passages(small_kb):
    _, _, corpus, splits = small_kb
    report = check_invariants(corpus, splits)
    assert report["problems"] == []
    assert report["answer_in_support"] == 1.0
    assert report["hop_answer_in_passage"] == 1.0
    assert report["shared_questions"] == 0


def test_hops_chain_and_comparisons_point_at_the_earlier_entity(small_kb):
    _, _, corpus, splits = small_kb
    for df in splits.values():
        for r in df.itertuples():
            if r.kind == "bridge":
                # the second hop searches for the first hop's answer
                assert r.hop_answers[0] in r.hop_queries[1]
                assert r.golden_answers[0] == r.hop_answers[1]
            elif r.kind == "comparison":
                years = [int(y) for y in r.hop_answers]
                assert years[0] != years[1]
                earlier = r.hop_queries[years.index(min(years))]
                assert earlier.startswith(r.golden_answers[0] + " ")
                assert r.golden_answers[0] in r.question
            else:
                assert r.golden_answers[0] == r.hop_answers[0]


def test_train_and_test_share_no_entities(small_kb):
    _, _, _, splits = small_kb
    # support passages belong to the entities a question names or passes through
    train_support = {pid for ids in splits["train"].support_ids for pid in ids}
    test_support = {pid for ids in splits["test"].support_ids for pid in ids}
    assert not train_support & test_support
    assert not set(splits["train"].question.str.lower()) & set(splits["test"].question.str.lower())


def test_same_seed_same_bytes_other_seed_differs(small_kb, tmp_path):
    out, *_ = small_kb
    generate_kb(tmp_path / "again", **SMALL)
    for name in ("corpus.jsonl", "train.parquet", "test.parquet", "kb_meta.json"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    generate_kb(tmp_path / "other", **{**SMALL, "seed": 1})
    assert (tmp_path / "other" / "corpus.jsonl").read_bytes() != (out / "corpus.jsonl").read_bytes()


def test_names_come_in_confusable_families():
    import random

    w = _build_world(random.Random(0), 2000)
    surname_stems = Counter(p.family for p in w.people)
    firsts = Counter(p.first for p in w.people)
    assert sum(surname_stems[p.family] > 1 for p in w.people) / len(w.people) > 0.9
    assert sum(firsts[p.first] > 1 for p in w.people) / len(w.people) > 0.9
    org_stems = Counter(o.stem for o in w.orgs)
    assert sum(org_stems[o.stem] > 1 for o in w.orgs) / len(w.orgs) > 0.7
    # a few near-identical spellings of organisation stems (Zentrix / Zentrex)
    stems = sorted(org_stems)
    assert any(a[:-1] == b[:-1] or b == a + "a" for a, b in zip(stems, stems[1:]))
    names = [p.name for p in w.people] + [o.name for o in w.orgs] + [x.title for x in w.works] + [c.name for c in w.cities]
    assert len(set(names)) == len(names)
    tokens = {t.lower() for n in names for t in n.split()}
    assert not tokens & _BLOCK


def test_default_size_meets_targets(tmp_path):
    stats = generate_kb(tmp_path)
    assert stats["entities"] == 2000 and 2500 <= stats["passages"] <= 5000
    assert (stats["train"], stats["test"]) == (5000, 500)
    assert stats["seconds"] < 10
    report = check_kb(tmp_path)
    assert report["ok"] and report["answer_in_support"] == 1.0 and report["shared_questions"] == 0


def test_occurs_needs_whole_words():
    assert occurs("Orla Venn", '"Orla Venn"\nOrla Venn was born')
    assert not occurs("Orla Venn", "Orla Vennick was born")
    assert occurs("1874", "born in 1874.")
    assert not occurs("187", "born in 1874.")


class _Oracle:
    """A searcher that returns given passage ids: tests the recall arithmetic only."""

    def __init__(self, answer):
        self.answer = answer

    def search(self, queries, topk):
        return [[(pid, 1.0) for pid in self.answer(q)][:topk] for q in queries]


def test_retrieval_recall_arithmetic(small_kb):
    _, _, _, splits = small_kb
    gold = {}
    for df in splits.values():
        for r in df.itertuples():
            for q, pid in zip(r.hop_queries, r.support_ids):
                gold[q] = pid
            if r.kind == "single":
                gold[r.question] = r.support_ids[0]
    perfect = retrieval_recall(_Oracle(lambda q: ["x", "y", gold[q]]), splits, topk=3)
    assert perfect["single_hop_question"]["recall"] == 1.0 and perfect["hop_query"]["recall"] == 1.0
    fourth = retrieval_recall(_Oracle(lambda q: ["x", "y", "z", gold[q]]), splits, topk=3)
    assert fourth["single_hop_question"]["recall"] == 0.0
    n_single = sum((df.kind == "single").sum() for df in splits.values())
    assert perfect["single_hop_question"]["queries"] == min(500, n_single)


def test_kbcheck_reports_a_broken_kb(small_kb, tmp_path):
    out, *_ = small_kb
    for name in ("corpus.jsonl", "train.parquet"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    test = pd.read_parquet(out / "test.parquet")
    test.loc[0, "hop_answers"] = ["Nobody Atall"] * len(test.loc[0, "hop_answers"])
    test.loc[1, "question"] = pd.read_parquet(out / "train.parquet").question[0]
    test.to_parquet(tmp_path / "test.parquet")
    report = check_kb(tmp_path)
    assert not report["ok"]
    assert report["shared_questions"] == 1 and report["hop_answer_in_passage"] < 1.0
    assert any("hop answer 'Nobody Atall' not in passage" in p for p in report["problems"])


@pytest.mark.slow
def test_recall_with_real_indexes(tmp_path):
    """BM25 and the default dense encoder retrieve the supporting passage for most
    single-hop questions (names are rare tokens, so BM25 should be near perfect)."""
    indexing = pytest.importorskip("data_prep.indexing")
    out = tmp_path / "kb"
    generate_kb(out, seed=0, n_entities=120, n_train=200, n_test=40)  # ~180 passages: quick to encode
    dirs = []
    for kind in ("bm25", "flat"):
        indexing.build_index(out / "corpus.jsonl", tmp_path / kind, kind=kind, progress=False)
        dirs.append(tmp_path / kind)
    report = check_kb(out, dirs)
    bm25 = report["recall"][str(dirs[0])]
    dense = report["recall"][str(dirs[1])]
    # measured: this KB BM25 0.90 / 1.00, MiniLM 1.00 / 1.00; default KB BM25 0.986 / 0.998,
    # MiniLM 1.000 / 1.000 (single-hop question / hop query)
    assert bm25["single_hop_question"]["recall"] >= 0.8 and bm25["hop_query"]["recall"] >= 0.9
    assert dense["single_hop_question"]["recall"] >= 0.9 and dense["hop_query"]["recall"] >= 0.9


TINY = dict(seed=0, n_entities=60, n_train=40, n_test=10)
KB_FILES = ("corpus.jsonl", "train.parquet", "test.parquet", "kb_meta.json")


def test_a_directory_it_did_not_write_is_refused_untouched(tmp_path, capsys):
    """Search-R1's own data directory holds corpus.jsonl, train.parquet and test.parquet:
    `synthetic --out` there overwrote them."""
    from data_prep.cli import main

    out = tmp_path / "search_r1_data"
    out.mkdir()
    theirs = {name: f"the user's {name}" for name in ("corpus.jsonl", "train.parquet", "test.parquet")}
    for name, text in theirs.items():
        (out / name).write_text(text)
    with pytest.raises(FileExistsError, match="not written by this tool"):
        generate_kb(out, **TINY)
    assert main(["synthetic", "--out", str(out), "--entities", "60", "--train", "40", "--test", "10"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[hardware]")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and str(out) in errors[0], errors
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs


def test_the_set_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure while writing the set (here: the test split) leaves the earlier set as it was:
    corpus.jsonl and train.parquet used to be the new ones already, beside the old test.parquet."""
    import data_prep.synthetic as S

    out = tmp_path / "kb"
    generate_kb(out, **TINY)
    before = {name: (out / name).read_bytes() for name in KB_FILES}
    real_rows = S._rows

    def rows(qs, split):
        if split == "test":
            raise OSError(28, "No space left on device")
        return real_rows(qs, split)

    monkeypatch.setattr(S, "_rows", rows)
    with pytest.raises(OSError):
        generate_kb(out, **{**TINY, "seed": 1})
    assert {name: (out / name).read_bytes() for name in KB_FILES} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kb"]  # no temporary directory left beside it
    monkeypatch.setattr(S, "_rows", real_rows)
    generate_kb(out, **{**TINY, "seed": 1})  # a set it wrote is replaced, as a set
    assert (out / "corpus.jsonl").read_bytes() != before["corpus.jsonl"]
    (out / "index").mkdir()  # something else made inside it since: not replaced, not deleted
    with pytest.raises(FileExistsError, match="index"):
        generate_kb(out, **TINY)
    assert (out / "index").is_dir()


# ---------------------------------------------------------------------------------------
# the knowledge-base kinds

STANDARD_DIGESTS = {
    # sha256 over corpus.jsonl, kb_meta.json, .complete and both splits' rows as JSON, of the
    # files written before the lookalike kind existed (main d88ee4f): the default is unchanged
    (0, 200, 400, 60): "02bf0b206a442705caba94e583db015d1f040d0950e0cdb3c8a6c0a429d99308",
    (5, 60, 40, 10): "54495337cb31081a22bfd8dc765a686c003f5d3f223d27b64c3d53b1a5bc8a28",
}


def _digest(kb) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in ("corpus.jsonl", "kb_meta.json", ".complete"):
        h.update((kb / name).read_bytes())
    for split in ("train", "test"):
        h.update(pd.read_parquet(kb / f"{split}.parquet").to_json(orient="records").encode())
    return h.hexdigest()


def test_the_standard_kind_is_what_it_was(small_kb, tmp_path):
    out, *_ = small_kb
    assert _digest(out) == STANDARD_DIGESTS[(0, 200, 400, 60)]
    generate_kb(tmp_path / "kb", seed=5, n_entities=60, n_train=40, n_test=10, kind="standard")
    assert _digest(tmp_path / "kb") == STANDARD_DIGESTS[(5, 60, 40, 10)]
    with pytest.raises(ValueError, match="lookalike"):
        generate_kb(tmp_path / "other", kind="lookalikes")


LOOKALIKE = dict(seed=7, n_entities=300, n_train=500, n_test=80, kind="lookalike")


@pytest.fixture(scope="module")
def lookalike_kb(tmp_path_factory):
    out = tmp_path_factory.mktemp("lookalike")
    stats = generate_kb(out, **LOOKALIKE)
    corpus = {p["id"]: p["contents"] for p in map(json.loads, open(out / "corpus.jsonl", encoding="utf-8"))}
    splits = {s: read_qa(out / f"{s}.parquet") for s in ("train", "test")}
    return out, stats, corpus, splits


def test_lookalike_people_come_in_groups_told_apart_by_their_attributes():
    import random

    w = _build_world(random.Random(7), 600, lookalike=True)
    groups: dict[str, list] = {}
    for p in w.people:
        groups.setdefault(p.name, []).append(p)
    assert all(2 <= len(g) <= 4 for g in groups.values())
    assert Counter(map(len, groups.values())).keys() == {2, 3, 4}
    for g in groups.values():
        births = sorted(p.birth for p in g)
        assert all(b - a >= 5 for a, b in zip(births, births[1:]))
        for attr in (lambda p: w.cities[p.birthplace].name, lambda p: p.occupation):
            assert len({attr(p) for p in g}) == len(g)
    standard = _build_world(random.Random(7), 600)  # unique names
    assert not standard.lookalike and len({p.name for p in standard.people}) == len(standard.people)


def test_only_a_persons_biography_names_what_tells_the_namesakes_apart(lookalike_kb):
    """A namesake's passages never name another's birthplace or occupation, and a career passage
    never the occupation: the attribute query has one passage to find."""
    out, stats, corpus, splits = lookalike_kb
    bios = {}  # biography passage id -> (name, birthplace, occupation), from the rows' own hops
    for df in splits.values():
        for r in df.itertuples():
            for k, (pid, q, attr) in enumerate(zip(r.support_ids, r.hop_queries, r.hop_attributes)):
                if attr:
                    bios.setdefault(pid, {})["city" if q.endswith("birth year") else "occupation"] = attr
    assert len(bios) > 20
    by_title: dict[str, list[str]] = {}
    for pid, contents in corpus.items():
        by_title.setdefault(contents.split("\n")[0], []).append(pid)
    for pid, attrs in bios.items():
        title = corpus[pid].split("\n")[0]
        others = [o for o in by_title[title] if o != pid]
        assert len(others) >= 3  # its own career passage and at least one namesake's two
        for attr in attrs.values():
            assert occurs(attr, corpus[pid])
            assert not any(occurs(attr, corpus[o]) for o in others), (title, attr)


def test_lookalike_questions_give_the_attribute_their_demonstrations_leave_out(lookalike_kb):
    out, stats, corpus, splits = lookalike_kb
    assert check_invariants(corpus, splits)["problems"] == []
    assert json.loads((out / "kb_meta.json").read_text())["kb_kind"] == "lookalike"
    counts = Counter()
    for df in splits.values():
        assert {"attribute_queries", "hop_attributes", "namesakes"} <= set(df.columns)
        for r in df.itertuples():
            person_hops = 0
            for q, aq, attr, n in zip(r.hop_queries, r.attribute_queries, r.hop_attributes, r.namesakes):
                if attr:  # a hop that searches a person: the name has namesakes, the question the attribute
                    person_hops += 1
                    assert n >= 2 and occurs(attr, r.question) and occurs(attr, aq) and not occurs(attr, q)
                    assert aq.replace(f" {attr}", "", 1) == q
                else:
                    assert aq == q and n == 1
            counts[r.relation, person_hops] += 1
            if r.kind == "comparison" and person_hops:
                assert r.hop_queries[0].split(" birth")[0] != r.hop_queries[1].split(" birth")[0]
    # every question about a person names its attribute; about organisations alone, none
    assert {rel for (rel, hops) in counts if hops} == {"birth_year", "birthplace", "birthplace>country", "born_first",
                                                       "founder>birth_year", "author>birth_year"}
    assert all(hops == 0 for (rel, hops) in counts if rel in ("founder", "founding_year", "founded_first"))
    share = sum(n for (rel, hops), n in counts.items() if hops) / sum(counts.values())
    assert share > 0.5
    assert stats["questions_with_namesakes"] == {s: int(sum(max(n) > 1 for n in df.namesakes)) for s, df in splits.items()}


@pytest.mark.parametrize("fixture", ["small_kb", "lookalike_kb"])
def test_the_scripted_reader_reads_every_hop_answer_from_its_support_passage(fixture, request):
    from data_prep.synthetic import hop_facts, read_fact

    _, _, corpus, splits = request.getfixturevalue(fixture)
    n = 0
    for df in splits.values():
        for r in df.itertuples():
            for fact, pid, ans in zip(hop_facts(r.relation), r.support_ids, r.hop_answers, strict=True):
                assert read_fact(fact, corpus[pid].split("\n", 1)[1]) == ans, (fact, corpus[pid])
                n += 1
    assert n > 400


def test_synthetic_kind_option_writes_a_lookalike_kb(tmp_path, capsys):
    from data_prep.cli import main

    out = tmp_path / "kb"
    assert main(["synthetic", "--out", str(out), "--kind", "lookalike", "--entities", "120", "--train", "60",
                 "--test", "20", "--seed", "7"]) == 0
    printed = capsys.readouterr().out
    assert "lookalike:" in printed and "names shared by 2-4 people" in printed
    assert (out / ".complete").read_text() == "seed 7\nkind lookalike\n"
    assert check_kb(out)["ok"]


def test_kbcheck_checks_the_lookalike_attributes(lookalike_kb, tmp_path):
    out, stats, corpus, splits = lookalike_kb
    report = check_kb(out)
    assert report["ok"] and report["with_namesakes"] == stats["questions_with_namesakes"]
    assert "questions with a hop whose name has namesakes: train" in format_report(report)
    for name in ("corpus.jsonl", "train.parquet"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    test = pd.read_parquet(out / "test.parquet")
    i = next(i for i, a in enumerate(test.hop_attributes) if a[0])
    test.at[i, "attribute_queries"] = test.hop_queries[i]  # the attribute left out of its query
    test.to_parquet(tmp_path / "test.parquet")
    report = check_kb(tmp_path)
    assert not report["ok"]
    assert report["problems"] == [f"test {test.id[i]}: attribute {a!r} of hop {k} not in its attribute query"
                                  for k, a in enumerate(test.hop_attributes[i]) if a]


def test_recall_pairs_the_namesake_hops_queries(lookalike_kb):
    _, _, _, splits = lookalike_kb
    gold = {q: pid for df in splits.values() for r in df.itertuples()
            for qs in (r.hop_queries, r.attribute_queries) for q, pid in zip(qs, r.support_ids)}
    attribute_queries = {q for r in splits["test"].itertuples() for q, a in zip(r.attribute_queries, r.hop_attributes) if a}
    # a searcher that finds the support passage for attribute queries only
    rec = retrieval_recall(_Oracle(lambda q: [gold[q]] if q in attribute_queries else ["x"]), splits, topk=1)
    assert rec["namesake_attribute_query"]["recall"] == 1.0 and rec["namesake_hop_query"]["recall"] == 0.0
    assert rec["namesake_attribute_query"]["queries"] == rec["namesake_hop_query"]["queries"] > 0
