"""One cell (a KB seed x a run seed): its start, every arm from it, their evaluations on the
report questions, and the row of numbers the tables and the summary read."""

from __future__ import annotations

import json
from pathlib import Path

from agent_rl.demo.stages import Workdir
from benchmarks.rl_vs_sft.arms import matched_ran, matched_steps, run_arm, same_steps_gap, sft_lr
from benchmarks.rl_vs_sft.best import best_of_cell, minutes_to
from benchmarks.rl_vs_sft.by_strategy import em_by_strategy, group_strategy, strategy_counts
from benchmarks.rl_vs_sft.runs import agent_em, evaluate, pairs_of, sft, start_model, trained
from benchmarks.rl_vs_sft.settings import Settings
from benchmarks.rl_vs_sft_tables import RL_ARMS
from benchmarks.strategy import better_share


def models_of(d: Path, arms) -> dict[str, Path]:
    """A cell's evaluations on the report questions by model: the start, each arm, and SFT at
    GRPO's minutes where it ran."""
    return {m: d / f"eval_{m}" for m in ("start", *arms, *(["sft_matched"] if matched_ran(arms) else []))}


def headroom(evals: list[Path]) -> dict:
    """What any arm could reach on a cell's report questions: the share that at least one of the
    models evaluated answered right, and the share where no model's searches brought a gold answer
    into its context (Search-R1's retrieval hit), with those questions' ids: the JSON keeps them,
    so their trajectories can be found (or rerun on the KB regenerated from its seed) after the
    workdir is gone. A lead of one arm over another beyond `any_right` minus the other's EM needs
    questions no model has answered."""
    from agent_rl.evaluation import report

    recs = [report.records_by_question(e) for e in evals]
    common = set.intersection(*(set(r) for r in recs))
    n = max(len(common), 1)
    missed = sorted(k for k in common if not any(r[k].get("retrieval_hit") for r in recs))
    return {"any_right": sum(any(float(r[k]["em"]) > 0 for r in recs) for k in common) / n,
            "never_retrieved": len(missed) / n, "never_retrieved_ids": [str(i) for _, i in missed]}


def per_question(d: Path, kinds: dict[str, str], row: dict) -> dict:
    """A cell's models question by question on the report questions (the benchmark's JSON keeps
    only their summaries): each model's agent EM and searches per question overall, EM by question
    kind and each question's EM by id; with `--best-of-val` also each arm's best checkpoint and
    every checkpoint's running-evaluation EM (the evaluation command's, and the RL arms' trainer's),
    so a reader can see which questions moved and how the checkpoints were chosen. EM in points."""
    from agent_rl.evaluation import report

    models = models_of(d, row["arms"])
    best = row.get("best_checkpoints", {}).get("arms", {})
    models.update({f"{arm}_best_step_{b['step']}": Path(b["eval"]) for arm, b in best.items()})

    def scored(e: Path) -> dict:
        g = report.grouped_stats(e, group_of=kinds)
        return {"em": round(100 * g[report.ALL]["em"], 1), "searches": round(g[report.ALL]["searches_mean"], 2),
                "by_kind": {k: round(100 * v["em"], 1) for k, v in sorted(g.items()) if k != report.ALL},
                "em_by_id": {str(i): float(r["em"]) for (_, i), r in report.records_by_question(e).items()}}

    running = {f"{arm}_trainer_validation": {str(k): em for k, _, em in points}
               for arm, points in row.get("val_points", {}).items()}
    running = {**{arm: {str(k): em for k, em in b["val_points"]} for arm, b in best.items()}, **running}
    return {"kb_seed": row["kb_seed"], "seed": row["seed"], "running_evaluation": running,
            "models": {m: scored(e) for m, e in models.items()}}


def seed_row(kb_seed: int, seed: int, d: Path, arms, kinds: dict[str, str], questions: dict[str, dict],
             gain: float) -> dict:
    """One cell's numbers from what its stages left in `d`: per model (the start, each arm, SFT
    at GRPO's minutes) agent EM, searches per question and the better strategy's share, overall and
    by question kind, the EM of the questions searched each way, and strict format; per arm its
    steps and minutes; the paired differences (PAIRS) and each arm's from the start; SFT at GRPO's
    minutes; each RL arm's running evaluation and time to gain over the SFT arm; the headroom."""
    from agent_rl.evaluation import report

    evals = models_of(d, arms)
    st = {m: report.grouped_stats(e, "agent", kinds) for m, e in evals.items()}
    pairs, minus_start = pairs_of({m: e for m, e in evals.items() if m != "sft_matched"}, kinds)
    ran = {arm: trained(d / arm) for arm in arms}
    row = {"kb_seed": kb_seed, "seed": seed, "n": st["start"][report.ALL]["n"], "arms": list(arms),
           **per_model(st, evals, questions, kinds),
           "steps": {a: r[0] for a, r in ran.items()}, "minutes": {a: r[1] for a, r in ran.items()},
           "pairs": pairs, "minus_start": minus_start, "headroom": headroom(list(evals.values()))}
    if matched_ran(arms):
        k, k_min = matched_steps(d / "sft_more", d / "grpo")
        row["sft_matched"] = {"steps": k, "minutes": k_min, "loss_gap": same_steps_gap(d / "sft_more", d / "sft_matched", k),
                              "grpo_minus": report.paired_comparison(evals["sft_matched"], evals["grpo"],
                                                                     group_of=kinds)["diff"][report.ALL]}
    return {**row, **running_numbers(d, arms, gain)}


