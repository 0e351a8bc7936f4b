"""benchmarks/rl_vs_sft.py's summary over seeds, its tables and its plots (pure: they read the
rows and the start curve's points the benchmark built, and run nothing)."""

from __future__ import annotations

import statistics
from pathlib import Path

def spread(diffs: list[float]) -> dict:
    return {"mean": statistics.fmean(diffs), "median": statistics.median(diffs), "worst": min(diffs),
            "best": max(diffs), "grpo_beats_sft_in_every_seed": all(x > 0 for x in diffs)}


def summary(rows: list[dict]) -> dict:
    """Over seeds: GRPO - SFT more (the whole budget's SFT) at the top level, GRPO - SFT at
    GRPO's own minutes under "matched", and each arm's mean change from the start."""
    return {"seeds": len(rows), **spread([r["grpo_minus_sft"]["diff"] for r in rows]),
            "sft_more_minus_start_mean": statistics.fmean(r["sft_more_minus_start"]["diff"] for r in rows),
            "grpo_minus_start_mean": statistics.fmean(r["grpo_minus_start"]["diff"] for r in rows),
            "matched": {**spread([r["grpo_minus_sft_matched"]["diff"] for r in rows]),
                        "sft_minus_start_mean": statistics.fmean(r["em_sft_matched"] - r["em_start"] for r in rows)},
            **best_summary([r["best_checkpoints"] for r in rows if "best_checkpoints" in r])}


def best_summary(best: list[dict]) -> dict:
    """{"best_checkpoints": GRPO's best - SFT's best over the seeds that have them}, or {}."""
    return {"best_checkpoints": {**spread([b["grpo_minus_sft"]["diff"] for b in best]), "seeds": len(best)}} if best else {}


def by_command(row: dict) -> bool:
    """Whether the row's time to gain scored both arms with the evaluation command (rows of runs
    before `time_to_gain_by` used the trainer's running evaluation for GRPO)."""
    return row.get("time_to_gain_by") == "evaluation command"


def diff(p: dict) -> str:
    """A paired difference with its 95% interval, in points."""
    return f"{100 * p['diff']:+.1f} [{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}]"


