"""The demo's report (`<workdir>/demo_runs/report.md` and `plan.json`): it leads with what GRPO
added to cold-start SFT on the same held-out questions, then every model and mode as context,
the hardware line, the budget and the stage times."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from agent_rl.demo.budget import Budget

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "rl_vs_sft.json"
"""What benchmarks/rl_vs_sft.py measured, per host kind (a list of its JSON summaries)."""


def host_kind(hardware: dict) -> str:
    """The kind of host a figure holds for, from `data_prep.hardware.hardware_info()`: a GPU (by
    name; its CPU's bf16 does not matter there), else a CPU with or without native bf16."""
    if hardware.get("gpu"):
        return f"GPU ({hardware['gpu']})"
    return "native bf16" if hardware.get("native_bf16") else "no native bf16 (fp32)"


def expectations(hardware: dict, results: Path = RESULTS) -> str:
    """What the demo's gain means on this host kind: the benchmark's GRPO against the same
    minutes of continued SFT (median and range over seeds, on a knowledge base never tuned on),
    or a sentence saying there is no such figure yet."""
    kind = host_kind(hardware)
    entries = json.loads(results.read_text()) if results.is_file() else []
    rows = [e for e in entries if e.get("host_kind") == kind]
    if not rows:
        return (f"No benchmark of GRPO against the same minutes of SFT on this host kind ({kind}) yet: "
                "`python benchmarks/rl_vs_sft.py` measures it.\n")
    out = []
    for e in rows:
        s = e["summary"]
        if s["seeds"] == 1:
            spread, mean = f"{100 * s['median']:+.1f} (one seed: an anecdote, not a range)", ""
        else:
            spread = f"median {100 * s['median']:+.1f}, range {100 * s['worst']:+.1f} to {100 * s['best']:+.1f}"
            mean = " on average"
        out.append(f"On this host kind ({kind}), `{e['command']}` (knowledge base seed {e['kb_seed']}, never tuned "
                   f"on; {s['seeds']} seed{'s' if s['seeds'] != 1 else ''}): GRPO minus the same minutes of "
                   f"continued SFT, agent EM {spread}; from the same start, SFT for those minutes gave "
                   f"{100 * s['sft_more_minus_start_mean']:+.1f} and GRPO {100 * s['grpo_minus_start_mean']:+.1f}{mean}."
                   + matched(s.get("matched")))
    return "\n\n".join(out) + "\n"


def matched(m: dict | None) -> str:
    """The sentence on GRPO against SFT for GRPO's own training minutes (its long steps end its
    budget early), when the benchmark measured it."""
    if not m:
        return ""
    return (f" Against SFT for GRPO's own training minutes (its steps are long, so it stops early): median "
            f"{100 * m['median']:+.1f}, range {100 * m['worst']:+.1f} to {100 * m['best']:+.1f}.")


def question_kinds(test_parquet: Path) -> dict[str, str]:
    """Question id -> kind (single / bridge / comparison) of the generated knowledge base."""
    import pandas as pd

    df = pd.read_parquet(test_parquet, columns=["id", "kind"])
    return dict(zip(df["id"].astype(str), df["kind"].astype(str)))


def write_report(runs: Path, evals: dict[str, Path], rl_dir: Path | None, budget: Budget | None = None,
                 test_parquet: Path | None = None, stage_s: dict[str, float] | None = None,
                 chosen: dict | None = None) -> Path:
    """Markdown led by the model handed over (`chosen`: agent_rl.demo.selection.choose) and SFT vs
    SFT+RL (agent EM on the same held-out questions, the paired 95% interval of the difference,
    by question kind, searches per question, the GRPO curves as PNG), then every model x mode as
    context, the hardware line, the budget and stage times."""
    from agent_rl.evaluation.plot import plot_run
    from agent_rl.demo.selection import selection_markdown
    from agent_rl.evaluation.report import (ALL, comparison, comparison_markdown, paired_comparison,
                                            paired_comparison_markdown)
    from data_prep.hardware import hardware_line

    stage_s = stage_s or {}
    text = "# Demo report\n\n"
    summary: dict = {}
    if rl_dir is not None and "SFT" in evals and "SFT+RL" in evals:
        kinds = question_kinds(test_parquet) if test_parquet is not None else None
        cmp = paired_comparison(evals["SFT"], evals["SFT+RL"], group_of=kinds)
        summary["sft_vs_rl"] = cmp
        if chosen is not None:
            diff = cmp["diff"][ALL]["diff"]
            text += selection_markdown(chosen, diff)
            summary["selection"] = {**chosen, "handed_over_minus_sft": diff if chosen["chosen"] == "SFT+RL" else 0.0}
        text += (f"## What GRPO adds to cold-start SFT\n\nAgent mode (the model searches), greedy, on the same "
                 f"{cmp['n']} held-out questions:\n\n" + paired_comparison_markdown(cmp) + "\n")
        hardware = (budget.calibration if budget is not None else {}).get("hardware", {})
        text += "### What to expect\n\n" + expectations(hardware) + "\n"
        png = plot_run(rl_dir, runs / "grpo_curves.png",
                       keys=["reward/mean", "reward/em", "reward/valid_format", "rollout/searches_mean",
                             "rollout/invalid_action_rate", "rollout/repeated_query_rate"])
        text += (f"![GRPO training curves: reward, EM, valid format, searches per trajectory, invalid-action and "
                 f"repeated-query rates]({png.name})\n\n")
    table = comparison(list(evals.items()))
    text += comparison_markdown(table, title="Every model and mode (context)") + "\n"
    text += f"`{hardware_line()}`\n\n"
    if budget is not None:
        cal = budget.calibration
        text += (f"Calibration: update {cal.get('update_tok_s', 0):.0f} tok/s ({cal.get('update_dtype')}), "
                 f"generation {cal.get('gen_tok_s', 0):.0f} tok/s ({cal.get('engine_dtype')}).\n\n"
                 f"Budget ({budget.budget_minutes:.1f} minutes; GRPO as re-fitted after SFT): "
                 f"{budget.describe()}.\n\n")
        summary["plan"] = asdict(budget)
    text += "Stage times: " + ", ".join(f"{k}: {v / 60:.1f} min" for k, v in stage_s.items()) + "\n"
    summary["stage_s"] = stage_s
    (runs / "plan.json").write_text(json.dumps(summary, indent=2))
    md = runs / "report.md"
    md.write_text(text)
    print("\n" + text)
    return md
