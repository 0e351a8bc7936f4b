"""Does the cold start work? Format and reward variance of a policy before and after SFT (not in CI).

    python benchmarks/cold_start.py --model artifacts/model runs/sft/demo_cpu [--limit 100] [--n 5] [--json PATH]

For each model, on the knowledge base's held-out questions (a seeded sample), with the real
vLLM engine, the real retriever and the rollout manager and reward of training:
- greedy: EM (Wilson 95% interval) and Search-R1's strict format check;
- `--n` samples per question at temperature 1, as a GRPO group:
  - `first_turn_well_formed`: the model's first turn (before any invalid-action feedback
    could be parroted) contains a closed `<search>…</search>` or `<answer>…</answer>`;
  - `no_invalid_answered`: no turn needed the invalid-action feedback and the trajectory
    ended with an answer (the strictest reading of "follows the format");
  - `valid_format`, `em`: the reward's format check and exact match;
  - `groups_nonzero_var`: share of groups whose rewards differ (what GRPO learns from).
Settings (template, topk, lengths, max_turns) come from `--config` plus `key=value` overrides,
the same as training. Without `--retriever-url` the KB's flat index is served (and built when
missing) for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
from benchmarks import records  # noqa: E402

CLOSED = re.compile(r"<(search|answer)>.*?</\1>", re.DOTALL)


def sampled_turns(t, tokenizer) -> list[str]:
    """The model's own turns of a trajectory (runs of loss-mask-1 tokens), decoded."""
    turns, cur = [], []
    for tok, m in zip(t.response_ids, t.loss_mask):
        if m:
            cur.append(tok)
        elif cur:
            turns.append(cur)
            cur = []
    turns += [cur] if cur else []
    return [tokenizer.decode(x, skip_special_tokens=True) for x in turns]


def share(xs) -> float:
    xs = list(xs)
    return sum(map(bool, xs)) / max(1, len(xs))


async def measure(model: str, url: str, args: argparse.Namespace) -> dict:
    import torch

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.evaluation.evaluate import resolve_model_dir
    from agent_rl.evaluation.report import wilson_interval
    from agent_rl.rollout.engine import RolloutEngine
    from agent_rl.rollout.manager import RolloutManager
    from agent_rl.rollout.retrieval_client import RetrieverClient
    from agent_rl.rollout.reward import score_trajectory
    from agent_rl.training.algos.filtering import filter_groups
    from agent_rl.training.data import load_prompts

    model_dir = str(resolve_model_dir(model))
    cfg = load_config(TrainConfig, args.config, [*args.overrides, f"retriever.url=[{url}]"])
    prompts = load_prompts([args.qa])
    random.Random(args.seed).shuffle(prompts)
    prompts = prompts[: args.limit]
    engine = await RolloutEngine.create(model_dir, cfg.actor_rollout_ref.rollout,
                                        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length)
    client = RetrieverClient(url)
    try:
        mgr = RolloutManager(engine, client, cfg)
        t0 = time.time()
        greedy, _ = await mgr.rollout(prompts, n=1, greedy=True)
        g = [score_trajectory(t, p.golden_answers, cfg.reward) for t, p in zip(greedy, prompts)]
        em = sum(r.metric for r in g)
        out = {"model": model, "questions": len(prompts), "n": args.n,
               "greedy_em": em / len(g), "greedy_em_ci": list(wilson_interval(em, len(g))),
               "greedy_valid_format": share(r.valid_format for r in g), "greedy_s": round(time.time() - t0, 1)}
        t0 = time.time()
        sampled, metrics = await mgr.rollout(prompts, n=args.n, greedy=False)
        res = [score_trajectory(t, prompts[t.group_id].golden_answers, cfg.reward) for t in sampled]
        turns = [sampled_turns(t, mgr.tokenizer) for t in sampled]
        scores = torch.tensor([r.score for r in res])
        group_ids = [t.group_id for t in sampled]
        groups: dict[int, list[float]] = {}
        for g, r in zip(group_ids, res):
            groups.setdefault(g, []).append(r.score)
        out.update({
            "first_turn_well_formed": share(bool(ts) and CLOSED.search(ts[0]) for ts in turns),
            "no_invalid_answered": share(t.num_invalid == 0 and t.finish_reason == "answer" for t in sampled),
            "valid_format": share(r.valid_format for r in res),
            "em": sum(r.metric for r in res) / len(res),
            # the trainer's own rule for a group with signal (DAPO's dynamic-sampling filter)
            "groups_nonzero_var": filter_groups(scores, group_ids).metrics["frac_groups_kept"],
            "groups_all_zero": share(max(v) == 0 for v in groups.values()),
            "searches_mean": metrics["rollout/searches_mean"],
            "sampled_s": round(time.time() - t0, 1),
        })
        return out
    finally:
        await engine.shutdown()
        await client.aclose()


COLUMNS = [("greedy_em", "greedy EM"), ("greedy_valid_format", "greedy valid fmt"),
           ("first_turn_well_formed", "T=1 1st turn well-formed"), ("no_invalid_answered", "T=1 no invalid + answer"),
           ("valid_format", "T=1 valid fmt"), ("em", "T=1 EM"), ("groups_nonzero_var", "groups var>0"),
           ("groups_all_zero", "groups all 0"), ("searches_mean", "searches")]


def table(rows: list[dict]) -> str:
    lines = ["| model | " + " | ".join(c for _, c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(f"{r[k]:.3f}" for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", required=True, help="HF dirs or agent-rl-sft run dirs, measured in turn")
    ap.add_argument("--retriever-url", default=None, help="a running retriever (default: serve the KB's flat index)")
    ap.add_argument("--qa", default=str(ROOT / "artifacts/kb/test.parquet"), help="held-out questions")
    ap.add_argument("--kb", default=str(ROOT / "artifacts/kb"), help="KB dir (without --retriever-url)")
    ap.add_argument("--index", default=str(ROOT / "artifacts/kb_index_flat"), help="flat index (without --retriever-url)")
    ap.add_argument("--config", default=str(ROOT / "configs/train/demo_grpo_cpu.yaml"), help="training config")
    ap.add_argument("--limit", type=int, default=100, help="questions (seeded sample; default 100)")
    ap.add_argument("--n", type=int, default=5, help="samples per question at temperature 1 (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    records.add_args(ap)
    args = ap.parse_args(argv)
    from data_prep.hardware import offline_env

    offline_env()

    from contextlib import nullcontext

    from benchmarks.kb_server import serve_index

    rows = []
    served = (nullcontext(args.retriever_url) if args.retriever_url
              else serve_index(Path(args.index), Path(args.kb) / "corpus.jsonl"))
    with served as url:
        for m in args.model:
            rows.append(asyncio.run(measure(m, url, args)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nCold start on {args.qa} ({rows[0]['questions']} questions, {args.n} samples each at T=1)\n")
    print(table(rows))
    if args.json:
        from data_prep.hardware import hardware_info

        Path(args.json).write_text(json.dumps({"hardware": hardware_info(), "rows": rows}, indent=1) + "\n")
    records.keep(args, "cold_start", {"rows": rows})
    return 0


if __name__ == "__main__":  # vLLM starts processes with spawn: guard the entry point
    sys.exit(main())