def table(rows: list[dict], summ: dict, host: str, args) -> str:
    def pct(x):
        return f"{100 * x:.1f}"

    kinds = sorted({k for r in rows for k in r["by_kind"]})
    m = summ["matched"]
    lines = [f"RL against the same minutes of SFT, KB seed {args.kb_seed}, start SFT {args.start_steps} steps, "
             f"{args.minutes:g} training minutes per arm", host, "",
             "| seed | start EM | SFT more (steps, min) | GRPO (steps, min) | GRPO - SFT more, paired 95% CI | "
             "SFT at GRPO's minutes (steps, min) | GRPO - SFT at GRPO's minutes | "
             + " | ".join(f"{k}: start / SFT / GRPO" for k in kinds) + " | searches start / SFT / GRPO | minutes to +"
             f"{100 * args.gain:.0f} |",
             "|---|---|---|---|---|---|---|" + "---|" * len(kinds) + "---|---|"]
    for r in rows:
        bk = " | ".join(f"{pct(r['by_kind'][k]['start'])} / {pct(r['by_kind'][k]['sft_more'])} / "
                        f"{pct(r['by_kind'][k]['grpo'])}" for k in kinds)
        s = r["searches"]
        ttg = ("not reached" if r["time_to_gain_min"] is None else f"{r['time_to_gain_min']:.1f}") + \
            ("" if by_command(r) else " *")
        lines.append(f"| {r['seed']} | {pct(r['em_start'])} | {pct(r['em_sft_more'])} ({r['sft_more_steps']}, "
                     f"{r['sft_more_minutes']:.1f}) | {pct(r['em_grpo'])} ({r['grpo_steps']}, {r['grpo_minutes']:.1f}) | "
                     f"{diff(r['grpo_minus_sft'])} | {pct(r['em_sft_matched'])} ({r['sft_matched_steps']}, "
                     f"{r['sft_matched_minutes']:.1f}) | {diff(r['grpo_minus_sft_matched'])} | {bk} | "
                     f"{s['start']:.2f} / {s['sft_more']:.2f} / {s['grpo']:.2f} | {ttg} |")
    lines += ["", f"GRPO - SFT more: mean {100 * summ['mean']:+.1f}, median {100 * summ['median']:+.1f}, worst seed "
                  f"{100 * summ['worst']:+.1f}, best {100 * summ['best']:+.1f} over {summ['seeds']} "
                  f"seed{'s' if summ['seeds'] != 1 else ''}; "
                  f"from the start, SFT more {100 * summ['sft_more_minus_start_mean']:+.1f} and GRPO "
                  f"{100 * summ['grpo_minus_start_mean']:+.1f} on average.",
              f"GRPO - SFT at GRPO's minutes: mean {100 * m['mean']:+.1f}, median {100 * m['median']:+.1f}, worst "
              f"seed {100 * m['worst']:+.1f}, best {100 * m['best']:+.1f}; from the start, SFT at GRPO's minutes "
              f"{100 * m['sft_minus_start_mean']:+.1f} on average."]
    if not all(by_command(r) for r in rows):
        lines.append(f"* minutes to +{100 * args.gain:.0f} from the trainer's running evaluation of GRPO against "
                     "the evaluation command's of the SFT arm: the two score the same policy about a question in 40 "
                     "apart (--best-of-val scores both with the command).")
    rooms = [f"seed {r['seed']} {pct(r['headroom']['any_right'])} (gold never retrieved "
             f"{pct(r['headroom']['never_retrieved'])})" for r in rows if "headroom" in r]
    if rooms:
        lines.append("Answered right by at least one of the four models (start, SFT more, SFT at GRPO's minutes, "
                     "GRPO): " + "; ".join(rooms) + ". A GRPO lead over the SFT arm beyond that share minus the SFT "
                     "arm's EM needs questions no model answered.")
    lines += best_table(rows, summ, args)
    others = {}
    for r in rows:
        if r.get("host", host) != host:
            others.setdefault(r["host"], []).append(str(r["seed"]))
    lines += [f"Seed{'s' if len(v) > 1 else ''} {', '.join(v)} ran on: {h}" for h, v in others.items()]
    lines += [f"WARNING: seed {r['seed']}'s SFT at GRPO's minutes is not the SFT arm's run (largest loss difference "
              f"over its {r['sft_matched_steps']} steps: {r['sft_matched_loss_gap']:.3g})"
              for r in rows if r["sft_matched_loss_gap"] > 0]
    return "\n".join(lines) + "\n"


def best_table(rows: list[dict], summ: dict, args) -> list[str]:
    """The best-checkpoint comparison (`--best-of-val`) of the rows that have one."""
    best = [r for r in rows if "best_checkpoints" in r]
    if not best:
        return []

    def arm(a):
        return f"{a['step']} ({a['minutes']:.1f} min), {100 * a['val_em']:.1f}"

    b = summ["best_checkpoints"]
    lines = ["", f"Each arm's best checkpoint by the {args.val_n} running-evaluation questions (the start is step 0; "
                 "ties go to fewer steps), scored on the report questions:", "",
             "| seed | SFT best: step (min), running EM | GRPO best: step (min), running EM | agent EM start / SFT best / "
             "GRPO best | GRPO best - SFT best, paired 95% CI | SFT best - start | GRPO best - start |",
             "|---|---|---|---|---|---|---|"]
    for r in best:
        x = r["best_checkpoints"]
        lines.append(f"| {r['seed']} | {arm(x['sft'])} | {arm(x['grpo'])} | {100 * r['em_start']:.1f} / "
                     f"{100 * x['sft']['em']:.1f} / {100 * x['grpo']['em']:.1f} | {diff(x['grpo_minus_sft'])} | "
                     f"{diff(x['sft_minus_start'])} | {diff(x['grpo_minus_start'])} |")
    lines += ["", f"GRPO best - SFT best: mean {100 * b['mean']:+.1f}, median {100 * b['median']:+.1f}, worst seed "
                  f"{100 * b['worst']:+.1f}, best {100 * b['best']:+.1f} over {b['seeds']} seed{'s' if b['seeds'] != 1 else ''}."]
    return lines


