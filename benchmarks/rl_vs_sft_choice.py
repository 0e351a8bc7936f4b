"""The pre-registered choice of the control arms' settings (`rl_vs_sft --choose`): the grid of
docs/preregistration/rl_beyond_imitation.md, the rule that picks from it, and its table (pure: it
reads the checkpoints' scores the benchmark made, and runs nothing).

Each candidate is one arm from the cell's start, trained for the same minutes as a reported arm,
every checkpoint (and the start, step 0) scored by the evaluation command on the running-evaluation
questions; a candidate's score is its best checkpoint's EM. Each arm takes the candidate with the
highest score; ties go to the smaller lr, then to fewer epochs."""

from __future__ import annotations

from itertools import product

from benchmarks.rl_vs_sft_tables import best_step

GRID = {"sft_lr": (1e-5, 3e-5, 1e-4), "sft_epochs": (1, 2, 4), "rft_lr": (7e-6, 3e-5, 1e-4)}
"""The pre-registered values: `--sft-lr` x `--sft-epochs` for sft_more, `--rft-lr` for rft (7e-6 is
GRPO's, configs/train/demo_grpo_cpu.yaml)."""
CHOSEN = {"sft_more": ("sft_lr", "sft_epochs"), "rft": ("rft_lr",)}
"""The settings each arm's choice fixes, in the order its ties are broken (smaller first)."""


def candidates() -> list[tuple[str, str, dict]]:
    """[(arm, name, settings)] of every grid point: the name is its folder in the cell's choice/."""
    out = [("sft_more", f"sft_more_lr{lr:g}_ep{ep}", {"sft_lr": lr, "sft_epochs": ep})
           for lr, ep in product(GRID["sft_lr"], GRID["sft_epochs"])]
    return out + [("rft", f"rft_lr{lr:g}", {"rft_lr": lr}) for lr in GRID["rft_lr"]]


def choose(scored: dict[str, dict]) -> dict[str, dict]:
    """{arm: the chosen candidate}, from {name: {arm, settings, points: [(step, EM)]}}: the highest
    best-checkpoint EM, ties to the smaller lr, then fewer epochs (CHOSEN's order)."""
    out = {}
    for arm, keys in CHOSEN.items():
        mine = [(n, c) for n, c in scored.items() if c["arm"] == arm]
        if not mine:
            continue
        name, c = max(mine, key=lambda nc: (best_step(nc[1]["points"])[1],
                                            *(-nc[1]["settings"][k] for k in keys)))
        step, em = best_step(c["points"])
        out[arm] = {"name": name, "settings": c["settings"], "step": step, "val_em": em}
    return out


def table(scored: dict[str, dict], chosen: dict[str, dict], host: str, args) -> str:
    """Markdown: every candidate's checkpoints and best, the choice, and the lines the
    pre-registration takes."""
    lines = [f"# The control arms' settings, chosen on the {args.kb_kind} kind's dev KB {args.kb_seed[0]}, "
             f"seed {args.seeds[0]}", "", host, "",
             f"{args.minutes:g}-minute arms (every second counted) from a {args.start_steps}-step start on "
             f"{args.demos} demonstrations; every checkpoint scored on the {args.val_n} running-evaluation "
             "questions (agent EM, %; step 0 is the start).", "",
             "| arm | lr | epochs | steps | minutes | EM by checkpoint (step: EM) | best (step: EM) | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    picked = {c["name"] for c in chosen.values()}
    for name, c in scored.items():
        s = c["settings"]
        lr = s.get("sft_lr", s.get("rft_lr"))
        step, em = best_step(c["points"])
        pts = ", ".join(f"{k}: {100 * e:.1f}" for k, e in c["points"])
        lines.append(f"| {c['arm']} | {lr:g} | {s.get('sft_epochs', '-')} | {c['steps']} | {c['minutes']:.1f} | "
                     f"{pts} | {step}: {100 * em:.1f} | {'yes' if name in picked else ''} |")
    lines += ["", "For the pre-registration:", ""]
    for arm, keys in CHOSEN.items():
        if arm in chosen:
            lines += [f"- {k.upper()}: {chosen[arm]['settings'][k]:g}" for k in keys]
    return "\n".join(lines) + "\n"


def headline(result: dict) -> dict[str, str]:
    """The record's figures: each arm's chosen settings and its best checkpoint's EM."""
    out = {}
    for arm, c in result["chosen"].items():
        s = ", ".join(f"{k} {v:g}" for k, v in c["settings"].items())
        out[f"{arm}: chosen"] = f"{s} (best checkpoint step {c['step']}, {100 * c['val_em']:.1f} agent EM)"
    out["candidates"] = str(len(result["candidates"]))
    return out
