"""benchmarks/rl_vs_sft's summary over cells (KB seed x run seed), its tables, plots and the
figures of its record (pure: they read the rows and the start curve's points the benchmark
built, and run nothing)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.strategy import NAME_ONLY, WITH_ATTRIBUTE

ARMS = ("sft_more", "rft", "grpo", "sft_all")
"""The arms a cell can run from its start, in the tables' order (benchmarks/rl_vs_sft's docstring)."""
RL_ARMS = ("rft", "grpo")
"""The arms trained by agent-rl-train (the others by agent-rl-sft)."""
LABELS = {"start": "start", "sft_more": "SFT more", "rft": "RFT", "grpo": "GRPO", "sft_all": "SFT all (ref.)",
          "sft_matched": "SFT at GRPO's minutes"}
PAIRS = (("grpo", "sft_more"), ("grpo", "rft"), ("rft", "sft_more"))
"""The paired differences reported, first arm minus second, in each cell that ran both."""


def best_step(points: list[tuple[int, float]]) -> tuple[int, float]:
    """(step, EM): the highest running-evaluation EM; a tie goes to the fewest steps (the least
    training that reached it: the start, step 0, before any)."""
    return max(points, key=lambda p: (p[1], -p[0]))


def pair_name(a: str, b: str) -> str:
    return f"{a}_minus_{b}"


def pair_label(name: str) -> str:
    a, b = name.split("_minus_")
    return f"{LABELS[a]} - {LABELS[b]}"


# ----------------------------------------------------------------------------- over cells
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
        2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
        2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
"""Student's t 0.975 quantile for df = 1..30 (scipy.stats.t.ppf, 4 decimals)."""
Z975 = 1.959963984540054


