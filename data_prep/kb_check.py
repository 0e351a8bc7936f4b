"""Invariants and retrieval figures of a generated knowledge base (`agent-rl-prep kbcheck`).

Invariants (must hold for every question, else the KB is broken):
- every support passage exists, and ``len(support_ids) == len(hop_queries) == len(hop_answers)``;
- answer in support: ``golden_answers[0]`` occurs in the question's support passages, and
  each ``hop_answers[i]`` occurs in passage ``support_ids[i]`` (whole words, case-insensitive);
- train and test share no question text (normalised as for EM);
- the lookalike kind (`hop_attributes`): each hop's attribute occurs in the question, in that
  hop's attribute query and in its support passage, and not in its (name-only) hop query.

Figures: counts per split and kind, passage lengths, how often *every* alias occurs in the
support (aliases may legitimately sit only in the person's own biography), and, for each
index given, recall@k of the supporting passage for single-hop questions (question text as
the query) and for every hop (its hop query as the query); on the lookalike kind also for the
hops whose name has namesakes, by the name-only hop query and by the attribute query.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from data_prep.io import DataPrepError
from data_prep.qa import normalize_question


def occurs(answer: str, text: str) -> bool:
    """`answer` appears in `text` as whole words, ignoring case ("Venn" not in "Vennick")."""
    return re.search(r"(?<!\w)" + re.escape(answer.lower()) + r"(?!\w)", text.lower()) is not None


LOOKALIKE_COLUMNS = ("attribute_queries", "hop_attributes", "namesakes")
"""The columns a lookalike knowledge base's rows add (`data_prep.synthetic`)."""


def _load(kb_dir: Path):
    import pandas as pd

    for name in ("corpus.jsonl", "train.parquet", "test.parquet"):
        if not (kb_dir / name).exists():
            raise DataPrepError(f"{kb_dir / name}: no such file (generate the KB with `agent-rl-prep synthetic`)")
    with open(kb_dir / "corpus.jsonl", encoding="utf-8") as f:
        corpus = {p["id"]: p["contents"] for p in map(json.loads, f)}
    splits = {s: pd.read_parquet(kb_dir / f"{s}.parquet") for s in ("train", "test")}
    for df in splits.values():
        for col in ("golden_answers", "support_ids", "hop_queries", "hop_answers", *LOOKALIKE_COLUMNS):
            if col in df.columns:
                df[col] = [list(v) for v in df[col]]
    return corpus, splits


def check_invariants(corpus: dict[str, str], splits: dict) -> dict:
    """Counts and invariant rates (see module docstring); `problems` lists failures."""
    out: dict = {"passages": len(corpus), "problems": []}
    words = [len(c.split("\n", 1)[-1].split()) for c in corpus.values()]
    out["passage_words"] = {"min": min(words), "max": max(words), "mean": round(sum(words) / len(words), 1)}
    n_q = n_ans = n_hops = n_hop_ok = n_alias = n_alias_ok = 0
    for split, df in splits.items():
        out[split] = {"questions": len(df), **df["kind"].value_counts().sort_index().to_dict()}
        for r in df.itertuples():
            n_q += 1
            if not (len(r.support_ids) == len(r.hop_queries) == len(r.hop_answers) > 0):
                out["problems"].append(f"{split} {r.id}: support_ids / hop_queries / hop_answers lengths differ")
                continue
            missing = [pid for pid in r.support_ids if pid not in corpus]
            if missing:
                out["problems"].append(f"{split} {r.id}: support passages {missing} not in the corpus")
                continue
            support = "\n".join(corpus[pid] for pid in r.support_ids)
            if occurs(r.golden_answers[0], support):
                n_ans += 1
            else:
                out["problems"].append(f"{split} {r.id}: answer {r.golden_answers[0]!r} not in its support passages")
            for pid, ans in zip(r.support_ids, r.hop_answers):
                n_hops += 1
                if occurs(ans, corpus[pid]):
                    n_hop_ok += 1
                else:
                    out["problems"].append(f"{split} {r.id}: hop answer {ans!r} not in passage {pid}")
            for alias in r.golden_answers:
                n_alias += 1
                n_alias_ok += occurs(alias, support)
            if "hop_attributes" in df.columns:
                out["problems"] += _attribute_problems(split, r, corpus)
    out["answer_in_support"] = n_ans / max(n_q, 1)
    out["hop_answer_in_passage"] = n_hop_ok / max(n_hops, 1)
    out["every_alias_in_support"] = n_alias_ok / max(n_alias, 1)
    if all("namesakes" in df.columns for df in splits.values()):
        out["with_namesakes"] = {split: int(sum(max(n) > 1 for n in df["namesakes"])) for split, df in splits.items()}
    train_q = {normalize_question(q) for q in splits["train"]["question"]}
    shared = [q for q in splits["test"]["question"] if normalize_question(q) in train_q]
    out["shared_questions"] = len(shared)
    if shared:
        out["problems"].append(f"{len(shared)} test questions also in train, e.g. {shared[0]!r}")
    return out


