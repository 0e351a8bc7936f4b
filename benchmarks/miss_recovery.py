"""After a search brings back a look-alike's passage, does the policy notice and search again?

Once SFT has stopped improving on the embedded knowledge base, what is left for RL is mostly
the questions whose search returns, at top 1, a look-alike's passage (a relative with a
near-identical name, or the same person's other passage) in place of the one a hop needs. No
demonstration shows such a miss, so SFT cannot teach what to do after one; GRPO can reward a
recovery only where the policy already samples one. This measures both, with the real
retriever and the policy's own tokens:

- **hops**: how often the knowledge base's own hop queries (what the demonstrations search
  for) return their passage at top 1, at rank 2-5, or not in the top 5;
- **after a miss**: for each question the policy's greedy first turn (think, then search), then
  each of two observations in turn: the passage that search should bring (its top hit, when
  that is a passage the question needs) and the look-alike (the best-ranked retrieved passage
  the question does not need); from each, `--samples` continuations at `--temperature` (as
  GRPO samples them): how often the policy searches again, repeats its query, and finds the
  passage the look-alike stood in for.

If the policy searches again as often after the look-alike as after the right passage, it
does not notice misses; the recovery rate times the misses' share says how often a GRPO step's
rollouts meet a rewarded recovery.

    python benchmarks/miss_recovery.py --model artifacts/demo_runs/sft --kb artifacts/kb \
        --index artifacts/kb_index_flat --questions 100 --samples 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()

CONDITIONS = ("right passage", "look-alike")
KINDS = ("single", "bridge", "comparison")


def hop_ranks(support: list[str], ranked: list[list[str]]) -> Counter:
    """Counter of each hop's rank of its support passage among the retrieved ids: 1, "2-5"
    or "missing" (not among them)."""
    out = Counter()
    for s, ids in zip(support, ranked, strict=True):
        out[1 if ids[:1] == [s] else "2-5" if s in ids else "missing"] += 1
    return out


def look_alike(ranked: list[str], needed: set[str]) -> int | None:
    """Index of the best-ranked retrieved passage the question does not need, or None."""
    return next((i for i, d in enumerate(ranked) if d not in needed), None)


def next_search(text: str) -> str | None:
    """The query of a continuation's first action when it is a search (the rollout's own parse,
    `SEARCH_R1.parse`); None when it answers first or does neither."""
    from agent_rl.rollout.protocol import SEARCH_R1

    action = SEARCH_R1.parse(text)
    return action.query if action.kind == "tool" else None


def tally(samples: list[dict]) -> dict:
    """{condition: {kind: {samples, search_again, same_query, finds_missed, finds_needed}}}
    as shares, from sample dicts (condition, kind, query, first_query, found, missed, needed):
    `found` is the second search's top hit, `missed` the passage the look-alike stood in for
    (None after the right passage), `needed` the passages the question needs."""
    out: dict = {}
    for s in samples:
        c = out.setdefault(s["condition"], {}).setdefault(s["kind"], Counter())
        c["samples"] += 1
        if s["query"] is None:
            continue
        c["search_again"] += 1
        c["same_query"] += s["query"] == s["first_query"]
        c["finds_missed"] += s["missed"] is not None and s["found"] == s["missed"]
        c["finds_needed"] += s["found"] in s["needed"]
    return {cond: {k: {"samples": c["samples"], **{m: c[m] / c["samples"] for m in
                                                   ("search_again", "same_query", "finds_missed", "finds_needed")}}
                       for k, c in by_kind.items()} for cond, by_kind in out.items()}


def table(res: dict) -> str:
    h = res["hops"]
    n = sum(h.values())
    lines = [f"Hop queries of the {res['split']} split ({n}): support passage at top 1 {h.get('1', 0) / n:.3f}, "
             f"rank 2-5 {h.get('2-5', 0) / n:.3f}, not in the top 5 {h.get('missing', 0) / n:.3f}", "",
             f"{res['questions']} questions, the policy's greedy first search, then {res['samples']} samples at "
             f"temperature {res['temperature']} from each observation:", "",
             "| observation | kind | samples | searches again | same query | finds the missed passage | finds a needed passage |",
             "|---|---|---|---|---|---|---|"]
    for cond in CONDITIONS:
        for kind in KINDS:
            r = res["after"].get(cond, {}).get(kind)
            if r:
                lines.append(f"| {cond} | {kind} | {r['samples']} | {r['search_again']:.3f} | {r['same_query']:.3f} | "
                             f"{r['finds_missed']:.3f} | {r['finds_needed']:.3f} |")
    return "\n".join(lines)


def _lst(v) -> list[str]:
    return [str(x) for x in v]


async def _search(client, queries: list[str], k: int) -> list[list]:
    """The retriever's results for `queries` in order, batched by the demonstrations' own
    fetch (`coldstart.demos.fetch_results`); a query the server rejects gets none."""
    from agent_rl.coldstart.demos import fetch_results

    got = await fetch_results(client.search, list(dict.fromkeys(queries)), k)
    return [got[q] or [] for q in queries]


async def run(args) -> dict:
    import pandas as pd

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.evaluation.evaluate import resolve_model_dir
    from agent_rl.precision import chosen_precisions
    from agent_rl.rollout.engine import RolloutEngine, Sampling
    from agent_rl.rollout.observation import encode_observation, format_passages
    from agent_rl.rollout.protocol import SEARCH_R1
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from benchmarks.kb_server import serve_index
    from data_prep.hardware import hardware_line

    cfg = load_config(TrainConfig, args.config)
    r = cfg.actor_rollout_ref.rollout
    if args.dtype:
        r.dtype = args.dtype
    if r.protocol != "search_r1":
        raise SystemExit(f"miss_recovery.py reads Search-R1's <search> turns; the config's protocol is {r.protocol!r}")
    hardware = hardware_line(engine=chosen_precisions(cfg, engine=True)["engine"])
    print(hardware, flush=True)
    kb = Path(args.kb)
    rows = pd.read_parquet(kb / f"{args.split}.parquet").to_dict("records")
    served = nullcontext(args.retriever_url) if args.retriever_url else serve_index(Path(args.index), kb / "corpus.jsonl")
    with served as url:
        client = RetrieverClient(url, timeout=120.0)
        engine = None
        try:
            support = [s for row in rows for s in _lst(row["support_ids"])]
            queries = [q for row in rows for q in _lst(row["hop_queries"])]
            ranked = [[d.document.id for d in docs] for docs in await _search(client, queries, 5)]
            hops = hop_ranks(support, ranked)

            picked = random.Random(args.seed).sample(rows, min(args.questions, len(rows)))
            engine = await RolloutEngine.create(str(resolve_model_dir(args.model)), r, max_model_len=4096)
            tok = engine.get_tokenizer()
            heads = [SEARCH_R1.prompt_ids(tok, row["question"], template=r.template, mode="agent") for row in picked]
            greedy = Sampling(temperature=0.0, max_tokens=r.max_tokens_per_turn)
            firsts = await asyncio.gather(*(engine.generate(h, greedy) for h in heads))
            items = []  # (row, prompt ids up to the observation's end, condition, first query, missed id)
            searched = [(row, h + f.token_ids, next_search(f.text)) for row, h, f in zip(picked, heads, firsts)]
            searched = [s for s in searched if s[2]]
            results = await _search(client, [q for _, _, q in searched], 5)
            for (row, ids, q), docs in zip(searched, results):
                needed = set(_lst(row["support_ids"]))
                got = [d.document.id for d in docs]
                obs = [("right passage", 0, None)] if got[:1] and got[0] in needed else []
                other = look_alike(got, needed)
                if other is not None:
                    missed = got[0] if got[0] in needed else _lst(row["support_ids"])[0]
                    obs.append(("look-alike", other, missed))
                for cond, i, missed in obs:
                    o, _ = encode_observation(tok, format_passages([docs[i]]), cfg.data.max_obs_length)
                    items.append((row, ids + o, cond, q, missed))
            sample = Sampling(temperature=args.temperature, max_tokens=r.max_tokens_per_turn)
            outs = await asyncio.gather(*(engine.generate(ids, sample) for _, ids, _, _, _ in items for _ in range(args.samples)))
            second_queries = [next_search(o.text) for o in outs]
            again = sorted({q for q in second_queries if q})
            top = {q: d[0].document.id if d else None for q, d in zip(again, await _search(client, again, 1))} if again else {}
            samples = []
            for k, (row, _, cond, q, missed) in enumerate(it for it in items for _ in range(args.samples)):
                s = second_queries[k]
                samples.append({"condition": cond, "kind": row["kind"], "query": s, "first_query": q,
                                "found": top.get(s), "missed": missed, "needed": set(_lst(row["support_ids"]))})
        finally:
            if engine is not None:
                await engine.shutdown()
            await client.aclose()
    return {"hardware": hardware, "split": args.split, "questions": len(picked), "searched_first": len(searched), "samples": args.samples,
            "temperature": args.temperature, "model": str(args.model), "hops": {str(k): v for k, v in hops.items()},
            "after": tally(samples)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model dir, run checkpoint dir, or run dir (its latest checkpoint)")
    ap.add_argument("--kb", required=True, help="knowledge base dir (agent-rl-prep synthetic --out)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="index dir over its corpus, served for the run (a flat FAISS index is built there when missing)")
    where.add_argument("--retriever-url", help="a running retriever over the knowledge base's corpus instead")
    ap.add_argument("--split", default="test", choices=("train", "test"))
    ap.add_argument("--questions", type=int, default=100, help="a seeded sample of this many questions")
    ap.add_argument("--samples", type=int, default=8, help="continuations from each observation")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the question sample")
    ap.add_argument("--config", default=str(ROOT / "configs/train/demo_grpo_cpu.yaml"),
                    help="training YAML: engine, turn and observation lengths")
    ap.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), help="engine dtype (default: the config's)")
    ap.add_argument("--json", help="also write the result here")
    records.add_args(ap)
    args = ap.parse_args(argv)
    res = asyncio.run(run(args))
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    records.keep(args, "miss_recovery", res)
    return res


if __name__ == "__main__":
    main()
