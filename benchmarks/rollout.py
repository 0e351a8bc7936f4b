"""Rollout throughput: tool-interleaved trajectories vs plain generation vs batch-per-turn.

    python benchmarks/rollout.py [--quick] [--json PATH] [--tool-latency-ms 20-200]

One engine, one retriever server, measured side by side in one run (absolute numbers drift on
shared machines; the ratios are the result), after one untimed interleaved pass that warms the
engine up; `--repeats R` measures R rounds and reports the median of each number:

- interleaved: `agent_rl.rollout.manager.RolloutManager` — one coroutine per trajectory, tool calls
  overlap generation, more trajectories in flight than engine batch slots.
- plain: the same number of prompts, each generating as many tokens as its interleaved
  trajectory sampled (ignore_eos), all in one batch: the engine's limit (ratio 1.0).
- plain_prefill (a diagnostic): as plain, but each prompt also carries its trajectory's
  observation and feedback tokens, so the engine does the same prefill and the same decoding
  without turn boundaries: plain vs plain_prefill is the cost of prefilling observations,
  plain_prefill vs interleaved the cost of the turn boundaries (tool waits, re-scheduling).
- batch_per_turn: Search-R1's loop (`run_llm_loop`): every active sequence generates, the
  whole batch waits for the slowest; then all searches go out as ONE batched request; then
  the next turn. Written here, on the same engine, prompts, retriever and stop strings.

plain_prefill is what a perfect scheduler would reach (same prefill, same decoding, no turn
boundaries), so the table also prints the bounds plain_prefill/plain and
plain_prefill/batch_per_turn, and how long batch_per_turn waited on tools.

Every search goes to the real retriever (BM25 over the generated knowledge base) plus an
added latency drawn uniformly from --tool-latency-ms (one draw per request). The untrained
model rarely writes tags from the bare Search-R1 instruction, so prompts carry three
demonstrations in the same format before the instruction (`--prompt search_r1` drops them);
the table reports how many searches really ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads

DEMOS = [
    ("In which city was Tomas Verlin born?", "Tomas Verlin", "Tomas Verlin was born in Kradholt in 1901.", "Kradholt"),
    ("Who founded Brelmar Labs?", "Brelmar Labs", "Brelmar Labs was founded by Ana Quist in 1950.", "Ana Quist"),
    ("When was Soreth Press founded?", "Soreth Press", "Soreth Press is a publishing house founded in 1820.", "1820"),
]


@dataclass
class Item:
    question: str
    golden_answers: list
    data_source: str
    prompt_ids: list


class LatencyRetriever:
    """The real client plus an added latency per request (a remote search service)."""

    def __init__(self, client, lo_ms: float, hi_ms: float, seed: int = 0):
        self.client, self.lo, self.hi = client, lo_ms / 1000, hi_ms / 1000
        self.rng = random.Random(seed)
        self.requests = self.queries = 0

    async def search(self, queries, topk):
        self.requests += 1
        self.queries += len(queries)
        await asyncio.sleep(self.rng.uniform(self.lo, self.hi))
        return await self.client.search(queries, topk)


def build_items(tokenizer, questions, prompt_kind: str) -> list[Item]:
    from agent_rl.rollout import observation
    from agent_rl.rollout.protocol import SEARCH_R1 as P

    demo = ""
    if prompt_kind == "few_shot":
        demo = "".join(
            f"Question: {q}\n<search> {s} </search>{observation.format_observation(f'Doc 1(Title: {s}) {d}')}<answer> {a} </answer>\n\n"
            for q, s, d, a in DEMOS
        )
    items = []
    for q, golds, src in questions:
        if prompt_kind == "chat":  # the training template: what an SFT checkpoint was trained on
            ids = P.prompt_ids(tokenizer, q, template="chat", mode="agent")
        else:
            ids = tokenizer.encode(demo + P.prompt_text(q, "agent"))
        items.append(Item(q, golds, src, ids))
    return items


async def batch_per_turn(engine, tokenizer, retriever, items, cfg, sampling) -> tuple[int, float, int, dict]:
    """Search-R1's synchronous loop on our engine; returns (sampled tokens, seconds, searches,
    breakdown): the breakdown splits the wall time into generation and tool waits and gives
    the sequences active at each turn."""
    from dataclasses import replace

    from agent_rl.rollout import observation
    from agent_rl.rollout.observation import format_passages
    from agent_rl.rollout.protocol import SEARCH_R1 as P
    from agent_rl.rollout.protocol import encode_text

    max_turns, budget = cfg.max_turns, cfg.data.max_response_length
    ctx = [list(it.prompt_ids) for it in items]
    resp_len = [0] * len(items)
    active = list(range(len(items)))
    sampled = searches = 0
    gen_s = tool_s = 0.0
    active_by_turn = []
    t0 = time.perf_counter()
    for turn in range(max_turns + 1):
        active = [i for i in active if resp_len[i] < budget]
        if not active:
            break
        active_by_turn.append(len(active))
        tg = time.perf_counter()
        outs = await asyncio.gather(*(
            engine.generate(ctx[i], replace(sampling, max_tokens=min(sampling.max_tokens, budget - resp_len[i])))
            for i in active
        ))
        gen_s += time.perf_counter() - tg
        queries, next_active = [], []
        for i, out in zip(active, outs):
            ctx[i] += out.token_ids
            resp_len[i] += len(out.token_ids)
            sampled += len(out.token_ids)
            action = P.parse(out.text)
            if action.kind == "answer" or turn == max_turns:
                continue
            next_active.append(i)
            queries.append((i, action.query) if action.kind == "tool" else (i, None))
        real = [(i, q) for i, q in queries if q is not None]
        tt = time.perf_counter()
        try:  # one batched request per turn, as Search-R1's batch_search
            texts = [format_passages(r) for r in await retriever.search([q for _, q in real], cfg.retriever.topk)] if real else []
        except Exception:  # noqa: BLE001 - same recovery as the manager: error observations
            texts = [observation.SEARCH_ERROR_TEXT] * len(real)
        tool_s += time.perf_counter() - tt
        searches += len(real)
        obs = {i: observation.tool_observation(tokenizer, t, cfg.data.max_obs_length).ids for (i, _), t in zip(real, texts)}
        for i, q in queries:
            add = obs[i] if q is not None else encode_text(tokenizer, P.feedback(action))
            add = add[: budget - resp_len[i]]
            ctx[i] += add
            resp_len[i] += len(add)
        active = next_active
    return sampled, time.perf_counter() - t0, searches, dict(gen_s=gen_s, tool_s=tool_s, active_by_turn=active_by_turn)


async def interleaved(engine, client, lo, hi, cfg, tok, items, seed: int):
    """The manager's rollout of `items` from an empty prefix cache; (trajectories, metrics,
    retriever, seconds)."""
    from agent_rl.rollout.manager import RolloutManager

    await engine.reset_prefix_cache()
    ret = LatencyRetriever(client, lo, hi, seed=seed)
    mgr = RolloutManager(engine, ret, cfg, tokenizer=tok)
    t0 = time.perf_counter()
    trajs, metrics = await mgr.rollout(items, n=1)
    return trajs, metrics, ret, time.perf_counter() - t0


async def plain(engine, prompts: list[list[int]], counts: list[int]) -> tuple[int, float]:
    """All `prompts` in one batch from an empty prefix cache, each generating exactly its
    count of tokens; (tokens generated, seconds)."""
    from agent_rl.rollout.engine import Sampling

    await engine.reset_prefix_cache()
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(
        engine.generate(p, Sampling(max_tokens=max(1, c), stop=(), ignore_eos=True)) for p, c in zip(prompts, counts)
    ))
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - t0


async def measure_round(engine, client, lo, hi, cfg, tok, items, sampling, seed: int) -> dict:
    """One measurement of the four modes, in this order, each from an empty prefix cache."""
    res = {}
    trajs, metrics, ret, t_int = await interleaved(engine, client, lo, hi, cfg, tok, items, seed)
    tok_int = sum(sum(t.loss_mask) for t in trajs)
    res.update(interleaved_tok_s=tok_int / t_int, interleaved_tokens=tok_int, interleaved_s=t_int,
               interleaved_searches=ret.queries, searches_per_trajectory=metrics["rollout/searches_mean"],
               turns_mean=metrics["rollout/turns_mean"], valid_action_rate=metrics["rollout/valid_action_rate"])

    counts = [sum(t.loss_mask) for t in trajs]
    tok_plain, t_plain = await plain(engine, [it.prompt_ids for it in items], counts)
    res.update(plain_tok_s=tok_plain / t_plain, plain_tokens=tok_plain, plain_s=t_plain)

    observed = [it.prompt_ids + [x for x, m in zip(t.response_ids, t.loss_mask) if not m] for it, t in zip(items, trajs)]
    tok_pp, t_pp = await plain(engine, observed, counts)
    res.update(plain_prefill_tok_s=tok_pp / t_pp, plain_prefill_s=t_pp,
               observation_tokens=sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs))

    await engine.reset_prefix_cache()
    ret_b = LatencyRetriever(client, lo, hi, seed=seed)
    tok_b, t_b, s_b, parts = await batch_per_turn(engine, tok, ret_b, items, cfg, sampling)
    res.update(batch_per_turn_tok_s=tok_b / t_b, batch_per_turn_tokens=tok_b, batch_per_turn_s=t_b,
               batch_per_turn_searches=s_b, batch_per_turn_tool_s=parts["tool_s"],
               batch_per_turn_gen_s=parts["gen_s"], batch_per_turn_active_by_turn=parts["active_by_turn"])

    res["ratio_to_plain"] = res["interleaved_tok_s"] / res["plain_tok_s"]
    res["ratio_to_batch_per_turn"] = res["interleaved_tok_s"] / res["batch_per_turn_tok_s"]
    res["ratio_to_plain_prefill"] = res["interleaved_tok_s"] / res["plain_prefill_tok_s"]
    # What any scheduler could reach on this engine: plain_prefill does the same prefill and
    # decoding with no turn boundaries at all (no tool waits, one full batch), so it bounds
    # interleaved from above; the bounds are the ratios a perfect scheduler would score.
    res["bound_ratio_to_plain"] = res["plain_prefill_tok_s"] / res["plain_tok_s"]
    res["bound_ratio_to_batch_per_turn"] = res["plain_prefill_tok_s"] / res["batch_per_turn_tok_s"]
    print(f"round {seed}: " + ", ".join(f"{k}={res[k]:.3f}" for k in ("ratio_to_plain", "ratio_to_batch_per_turn",
                                                                    "ratio_to_plain_prefill")), flush=True)
    return res


def median_round(rounds: list[dict]) -> dict:
    """Per key, the median over rounds of the numbers (ratios are medians of per-round
    ratios, not ratios of medians); the other values from the median-ratio_to_plain round."""
    import statistics

    order = sorted(rounds, key=lambda r: r["ratio_to_plain"])
    out = dict(order[len(order) // 2])
    for k, v in rounds[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in rounds)
    return out


async def main_async(args) -> dict:
    import pandas as pd

    from agent_rl.config import TrainConfig
    from agent_rl.rollout.engine import RolloutEngine, Sampling
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from benchmarks.kb_server import kb_retriever

    lo, hi = (float(x) for x in args.tool_latency_ms.split("-"))
    cfg = TrainConfig()
    cfg.max_turns = args.max_turns
    cfg.data.max_response_length = args.max_response_length
    r = cfg.actor_rollout_ref.rollout
    r.dtype, r.max_num_seqs, r.max_tokens_per_turn = args.dtype, args.max_num_seqs, args.max_tokens_per_turn
    r.max_concurrent_trajectories, r.enable_prefix_caching = args.in_flight, not args.no_prefix_caching
    r.chat_template, r.temperature = args.prompt == "chat", args.temperature
    if args.gpu_memory_utilization is not None:
        r.gpu_memory_utilization = args.gpu_memory_utilization

    with kb_retriever("bench-rollout-") as (tmp, url):
        client = RetrieverClient(url, timeout=30.0)
        model = args.model or str(ROOT / cfg.actor_rollout_ref.model.path)
        engine = await RolloutEngine.create(model, r, max_model_len=4096)
        tok = engine.get_tokenizer()
        df = pd.read_parquet(tmp / "kb" / "train.parquet")
        rows = [(q, list(g), s) for q, g, s in zip(df.question, df.golden_answers, df.data_source)]
        rows = (rows * (1 + args.trajectories // max(1, len(rows))))[: args.trajectories]
        items = build_items(tok, rows, args.prompt)
        sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens_per_turn)

        # Warm-up: one untimed pass of the interleaved rollout. The engine's CPU kernels are
        # prepared per batch shape on first use; a short warm-up left the mode measured first
        # ~10% slower (interleaved/plain_prefill 0.85 first vs 0.95 second, same engine).
        await interleaved(engine, client, lo, hi, cfg, tok, items, seed=99)
        rounds = [await measure_round(engine, client, lo, hi, cfg, tok, items, sampling, seed=k)
                  for k in range(args.repeats)]
        res = median_round(rounds)
        res["rounds"] = rounds

        # decode throughput by batch size: how much a shrinking batch (batch-per-turn) loses here
        scaling = {}
        for b in (1, 8, 64):
            n, secs = await plain(engine, [it.prompt_ids for it in (items * (1 + b // len(items)))[:b]], [64] * b)
            scaling[b] = n / secs
        res["plain_tok_s_by_batch"] = scaling

        res["settings"] = dict(trajectories=args.trajectories, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                               in_flight=args.in_flight, prefix_caching=not args.no_prefix_caching,
                               max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn,
                               max_response_length=args.max_response_length, tool_latency_ms=args.tool_latency_ms,
                               prompt=args.prompt, engine_mode=r.engine_mode, temperature=args.temperature,
                               repeats=args.repeats, gpu_memory_utilization=r.gpu_memory_utilization)
        await engine.shutdown()
        await client.aclose()
        return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 trajectories, short turns (a smoke run)")
    ap.add_argument("--model", default=None, help="policy (default: the embedded model; an SFT checkpoint "
                                                   "follows the format, so its turns are searches, not feedback)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tool-latency-ms", default="20-200", help="added latency per retriever request, LO-HI ms")
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="measurement rounds after the warm-up; the table "
                                                          "gives the median of each number")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens-per-turn", type=int, default=64)
    ap.add_argument("--max-response-length", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=64, help="engine batch slots")
    ap.add_argument("--in-flight", type=int, default=128, help="trajectories in flight")
    ap.add_argument("--dtype", default="auto", help="engine dtype (auto: bfloat16 where native, else float32)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (lower: more searches)")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="the engine's share of a GPU (default: the config's); lower it to run beside another engine")
    ap.add_argument("--prompt", choices=["few_shot", "search_r1", "chat"], default="few_shot",
                    help="few_shot: three examples before the instruction (the untrained model); search_r1: the "
                         "bare instruction; chat: the training chat template (use with an SFT --model)")
    records.add_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.trajectories, args.max_turns, args.max_tokens_per_turn, args.max_response_length = 16, 2, 32, 256
    res = asyncio.run(main_async(args))
    print(f"\nrollout benchmark ({res['settings']})")
    print(f"{'mode':<16}{'tokens':>8}{'seconds':>9}{'tok/s':>9}{'searches':>10}")
    print(f"{'interleaved':<16}{res['interleaved_tokens']:>8.0f}{res['interleaved_s']:>9.2f}{res['interleaved_tok_s']:>9.1f}{res['interleaved_searches']:>10.0f}")
    print(f"{'plain':<16}{res['plain_tokens']:>8.0f}{res['plain_s']:>9.2f}{res['plain_tok_s']:>9.1f}{'-':>10}")
    print(f"{'plain_prefill':<16}{res['plain_tokens']:>8.0f}{res['plain_prefill_s']:>9.2f}{res['plain_prefill_tok_s']:>9.1f}{'-':>10}")
    print(f"{'batch_per_turn':<16}{res['batch_per_turn_tokens']:>8.0f}{res['batch_per_turn_s']:>9.2f}{res['batch_per_turn_tok_s']:>9.1f}{res['batch_per_turn_searches']:>10.0f}")
    print(f"ratio_to_plain={res['ratio_to_plain']:.3f}  ratio_to_batch_per_turn={res['ratio_to_batch_per_turn']:.3f}  "
          f"ratio_to_plain_prefill={res['ratio_to_plain_prefill']:.3f}  "
          f"(observation/feedback tokens prefilled: {res['observation_tokens']:.0f}; valid actions "
          f"{res['valid_action_rate']:.0%}, turns {res['turns_mean']:.2f}/trajectory)")
    print(f"bounds (a perfect scheduler = plain_prefill): ratio_to_plain <= {res['bound_ratio_to_plain']:.3f}, "
          f"ratio_to_batch_per_turn <= {res['bound_ratio_to_batch_per_turn']:.3f}")
    print(f"batch_per_turn: {res['batch_per_turn_gen_s']:.2f} s generating, {res['batch_per_turn_tool_s']:.2f} s "
          f"waiting on tools ({res['batch_per_turn_tool_s'] / res['batch_per_turn_s']:.1%}); sequences active by "
          f"turn {res['batch_per_turn_active_by_turn']}")
    print("plain decoding tok/s by batch size (64 tokens each): "
          + ", ".join(f"batch {b}: {v:.0f}" for b, v in res["plain_tok_s_by_batch"].items()))
    if args.json:
        from agent_rl.rollout.engine import engine_dtype
        from data_prep.hardware import hardware_info

        res["hardware"] = hardware_info(engine=" ".join(engine_dtype(args.dtype)))
        Path(args.json).write_text(json.dumps(res, indent=2))
    records.keep(args, "rollout", res)


if __name__ == "__main__":
    main()