def _attribute_problems(split: str, r, corpus: dict[str, str]) -> list[str]:
    """A lookalike row's attribute invariants (module docstring)."""
    out = []
    for k, (attr, hq, aq, pid) in enumerate(zip(r.hop_attributes, r.hop_queries, r.attribute_queries, r.support_ids)):
        if not attr:
            if aq != hq:
                out.append(f"{split} {r.id}: hop {k} has no attribute but an attribute query {aq!r}")
            continue
        where = {"the question": r.question, "its attribute query": aq, f"passage {pid}": corpus[pid]}
        out += [f"{split} {r.id}: attribute {attr!r} of hop {k} not in {name}"
                for name, text in where.items() if not occurs(attr, text)]
        if occurs(attr, hq):
            out.append(f"{split} {r.id}: the name-only hop query {hq!r} holds the attribute {attr!r}")
    return out


def retrieval_recall(searcher, splits: dict, topk: int = 3, max_queries: int = 500, seed: int = 0) -> dict:
    """recall@topk of the supporting passage: single-hop questions (question as the query)
    and all hops of test questions (hop query as the query); on the lookalike kind also the
    test hops whose name has namesakes, by hop query and by attribute query (one sample of
    hops for both); at most `max_queries` each."""
    rng = random.Random(seed)
    single = [(r.question, r.support_ids[0]) for df in splits.values()
              for r in df.itertuples() if r.kind == "single"]
    hops = [(q, pid) for r in splits["test"].itertuples() for q, pid in zip(r.hop_queries, r.support_ids)]
    figures = [("single_hop_question", single), ("hop_query", hops)]
    if "namesakes" in splits["test"].columns:
        namesake_hops = [(q, aq, pid) for r in splits["test"].itertuples()
                         for q, aq, pid, n in zip(r.hop_queries, r.attribute_queries, r.support_ids, r.namesakes) if n > 1]
        if len(namesake_hops) > max_queries:  # one sample for both: the figures are paired
            namesake_hops = random.Random(seed).sample(namesake_hops, max_queries)
        figures += [("namesake_hop_query", [(q, pid) for q, _, pid in namesake_hops]),
                    ("namesake_attribute_query", [(aq, pid) for _, aq, pid in namesake_hops])]
    out = {}
    for name, pairs in figures:
        if len(pairs) > max_queries:
            pairs = rng.sample(pairs, max_queries)
        if not pairs:
            continue
        results = searcher.search([q for q, _ in pairs], topk)
        hits = sum(pid in {r[0] for r in res} for (_, pid), res in zip(pairs, results))
        out[name] = {"recall": hits / len(pairs), "queries": len(pairs)}
    return out


def check_kb(kb_dir: str | Path, index_dirs: list[str | Path] = (), topk: int = 3, max_queries: int = 500) -> dict:
    """Invariants of the KB in `kb_dir` and, per index directory, retrieval recall@topk.

    Index directories are opened with ``data_prep.indexing.load_searcher`` (dense or BM25,
    whatever the directory holds) over the KB's own corpus."""
    kb_dir = Path(kb_dir)
    corpus, splits = _load(kb_dir)
    out = check_invariants(corpus, splits)
    out["recall"] = {}
    for index_dir in index_dirs:
        if not Path(index_dir).is_dir():
            raise DataPrepError(f"{index_dir}: no such index directory")
        from data_prep.indexing import load_searcher

        try:
            searcher = load_searcher(index_dir, kb_dir / "corpus.jsonl")
        except (ValueError, FileNotFoundError) as e:  # e.g. an index built over another corpus
            raise DataPrepError(f"{index_dir}: cannot search this KB with it: {e}") from None
        out["recall"][str(index_dir)] = retrieval_recall(searcher, splits, topk, max_queries)
    out["ok"] = not out["problems"]
    return out


def format_report(r: dict, topk: int = 3) -> str:
    lines = [
        f"passages: {r['passages']} (words per passage min {r['passage_words']['min']}, "
        f"mean {r['passage_words']['mean']}, max {r['passage_words']['max']})",
    ]
    for split in ("train", "test"):
        kinds = ", ".join(f"{k} {v}" for k, v in r[split].items() if k != "questions")
        lines.append(f"{split}: {r[split]['questions']} questions ({kinds})")
    lines += [
        f"answer in support passages: {r['answer_in_support']:.2%}",
        f"hop answer in its hop passage: {r['hop_answer_in_passage']:.2%}",
        f"every alias in support (informational): {r['every_alias_in_support']:.2%}",
        f"test questions shared with train: {r['shared_questions']}",
    ]
    if "with_namesakes" in r:
        lines.append("questions with a hop whose name has namesakes: "
                     + ", ".join(f"{s} {n}" for s, n in r["with_namesakes"].items()))
    for index, rec in r["recall"].items():
        for name, v in rec.items():
            lines.append(f"recall@{topk} {name} [{index}]: {v['recall']:.3f} ({v['queries']} queries)")
    if r["problems"]:
        lines.append(f"PROBLEMS ({len(r['problems'])}):")
        lines += [f"  {p}" for p in r["problems"][:20]]
    return "\n".join(lines)