def t975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to df 30, then the Cornish-Fisher expansion in
    1/df (Abramowitz & Stegun 26.7.5; within 1e-5 of the exact value from df 20 on)."""
    if df < 1:
        raise ValueError(f"t975: df {df} < 1")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def t_interval(xs: list[float]) -> tuple[float, float] | None:
    """95% t interval of the mean of `xs` (one difference per cell): mean +- t975(n - 1) * sd /
    sqrt(n), sd with n - 1; None with fewer than two (no spread to estimate). It treats the cells
    as a sample of KBs x seeds, so it is wider than any one cell's interval over questions."""
    n = len(xs)
    if n < 2:
        return None
    mean = statistics.fmean(xs)
    half = t975(n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return mean - half, mean + half


def cell_spread(diffs: list[dict]) -> dict:
    """Paired differences of several cells: mean, median, worst, best, whether every cell's is
    above 0, and the t interval across cells (`t_low`, `t_high`: None with one cell; df)."""
    xs = [d["diff"] for d in diffs]
    ci = t_interval(xs)
    return {"cells": len(xs), "mean": statistics.fmean(xs), "median": statistics.median(xs), "worst": min(xs),
            "best": max(xs), "above_zero_in_every_cell": all(x > 0 for x in xs), "df": len(xs) - 1,
            "t_low": ci[0] if ci else None, "t_high": ci[1] if ci else None}


def _spreads(parts: list[dict], names) -> dict:
    """{name: cell_spread over the parts (pairs or minus_start dicts) that have it} for `names`."""
    return {k: cell_spread([p[k] for p in parts if k in p]) for k in names if any(k in p for p in parts)}


def summary(rows: list[dict]) -> dict:
    """Over cells: each pair's difference (PAIRS), each arm's change from the start, GRPO - SFT
    at GRPO's minutes where it ran, and the same for the best checkpoints where scored."""
    pairs = [pair_name(a, b) for a, b in PAIRS]
    out = {"cells": len(rows), "kb_seeds": sorted({r["kb_seed"] for r in rows}),
           "pairs": _spreads([r["pairs"] for r in rows], pairs),
           "minus_start": _spreads([r["minus_start"] for r in rows], ARMS)}
    matched = [r["sft_matched"]["grpo_minus"] for r in rows if "sft_matched" in r]
    if matched:
        out["matched"] = cell_spread(matched)
    best = [r["best_checkpoints"] for r in rows if "best_checkpoints" in r]
    if best:
        out["best_checkpoints"] = {"cells": len(best), "pairs": _spreads([b["pairs"] for b in best], pairs),
                                   "minus_start": _spreads([b["minus_start"] for b in best], ARMS)}
    return out


# ----------------------------------------------------------------------------- tables
def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def diff(p: dict) -> str:
    """A paired difference with its 95% interval over questions, in points."""
    return f"{100 * p['diff']:+.1f} [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}]"


def across(s: dict) -> str:
    """The t interval across cells, or n/a with one cell."""
    if s["t_low"] is None:
        return "n/a (one cell)"
    return f"[{100 * s['t_low']:+.1f}, {100 * s['t_high']:+.1f}]"


def spread_line(label: str, s: dict) -> str:
    cells = f"{s['cells']} cell{'s' if s['cells'] != 1 else ''}"
    return (f"{label} over {cells}: mean {100 * s['mean']:+.1f}, median {100 * s['median']:+.1f}, worst "
            f"{100 * s['worst']:+.1f}, best {100 * s['best']:+.1f}; across KB x seed (t, df {s['df']}): {across(s)}.")


def arms_of(rows: list[dict]) -> list[str]:
    return [a for a in ARMS if any(a in r["arms"] for r in rows)]


def _cell(r: dict) -> str:
    return f"| {r['kb_seed']} | {r['seed']} |"


def table(rows: list[dict], summ: dict, host: str, args) -> str:
    arms = arms_of(rows)
    models = ["start", *arms]
    pairs = [pair_name(a, b) for a, b in PAIRS if pair_name(a, b) in summ["pairs"]]
    rl = [a for a in arms if a in RL_ARMS and any(a in r.get("time_to_gain_min", {}) for r in rows)]
    lines = [f"{', '.join(LABELS[a] for a in arms)} from one start, {args.minutes:g} minutes an arm (every second "
             f"counted), KB kind {args.kb_kind}, KB seed{'s' if len(summ['kb_seeds']) > 1 else ''} "
             f"{', '.join(map(str, summ['kb_seeds']))}, start SFT {args.start_steps} steps", host,
             f"SFT more: {lr(args.sft_lr, 'SFT')}{f', {args.sft_epochs} epochs' if args.sft_epochs else ', until the clock'}; "
             f"RFT: {lr(args.rft_lr, 'GRPO')}", "",
             "| KB | seed | start EM | " + " | ".join(f"{LABELS[a]} (steps, min)" for a in arms) + " | "
             + " | ".join(f"{pair_label(p)}, paired 95% CI" for p in pairs)
             + "".join(f" | {LABELS[a]} minutes to +{100 * args.gain:.0f}" for a in rl) + " |",
             "|---|---|---|" + "---|" * (len(arms) + len(pairs) + len(rl))]
    for r in rows:
        ems = " | ".join(f"{pct(r['em'][a])} ({r['steps'][a]}, {r['minutes'][a]:.1f})" if a in r["arms"] else "-"
                         for a in arms)
        ps = " | ".join(diff(r["pairs"][p]) if p in r["pairs"] else "-" for p in pairs)
        ttg = "".join(f" | {minutes_cell(r, a)}" for a in rl)
        lines.append(f"{_cell(r)} {pct(r['em']['start'])} | {ems} | {ps}{ttg} |")
    lines += ["", "By question kind, on the report questions: agent EM (%), searches per question, and the share of "
                  "searches that follow the better strategy (name + attribute; n/a: no query could be told), "
                  "each " + " / ".join(LABELS[m] for m in models) + ":", "",
              "| KB | seed | kind | n | agent EM | searches | better strategy |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        for g, k in sorted(r["by_kind"].items()):
            lines.append(f"{_cell(r)} {g} | {k['n']} | " + " / ".join(pct(k['em'].get(m)) for m in models) + " | "
                         + " / ".join(_searches(k["searches"].get(m)) for m in models) + " | "
                         + " / ".join(pct(r["better_strategy"].get(m, {}).get(g)) for m in models) + " |")
        lines.append(f"{_cell(r)} all | {r['n']} | " + " / ".join(pct(r['em'].get(m)) for m in models) + " | "
                     + " / ".join(_searches(r["searches"].get(m)) for m in models) + " | "
                     + " / ".join(pct(r["better_strategy"].get(m, {}).get("all")) for m in models) + " |")
    lines += strategy_em_lines(rows, models)
    lines += group_strategy_lines(rows)
    lines.append("")
    lines += [spread_line(pair_label(p), summ["pairs"][p]) for p in pairs]
    ms = summ["minus_start"]
    lines.append("From the start, on average: " + ", ".join(f"{LABELS[a]} {100 * ms[a]['mean']:+.1f}" for a in arms
                                                           if a in ms) + ".")
    if "matched" in summ:
        lines.append(spread_line("GRPO - SFT at GRPO's minutes (the SFT arm's run to its last step within "
                                 "GRPO's minutes)", summ["matched"]))
    if rl and not all(by_command(r) for r in rows):
        lines.append(f"* minutes to +{100 * args.gain:.0f} from the trainer's running evaluation against the "
                     "evaluation command's of the SFT arm: the two score the same policy about a question in 40 "
                     "apart (--best-of-val scores both with the command).")
    rooms = [f"KB {r['kb_seed']} seed {r['seed']} {pct(r['headroom']['any_right'])} (gold never retrieved "
             f"{pct(r['headroom']['never_retrieved'])})" for r in rows if "headroom" in r]
    if rooms:
        lines.append("Answered right by at least one model (" + ", ".join(LABELS[m] for m in rows[0]["em"])
                     + "): " + "; ".join(rooms) + ". A lead of one arm over another beyond that share minus the "
                     "other's EM needs questions no model answered.")
    lines += best_table(rows, summ, args)
    others: dict[str, list[str]] = {}
    for r in rows:
        if r.get("host", host) != host:
            others.setdefault(r["host"], []).append(f"KB {r['kb_seed']} seed {r['seed']}")
    lines += [f"{', '.join(v)} ran on: {h}" for h, v in others.items()]
    lines += [f"WARNING: KB {r['kb_seed']} seed {r['seed']}'s SFT at GRPO's minutes is not the SFT arm's run "
              f"(largest loss difference over its {r['sft_matched']['steps']} steps: {r['sft_matched']['loss_gap']:.3g})"
              for r in rows if "sft_matched" in r and r["sft_matched"]["loss_gap"] > 0]
    return "\n".join(lines) + "\n"


def strategy_em_lines(rows: list[dict], models: list[str]) -> list[str]:
    """Agent EM of the questions each model searched with the better strategy against those it
    searched by name only (rl_vs_sft.by_strategy.em_by_strategy), where a cell's row has them and any question
    was told: whether the outcome reward can favour the better strategy for that policy (and, where
    the row has it, how often those searches found a gold answer: whether a retrieval term could)."""
    told = [r for r in rows if any(x["n"] for m in r.get("em_by_strategy", {}).values() for x in m.values())]
    if not told:
        return []
    lines = ["", "Agent EM (%) of the questions a model searched with the better strategy (any search with the "
                 "attribute) against by name only (every search without it), " + STRATEGY_CELL + ": each "
             + " / ".join(LABELS[m] for m in models) + ":", "",
             "| KB | seed | name + attribute | name only |", "|---|---|---|---|"]
    for r in told:
        by = r["em_by_strategy"]
        lines.append(f"{_cell(r)} " + " | ".join(" / ".join(strategy_cell(by[m][s]) if m in by else "-" for m in models)
                                                 for s in (WITH_ATTRIBUTE, NAME_ONLY)) + " |")
    return lines


def group_strategy_lines(rows: list[dict]) -> list[str]:
    """What GRPO's advantage saw of the strategies in the RL arms' own batches (`--log-batches`,
    rl_vs_sft.by_strategy.group_strategy), where a row has them: the better strategy's share of the trajectories
    at the first and last logged step, the groups that sampled both strategies, and there each
    strategy's mean reward, EM and advantage."""
    told = [(r, a, g) for r in rows for a, g in r.get("group_strategy", {}).items() if g["by_step"]]
    if not told:
        return []
    lines = ["", "In the RL arms' own batches: the better strategy's share of the trajectories told apart (%) at "
                 "the first and last step, the groups (one question's samples at a step) that sampled both "
                 "strategies, and there each strategy's mean reward / EM (%) / GRPO advantage, trajectories in "
                 "brackets:", "",
             "| KB | seed | arm | better strategy, first → last step | mixed groups | name + attribute | name only |",
             "|---|---|---|---|---|---|---|"]
    for r, arm, g in told:
        first, last = g["by_step"][0], g["by_step"][-1]
        lines.append(f"{_cell(r)} {LABELS[arm]} | {pct(first['better'])} (step {first['step']}) → "
                     f"{pct(last['better'])} (step {last['step']}) | {g['mixed']} of {g['groups']} | "
                     f"{_group_cell(g[WITH_ATTRIBUTE])} | {_group_cell(g[NAME_ONLY])} |")
    return lines


def _group_cell(x: dict) -> str:
    """One strategy's "reward / EM / advantage (n)" of group_strategy."""
    if not x["n"]:
        return "- (0)"
    return f"{x['reward']:.3f} / {pct(x['em'])} / {x['advantage']:+.2f} ({x['n']})"


STRATEGY_CELL = "then the share whose searches brought a gold answer where measured, questions in brackets"


def strategy_cell(x: dict) -> str:
    """One strategy's "EM, hit (n)" of em_by_strategy ("EM (n)" for rows written before hits were kept)."""
    hit = f", {pct(x['hit'])}" if "hit" in x else ""
    return f"{pct(x['em'])}{hit} ({x['n']})"


def curve_strategy_lines(curves: dict[int, list[dict]]) -> list[str]:
    """The start curve's points that tell the strategies apart (the lookalike kind): the better
    strategy's share of searches, and each strategy's EM and hit (strategy_cell) over all questions
    and by kind: what the start's own searches each way earn before any arm runs."""
    pts = [(s, p) for s, ps in curves.items() for p in ps if "em_by_strategy" in p]
    if not pts:
        return []
    lines = ["", "The start's searches by strategy: the better strategy's share of searches (%), and agent EM (%) "
                 "of the questions searched with it (any search with the attribute) against by name only, "
                 + STRATEGY_CELL + ":", "",
             "| seed | SFT steps | better strategy | questions | name + attribute | name only |", "|---|---|---|---|---|---|"]
    for s, p in pts:
        for g, by in p["em_by_strategy"].items():
            lines.append(f"| {s} | {p['step']} | {pct(p['better_strategy'])} | {g} | "
                         f"{strategy_cell(by[WITH_ATTRIBUTE])} | {strategy_cell(by[NAME_ONLY])} |")
    return lines


def lr(x: float | None, config: str) -> str:
    return f"the {config} config's lr" if x is None else f"lr {x:g}"


def _searches(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def by_command(row: dict) -> bool:
    """Whether the row's time to gain scored both arms with the evaluation command (not the
    trainer's running evaluation)."""
    return row.get("time_to_gain_by") == "evaluation command"


def minutes_cell(r: dict, arm: str) -> str:
    if arm not in r.get("time_to_gain_min", {}):
        return "-"
    m = r["time_to_gain_min"][arm]
    return ("not reached" if m is None else f"{m:.1f}") + ("" if by_command(r) else " *")


def best_table(rows: list[dict], summ: dict, args) -> list[str]:
    """The best-checkpoint comparison (`--best-of-val`) of the rows that have one."""
    best = [r for r in rows if "best_checkpoints" in r]
    if not best:
        return []
    arms = arms_of(best)
    b = summ["best_checkpoints"]
    pairs = [p for p in (pair_name(x, y) for x, y in PAIRS) if p in b["pairs"]]

    def arm(x: dict | None) -> str:
        return "-" if x is None else f"{x['step']} ({x['minutes']:.1f} min), {100 * x['val_em']:.1f}"

    lines = ["", f"Each arm's best checkpoint by the {args.val_n} running-evaluation questions (the start is step 0; "
                 "ties go to fewer steps), scored on the report questions:", "",
             "| KB | seed | " + " | ".join(f"{LABELS[a]} best: step (min), running EM" for a in arms)
             + " | agent EM " + " / ".join(LABELS[m] for m in ("start", *arms)) + " | "
             + " | ".join(f"{pair_label(p)}, paired 95% CI" for p in pairs) + " |",
             "|---|---|" + "---|" * (len(arms) + 1 + len(pairs))]
    for r in best:
        x = r["best_checkpoints"]
        lines.append(f"{_cell(r)} " + " | ".join(arm(x["arms"].get(a)) for a in arms) + " | "
                     + " / ".join(pct(r["em"]["start"] if m == "start" else x["arms"].get(m, {}).get("em"))
                                  for m in ("start", *arms)) + " | "
                     + " | ".join(diff(x["pairs"][p]) if p in x["pairs"] else "-" for p in pairs) + " |")
    lines.append("")
    lines += [spread_line(f"Best checkpoints, {pair_label(p)}", b["pairs"][p]) for p in pairs]
    return lines


# ----------------------------------------------------------------------------- the record
def headline(result: dict) -> dict[str, str]:
    """The record's figures (benchmarks/records.py calls this for the arm list's results): each
    pair's difference, the best checkpoints' first where scored, as the one cell's interval over
    questions or, across cells, the median and range and the t interval, and each arm's agent EM
    and steps."""
    from agent_rl.demo.records import MINUS, paired, pts

    rows, summ = result["rows"], result["summary"]
    out: dict[str, str] = {}
    for which, s, get in (("best checkpoints", summ.get("best_checkpoints"), lambda r: r["best_checkpoints"]["pairs"]),
                          ("same minutes, last checkpoints", summ, lambda r: r["pairs"])):
        for name, sp in (s or {"pairs": {}})["pairs"].items():
            label = pair_label(name).replace(" - ", f" {MINUS} ")
            if sp["cells"] == 1:
                one = next(get(r)[name] for r in rows if name in get(r))
                out[f"{label} ({which})"] = f"{paired(one)} (1 cell)"
            else:
                out[f"{label} ({which})"] = (f"median {pts(sp['median'])}, range {pts(sp['worst'])} to "
                                             f"{pts(sp['best'])}; mean {pts(sp['mean'])}, t [{pts(sp['t_low'])}, "
                                             f"{pts(sp['t_high'])}] over {sp['cells']} cells")
    arms = arms_of(rows)
    out["agent EM: start / " + " / ".join(LABELS[a] for a in arms)] = " / ".join(
        _range([r["em"][m] for r in rows if m in r["em"]]) for m in ("start", *arms))
    out["steps: " + " / ".join(LABELS[a] for a in arms)] = " / ".join(
        ",".join(str(r["steps"][a]) for r in rows if a in r["steps"]) for a in arms)
    return out


def _range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{100 * lo:.1f}" if lo == hi else f"{100 * lo:.1f}–{100 * hi:.1f}"


# ----------------------------------------------------------------------------- plots
def bars(r: dict) -> list[tuple[str, float]]:
    """A row's bars (label, agent EM on the report questions): the start, each arm, SFT at GRPO's
    minutes where it ran, then each arm's best checkpoint where the row has them (`--best-of-val`)."""
    out = [(LABELS[m], em) for m, em in r["em"].items()]
    for arm, b in r.get("best_checkpoints", {}).get("arms", {}).items():
        out.append((f"{LABELS[arm]}'s best checkpoint", b["em"]))
    return out


def running_curves(r: dict) -> dict[str, tuple[list[tuple[float, float]], float | None]]:
    """The right panel's lines for a row, by RL arm: its EM on the running-evaluation questions
    against its training minutes, and the SFT level it is to pass (None without the SFT arm).
    With best checkpoints, both by the evaluation command: the arm's checkpoints (at the trainer's
    minutes for their steps) against SFT's best checkpoint; without, the trainer's running
    evaluation against the SFT arm at the end of its minutes."""
    out = {}
    best = r.get("best_checkpoints", {}).get("arms", {})
    for arm, points in r.get("val_points", {}).items():
        if arm in best:
            minutes = {p[0]: p[1] for p in points}
            line = [(minutes[k], em) for k, em in best[arm]["val_points"] if k in minutes]
            level = best["sft_more"]["val_em"] if "sft_more" in best else None
        else:
            line, level = [(p[1], p[2]) for p in points], r.get("val_em_sft_more")
        out[arm] = (line, level)
    return out


def plot(rows: list[dict], out: Path) -> Path:
    fig, (a, b) = _pyplot().subplots(1, 2, figsize=(12, 4))
    per_row = [bars(r) for r in rows]
    labels = list(dict.fromkeys(label for x in per_row for label, _ in x))
    n, w = len(labels), 0.8 / len(labels)
    for i, label in enumerate(labels):
        has = [(j, em) for j, x in enumerate(per_row) for lab, em in x if lab == label]
        a.bar([j + (i - (n - 1) / 2) * w for j, _ in has], [100 * em for _, em in has], w, label=label,
              hatch="//" if "best" in label else None)
    a.set_xticks(range(len(rows)), [f"KB {r['kb_seed']}\nseed {r['seed']}" for r in rows])
    a.set_ylabel("agent EM % (held-out)")
    a.set_ylim(0, 100 + 9 * ((n + 2) // 3))  # the legend sits above the bars, never on one
    a.legend(loc="upper center", ncol=3, fontsize=7)
    for r in rows:
        for arm, (pts, level) in running_curves(r).items():
            b.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o",
                   linestyle="-" if arm == "grpo" else ":", label=f"{LABELS[arm]} KB {r['kb_seed']} seed {r['seed']}")
            if level is not None:
                b.axhline(100 * level, linestyle="--", linewidth=0.8, color=b.lines[-1].get_color())
    best = any("best_checkpoints" in r for r in rows)
    b.set_xlabel("training minutes (every second counted)")
    b.set_ylabel("EM % on the running questions\n" + ("(checkpoints; dashed: SFT's best)" if best
                                                      else "(trainer's evaluation; dashed: SFT arm at the end)"))
    if b.lines:
        b.legend(loc="lower right", fontsize=7)
    return _save(fig, out)


def curve_table(curves: dict[int, list[dict]], host: str, args) -> str:
    """Markdown: each seed's start curve on the one KB of `args` (its kb_seed, a list of one)."""
    kinds = sorted({g for pts in curves.values() for p in pts for g in p["by_kind"]})
    lines = [f"Start SFT against steps, KB seed {args.kb_seed[0]}, {args.eval_limit} report questions", host, "",
             "| seed | SFT steps | agent EM | " + " | ".join(kinds) + " | searches | strict format |",
             "|---|---|---|" + "---|" * len(kinds) + "---|---|"]
    for s, pts in curves.items():
        lines += [f"| {s} | {p['step']} | {100 * p['em']:.1f} | "
                  + " | ".join(f"{100 * p['by_kind'].get(g, float('nan')):.1f}" for g in kinds)
                  + f" | {p['searches']:.2f} | {100 * p['strict_format']:.1f} |" for p in pts]
    return "\n".join(lines + curve_strategy_lines(curves)) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def curve_plot(curves: dict[int, list[dict]], out: Path) -> Path:
    fig, ax = _pyplot().subplots(figsize=(6, 4))
    for s, pts in curves.items():
        ax.plot([p["step"] for p in pts], [100 * p["em"] for p in pts], marker="o", label=f"seed {s}")
    ax.set_xlabel("start SFT steps (of 8 demonstrations)")
    ax.set_ylabel("agent EM % (report questions)")
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, out)
