"""How much room a knowledge base leaves above imitation: agent EM of two scripted search
strategies on its questions, side by side, through the real retriever.

- **name only**: each hop searches the row's `hop_queries`, the entity's name and what is
  asked ("Orla Venn birth year"): what the demonstrations search (`agent-rl-prep demos` plans
  its queries from them), what a user would script;
- **name + attribute**: the row's `attribute_queries`, the same query with the attribute the
  question gives to tell the person from namesakes ("Orla Venn Varnholt birth year": the
  `lookalike` kind; on the standard kind both are the same queries).

Each scripted policy searches hop by hop, a later hop's query built from what the earlier one
read (the founder's name a first search found, in place of the row's own hop answer); it reads
the top passage with `data_prep.synthetic.read_fact` (a passage's first sentences, whatever
entity it is about: a namesake's passage gives the namesake's year) and answers the last hop's
fact, or for a comparison the entity whose year is earlier. Agent EM is the reward's EM of that
answer against the golden answers. So the gap between the two is what searching better is
worth where reading is perfect; SFT on the demonstrations imitates the first, RL can find the
second.

    python benchmarks/kb_headroom.py --kind lookalike --kb-seed 7

The KB is generated (or reused) under --workdir, a flat index with the default encoder is
built beside it (the benchmarks' retriever: `agent_rl/demo/stages.py`'s dense index), and
served in its own process; one retriever call per hop for all questions at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
from data_prep.hardware import offline_env  # noqa: E402
from benchmarks import records  # noqa: E402
from benchmarks.strategy import QUERY_COLUMNS  # noqa: E402

offline_env()
KINDS = ("single", "bridge", "comparison")
DEV_KB_SEED = 7
"""The development seed of the lookalike kind: every design choice of the kind was made on it."""
BAR = 15.0
"""Points of agent EM the better strategy must lead by (issue 85)."""


def _lst(v) -> list[str]:
    return [str(x) for x in v]


def _entities(queries: list[str]) -> list[str]:
    """A comparison's two entities: its hop queries less the words they end with
    ("Ann Lee birth year", "Bo Li birth year" -> "Ann Lee", "Bo Li")."""
    words = [q.split() for q in queries]
    k = min(len(os.path.commonprefix([w[::-1] for w in words])), min(map(len, words)) - 1)
    return [" ".join(w[:len(w) - k]) for w in words]


def earlier(entities: list[str], years: list[str | None]) -> str | None:
    """The entity of the earlier year (the first on a tie); with one year unread, the entity
    whose year was read; None with neither."""
    known = [(int(y), i) for i, y in enumerate(years) if y is not None and y.isdigit()]
    return entities[min(known)[1]] if known else None


async def play(rows: list[dict], column: str, search, topk: int = 1) -> list[dict]:
    """One scripted policy over `rows`: per row {answer, queries, top_ids} (see the module
    docstring). `search(queries, topk)` is async and answers one list per query (None for a
    query the retriever rejected); the rows' `column` holds each hop's query, `hop_queries`
    where the row has no such column."""
    from data_prep.synthetic import hop_facts, read_fact
    from agent_rl.rollout.observation import split_passage

    plans = [(_lst(r.get(column) if r.get(column) is not None else r["hop_queries"]), _lst(r["hop_answers"]),
              hop_facts(str(r["relation"]))) for r in rows]
    state = [{"answer": None, "queries": [], "top_ids": [], "read": []} for _ in rows]
    for hop in range(max((len(p[0]) for p in plans), default=0)):
        asked: dict[int, str] = {}
        for i, ((queries, answers, _), s) in enumerate(zip(plans, state)):
            if hop >= len(queries):
                continue
            q = queries[hop]
            if hop and str(rows[i]["kind"]) == "bridge":  # built from what the first hop read
                if s["read"][-1] is None:
                    continue
                q = q.replace(answers[hop - 1], s["read"][-1])
            asked[i] = q
        got = await search(list(dict.fromkeys(asked.values())), topk)
        for i, q in asked.items():
            docs, fact = got[q] or [], plans[i][2][hop]
            state[i]["queries"].append(q)
            state[i]["top_ids"].append(docs[0].document.id if docs else None)
            state[i]["read"].append(next((v for d in docs if (v := read_fact(fact, split_passage(d)[1])) is not None), None))
    for r, s in zip(rows, state):
        if str(r["kind"]) == "comparison":
            s["answer"] = earlier(_entities(_lst(r["hop_queries"])), s["read"]) if len(s["read"]) == 2 else None
        elif len(s["read"]) == len(_lst(r["hop_queries"])):
            s["answer"] = s["read"][-1]
    return state


def tally(rows: list[dict], outcomes: dict[str, list[dict]]) -> dict:
    """{kind or "all": {questions, with_namesakes, <strategy>: agent EM in points, gap}} plus,
    per strategy, how often a hop whose name has namesakes retrieved its support passage first."""
    from agent_rl.rollout.reward import em

    names = list(outcomes)
    out: dict = {}
    for group in (*KINDS, "all"):
        idx = [i for i, r in enumerate(rows) if group in ("all", str(r["kind"]))]
        if not idx:
            continue
        t = {"questions": len(idx),
             "with_namesakes": sum(int(max(r.get("namesakes") if r.get("namesakes") is not None else [1])) > 1
                                   for r in (rows[i] for i in idx))}
        for name in names:
            t[name] = 100.0 * sum(em(outcomes[name][i]["answer"] or "", _lst(rows[i]["golden_answers"]))
                                  for i in idx) / len(idx)
        t["gap"] = t[names[1]] - t[names[0]]
        out[group] = t
    hops = {}
    for name in names:
        hit = n = 0
        for r, o in zip(rows, outcomes[name]):
            for k, (pid, top) in enumerate(zip(_lst(r["support_ids"]), o["top_ids"])):
                if r.get("namesakes") is not None and int(r["namesakes"][k]) > 1:
                    n += 1
                    hit += pid == top
        hops[name] = {"hops": n, "support_first": hit / n if n else None}
    out["namesake_hops"] = hops
    return out


def table(split: str, t: dict) -> str:
    names = list(QUERY_COLUMNS)
    lines = [f"{split}: agent EM of the scripted strategies (points)", "",
             f"| kind | questions | with namesakes | {names[0]} (demos) | {names[1]} | gap |", "|---|---|---|---|---|---|"]
    for group in (*KINDS, "all"):
        if group in t:
            r = t[group]
            lines.append(f"| {group} | {r['questions']} | {r['with_namesakes']} | {r[names[0]]:.1f} | "
                         f"{r[names[1]]:.1f} | {r['gap']:+.1f} |")
    h = t["namesake_hops"]
    if h[names[0]]["hops"]:
        lines.append("")
        lines.append(f"hops whose name has namesakes ({h[names[0]]['hops']}): support passage first "
                     + ", ".join(f"{n} {h[n]['support_first']:.3f}" for n in names))
    return "\n".join(lines)


def prepare_kb(args) -> tuple[Path, dict]:
    """The KB directory and its kb_meta.json: `--kb`, or generated under the work dir (reused
    when a finished one of the same seed, kind and sizes is there)."""
    from data_prep.synthetic import generate_kb, kb_finished

    if args.kb:
        kb = Path(args.kb)
        return kb, json.loads((kb / "kb_meta.json").read_text())
    kb = Path(args.workdir) / "kb"
    asked = Path(args.workdir) / "kb_settings.json"  # what the KB there was generated with
    want = {"seed": args.kb_seed, "entities": args.entities, "train": args.train, "test": args.test, "kind": args.kind}
    if kb_finished(kb):
        have = json.loads(asked.read_text()) if asked.is_file() else None
        if have != want:
            raise SystemExit(f"{kb} holds another knowledge base ({have}); choose another --workdir")
    else:
        generate_kb(kb, seed=args.kb_seed, n_entities=args.entities, n_train=args.train, n_test=args.test,
                    kind=args.kind)
        asked.write_text(json.dumps(want) + "\n")
    return kb, json.loads((kb / "kb_meta.json").read_text())


async def measure(rows_by_split: dict[str, list[dict]], url: str, topk: int) -> dict:
    from agent_rl.coldstart.demos import fetch_results
    from agent_rl.rollout.retrieval_client import RetrieverClient

    client = RetrieverClient(url, timeout=120.0)
    try:
        search = lambda qs, k: fetch_results(client.search, qs, k)  # noqa: E731
        return {split: tally(rows, {name: await play(rows, col, search, topk) for name, col in QUERY_COLUMNS.items()})
                for split, rows in rows_by_split.items()}
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="e.g. python benchmarks/kb_headroom.py --kind lookalike --kb-seed 7")
    ap.add_argument("--kind", default="lookalike", choices=("standard", "lookalike"), help="KB kind (default lookalike)")
    ap.add_argument("--kb-seed", type=int, default=DEV_KB_SEED, help=f"KB seed (default {DEV_KB_SEED}, the dev KB)")
    ap.add_argument("--entities", type=int, default=2000, help="KB entities (default 2000, as `synthetic`)")
    ap.add_argument("--train", type=int, default=5000, help="KB train questions (default 5000)")
    ap.add_argument("--test", type=int, default=500, help="KB test questions (default 500)")
    ap.add_argument("--kb", help="an existing KB directory instead (its kb_meta.json says the kind)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--index", help="index dir over the KB's corpus (default WORKDIR/kb_index_flat, or "
                                       "<KB>_index_flat beside --kb; a flat "
                                       "index with the default encoder is built there when missing)")
    where.add_argument("--retriever-url", help="a running retriever over the KB's corpus instead")
    ap.add_argument("--splits", nargs="+", default=["test", "train"], choices=("train", "test"))
    ap.add_argument("--config", default=str(ROOT / "configs/train/demo_grpo_cpu.yaml"),
                    help="training YAML whose retriever.topk the policies search with (default: the benchmarks')")
    ap.add_argument("--workdir", help="default runs/kb_headroom/<kind>_kb<seed>_e<entities>")
    ap.add_argument("--json", help="also write the result here")
    records.add_args(ap)
    args = ap.parse_args(argv)
    args.workdir = args.workdir or str(ROOT / "runs" / "kb_headroom" / f"{args.kind}_kb{args.kb_seed}_e{args.entities}")

    import pandas as pd

    from agent_rl.config import TrainConfig, load_config
    from benchmarks.kb_server import serve_index
    from data_prep.hardware import hardware_line

    host = hardware_line()
    print(host, flush=True)
    t0 = time.time()
    topk = load_config(TrainConfig, args.config).retriever.topk
    kb, meta = prepare_kb(args)
    kind = meta.get("kb_kind", "standard")
    rows = {s: pd.read_parquet(kb / f"{s}.parquet").to_dict("records") for s in args.splits}
    # beside its KB: a --kb of its own never meets the work dir's index of another corpus
    index = Path(args.index) if args.index else kb.with_name(f"{kb.name}_index_flat") if args.kb \
        else Path(args.workdir) / "kb_index_flat"
    served = nullcontext(args.retriever_url) if args.retriever_url else serve_index(index, kb / "corpus.jsonl", kind="flat")
    with served as url:
        t_ready = time.time()
        res = asyncio.run(measure(rows, url, topk))
    print(f"KB {kb} (kind {kind}, seed {meta['seed']}, {meta['entities']} entities, {meta['passages']} passages); "
          f"top-{topk} passage per search, read by data_prep.synthetic.read_fact; KB, index and server "
          f"{t_ready - t0:.0f}s, the policies {time.time() - t_ready:.0f}s")
    for split, t in res.items():
        print()
        print(table(split, t))
    print()
    for split, t in res.items():
        gap = t["all"]["gap"]
        print(f"bar ({BAR:.0f} points, name + attribute over name only) on {split}: "
              f"{'met' if gap >= BAR else 'not met'} ({gap:+.1f})")
    out = {"host": host, "kb": str(kb), "kind": kind, "kb_seed": meta["seed"], "entities": meta["entities"],
           "topk": topk, "splits": res, "bar": BAR}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    records.keep(args, "kb_headroom", out, default_dir=Path(args.workdir))
    return out


if __name__ == "__main__":
    main()