BARS = (("em_start", "start SFT"), ("em_sft_more", "SFT, same budget"), ("em_sft_matched", "SFT, GRPO's minutes"),
        ("em_grpo", "GRPO"))
"""The left panel's bars of every row: (row key, label)."""


def bars(r: dict) -> list[tuple[str, float]]:
    """A row's bars (label, agent EM on the report questions): `BARS`, then each arm's best
    checkpoint where the row has them (`--best-of-val`)."""
    out = [(label, r[key]) for key, label in BARS]
    if "best_checkpoints" in r:
        b = r["best_checkpoints"]
        out += [("SFT's best checkpoint", b["sft"]["em"]), ("GRPO's best checkpoint", b["grpo"]["em"])]
    return out


def running_curve(r: dict) -> tuple[list[tuple[float, float]], float]:
    """The right panel's line for a row: GRPO's EM on the running-evaluation questions against its
    training minutes, and the SFT level it is to pass. With best checkpoints, both by the evaluation
    command: GRPO's checkpoints (at the trainer's minutes for their steps, the steps its running
    evaluation also ran at) against SFT's best checkpoint; without, the trainer's running
    evaluation against the SFT arm at the end of its minutes."""
    if "best_checkpoints" not in r:
        return [(p[1], p[2]) for p in r["val_points"]], r["val_em_sft_more"]
    b, minutes = r["best_checkpoints"], {p[0]: p[1] for p in r["val_points"]}
    return [(minutes[k], em) for k, em in b["grpo"]["val_points"] if k in minutes], b["sft"]["val_em"]


def plot(rows: list[dict], out: Path) -> Path:
    fig, (a, b) = _pyplot().subplots(1, 2, figsize=(11, 4))
    per_row = [bars(r) for r in rows]
    labels = [label for label, _ in max(per_row, key=len)]
    n, w = len(labels), 0.8 / len(labels)
    for i, label in enumerate(labels):
        has = [(j, x[i][1]) for j, x in enumerate(per_row) if i < len(x)]
        a.bar([j + (i - (n - 1) / 2) * w for j, _ in has], [100 * em for _, em in has], w, label=label,
              hatch="//" if "best" in label else None)
    a.set_xticks(range(len(rows)), [f"seed {r['seed']}" for r in rows])
    a.set_ylabel("agent EM % (held-out)")
    a.set_ylim(0, 100 + 9 * ((n + 2) // 3))  # the legend sits above the bars, never on one
    a.legend(loc="upper center", ncol=3, fontsize=7)
    for r in rows:
        pts, level = running_curve(r)
        b.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=f"GRPO seed {r['seed']}")
        b.axhline(100 * level, linestyle="--", linewidth=0.8, color=b.lines[-1].get_color())
    best = any("best_checkpoints" in r for r in rows)
    b.set_xlabel("GRPO training minutes")
    b.set_ylabel("EM % on the running questions\n" + ("(GRPO's checkpoints; dashed: SFT's best)" if best
                                                      else "(trainer's evaluation; dashed: SFT arm at the end)"))
    b.legend(loc="lower right", fontsize=8)
    return _save(fig, out)


def curve_table(curves: dict[int, list[dict]], host: str, args) -> str:
    kinds = sorted({g for pts in curves.values() for p in pts for g in p["by_kind"]})
    lines = [f"Start SFT against steps, KB seed {args.kb_seed}, {args.eval_limit} report questions", host, "",
             "| seed | SFT steps | agent EM | " + " | ".join(kinds) + " | searches | strict format |",
             "|---|---|---|" + "---|" * len(kinds) + "---|---|"]
    for s, pts in curves.items():
        lines += [f"| {s} | {p['step']} | {100 * p['em']:.1f} | "
                  + " | ".join(f"{100 * p['by_kind'].get(g, float('nan')):.1f}" for g in kinds)
                  + f" | {p['searches']:.2f} | {100 * p['strict_format']:.1f} |" for p in pts]
    return "\n".join(lines) + "\n"


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