def per_model(st: dict[str, dict], evals: dict[str, Path], questions: dict[str, dict], kinds: dict[str, str]) -> dict:
    """A cell's numbers per model from its evaluations (`evals`) and their stats by question kind
    (`st`, report.grouped_stats): agent EM, searches, strict format, the better strategy's share,
    the EM of the questions searched each way, and per question kind EM and searches."""
    from agent_rl.evaluation.report import ALL

    return {
        "em": {m: x[ALL]["em"] for m, x in st.items()},
        "searches": {m: x[ALL]["searches_mean"] for m, x in st.items()},
        "strict_format": {m: 1 - x[ALL]["invalid_format_rate"] for m, x in st.items()},
        "better_strategy": {m: {g: better_share(c) for g, c in strategy_counts(e, questions, kinds).items()}
                            for m, e in evals.items()},
        "em_by_strategy": {m: em_by_strategy(e, questions) for m, e in evals.items()},
        "by_kind": {g: {"n": st["start"][g]["n"], "em": {m: x[g]["em"] for m, x in st.items() if g in x},
                        "searches": {m: x[g]["searches_mean"] for m, x in st.items() if g in x}}
                    for g in sorted(st["start"]) if g != ALL}}


def running_numbers(d: Path, arms, gain: float) -> dict:
    """Each RL arm's running evaluation (the trainer's, every --val-every steps) and, with the SFT
    arm, its time to gain over the SFT arm's EM on the same questions (`gain` ahead)."""
    from benchmarks.learning import time_to_gain

    rl = [a for a in arms if a in RL_ARMS]
    out: dict = {"val_points": {a: time_to_gain(d / a, 0.0)["val_points"] for a in rl}}
    if "sft_more" in arms:
        out["val_em_sft_more"] = agent_em(d / "val_sft_more")
        out["time_to_gain_min"] = {a: minutes_to(out["val_points"][a], out["val_em_sft_more"] + gain) for a in rl}
        out["time_to_gain_by"] = "trainer validation"
    return out


def run_cell(w: Workdir, d: Path, kb_seed: int, seed: int, val: Path, rep: Path, url: str, kinds: dict[str, str],
             questions: dict[str, dict], s: Settings, demos_all: Path | None, host: str) -> dict:
    """One cell (KB `kb_seed`, run seed `seed`): its start, every arm from it, their evaluations;
    its row (and `d`/per_question.json), with the hardware line it ran under."""
    start = start_model(w, d, seed, s, url)
    evaluate(w, start, rep, url, d / "eval_start", s.eval_limit)
    for arm in s.arms:
        model = run_arm(w, arm, start, val, url, d, seed, s, demos_all)
        evaluate(w, model, rep, url, d / f"eval_{arm}", s.eval_limit)
    if "sft_more" in s.arms:
        evaluate(w, d / "sft_more" / "model", val, url, d / "val_sft_more", s.val_n)
    if matched_ran(s.arms):
        k, _ = matched_steps(d / "sft_more", d / "grpo")  # the same SFT run, k steps: by count, not clock
        matched = sft(w, d / "sft_matched", 1000 + seed, k, 24 * 3600, start, extra=sft_lr(s)) if k else start
        evaluate(w, matched, rep, url, d / "eval_sft_matched", s.eval_limit)
    row = seed_row(kb_seed, seed, d, s.arms, kinds, questions, s.gain)
    if s.best_of_val:
        row.update(best_of_cell(w, d, start, val, rep, url, kinds, s, row))
    if s.log_batches:
        row["group_strategy"] = logged_strategies(w, d, s.arms)
    (d / "per_question.json").write_text(json.dumps({"host": host, **per_question(d, kinds, row)}, indent=1) + "\n")
    return {**row, "host": host}


def logged_strategies(w: Workdir, d: Path, arms: list[str]) -> dict[str, dict]:
    """`--log-batches`: each RL arm's `group_strategy` from the batches it wrote (<arm>/rollouts),
    its questions found by their text among the KB's training questions."""
    import pandas as pd

    from agent_rl.training.rollout_data import read_rollout_data

    train = {str(r["question"]): r for r in pd.read_parquet(w.kb / "train.parquet").to_dict("records")}
    return {arm: group_strategy(read_rollout_data(d / arm / "rollouts"), train) for arm in arms if arm in RL_ARMS}
