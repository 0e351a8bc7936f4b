"""What a policy's searches each way earned (the strategies of benchmarks/strategy.py): their
counts by question kind in an evaluation, the EM and retrieval hit of the questions searched
each way, and what GRPO's advantage saw of them in an RL arm's own batches. Pure: it reads
evaluations and logged batches, and runs nothing."""

from __future__ import annotations

from pathlib import Path

from benchmarks.strategy import STRATEGIES, better_share, query_strategy, search_queries, trajectory_strategy


def strategy_counts(eval_dir: Path, questions: dict[str, dict], kinds: dict[str, str]) -> dict[str, dict[str, int]]:
    """{question kind and "all": {strategy, or "unknown": searches}} over an evaluation's agent
    trajectories (their queries, `query_strategy` on each)."""
    from agent_rl.evaluation import report

    out: dict[str, dict[str, int]] = {}
    for (_, qid), rec in sorted(report.records_by_question(eval_dir).items()):
        for query in search_queries(rec.get("trajectory") or ""):
            said = query_strategy(query, questions.get(str(qid), {})) or "unknown"
            for g in (report.ALL, kinds.get(str(qid))):
                if g is not None:
                    out.setdefault(g, {})
                    out[g][said] = out[g].get(said, 0) + 1
    return out


def em_by_strategy(eval_dir: Path, questions: dict[str, dict], ids: set[str] | None = None) -> dict[str, dict]:
    """Does the better strategy pay for this policy? Agent EM of an evaluation's questions grouped by
    the strategy their trajectory searched with: "name + attribute" when any of its searches held the
    question's attribute, "name only" when every search it made that can be told held none (questions
    with no such search are left out); `ids`: only those questions (one kind's). {strategy: {"n":
    questions, "em": share right, "hit": share whose retrieved text held a gold answer (the reward's
    retrieval_hit), None when n is 0}}. Outcome rewards can favour the better strategy only where its
    questions are answered more often; a retrieval term, where its searches find the answer more often."""
    from agent_rl.evaluation import report

    return _by_strategy(report.records_by_question(eval_dir), questions, ids)


def _by_strategy(records: dict, questions: dict[str, dict], ids: set[str] | None) -> dict[str, dict]:
    """em_by_strategy over records already read (`report.records_by_question`)."""
    tally = {s: [0, 0.0, 0] for s in STRATEGIES}
    for (_, qid), rec in records.items():
        if ids is not None and str(qid) not in ids:
            continue
        strategy = trajectory_strategy(rec.get("trajectory") or "", questions.get(str(qid), {}))
        if strategy is not None:
            tally[strategy][0] += 1
            tally[strategy][1] += float(rec["em"])
            tally[strategy][2] += bool(rec.get("retrieval_hit"))
    return {s: {"n": n, "em": right / n if n else None, "hit": hit / n if n else None}
            for s, (n, right, hit) in tally.items()}


def strategy_by_kind(eval_dir: Path, questions: dict[str, dict], kinds: dict[str, str]) -> dict[str, dict]:
    """`em_by_strategy` over all questions ("all") and over each question kind's, so that a gap between
    the strategies is not only which kinds of question each was used on (the evaluation read once)."""
    from agent_rl.evaluation import report

    records = report.records_by_question(eval_dir)
    groups = {report.ALL: None, **{g: {q for q, k in kinds.items() if k == g} for g in sorted(set(kinds.values()))}}
    return {g: _by_strategy(records, questions, ids) for g, ids in groups.items()}


def group_strategy(batches: list[dict], questions: dict[str, dict]) -> dict:
    """What GRPO's advantage saw of the strategies, from an RL arm's sampled batches (`--log-batches`:
    every step's whole batch, agent_rl.training.rollout_data's records): each trajectory's strategy
    as in `em_by_strategy` (the better one when any of its searches held the question's attribute)
    and its advantage as GRPO computes it from its group's rewards (one question's samples at one
    step; agent_rl.training.algos.advantages.grpo). `questions`: the KB's training rows by question
    text. {"by_step": [{"step", "trajectories", "better": the better strategy's share of the
    trajectories told apart}], "groups", "mixed": groups that sampled both strategies, and per
    strategy over the mixed groups' trajectories {"n", "reward", "em", "advantage": means}}. Only in
    a mixed group can an outcome reward move the policy from one strategy to the other: the sign
    of the better strategy's mean advantage there is the way GRPO pushed."""
    groups: dict[tuple, list[tuple[str | None, float, float]]] = {}
    steps: dict[int, list[str | None]] = {}
    for r in batches:
        text = "".join(p["text"] for p in r.get("pieces", []) if p.get("sampled"))  # the model's own searches
        strategy = trajectory_strategy(text, questions.get(r["question"], {}))
        groups.setdefault((r["step"], r["group_id"]), []).append(
            (strategy, float(r["reward"]), float(r.get("breakdown", {}).get("metric") or 0.0)))
        steps.setdefault(r["step"], []).append(strategy)
    mixed = [members for members in groups.values() if all(s in {m[0] for m in members} for s in STRATEGIES)]
    by_step = [{"step": k, "trajectories": len(ss), "better": better_share(
        {s: sum(x == s for x in ss) for s in STRATEGIES})} for k, ss in sorted(steps.items())]
    return {"by_step": by_step, "groups": len(groups), "mixed": len(mixed), **mixed_means(mixed)}


def mixed_means(mixed: list[list[tuple[str | None, float, float]]]) -> dict[str, dict]:
    """{strategy: {"n", "reward", "em", "advantage": means}} over the trajectories (strategy,
    reward, EM) of the groups that sampled both strategies, each advantage GRPO's within its group."""
    import torch

    from agent_rl.training.algos.advantages import grpo

    tally = {s: {"n": 0, "reward": 0.0, "em": 0.0, "advantage": 0.0} for s in STRATEGIES}
    for members in mixed:
        scores = torch.tensor([m[1] for m in members], dtype=torch.float64)
        adv, _ = grpo(scores[:, None], torch.ones(len(members), 1), group_ids=[0] * len(members))
        for (s, reward, em), a in zip(members, adv[:, 0].tolist()):
            if s is not None:
                t = tally[s]
                t["n"] += 1
                t["reward"], t["em"], t["advantage"] = t["reward"] + reward, t["em"] + em, t["advantage"] + a
    return {s: {"n": t["n"], **{k: (t[k] / t["n"] if t["n"] else None) for k in ("reward", "em", "advantage")}}
            for s, t in tally.items()}
