"""The demo's report (`<workdir>/demo_runs/report.md`, `plan.json` and the run's `record.json`):
it leads with what GRPO added to cold-start SFT on the same held-out questions, then what the
benchmark's records say for this host kind, every model and mode as context, the hardware line,
the budget and the stage times."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from agent_rl.demo.records import paired, pts, write_record
from agent_rl.demo.stages import ROLLOUTS

if TYPE_CHECKING:  # budget reads configs/demo.yaml from a checkout; the quoting works installed
    from agent_rl.demo.budget import Budget

EXPECTATIONS = "expectations.json"
"""The benchmark figures the report quotes and the sentences it says them in, shipped with the
package (agent_rl/demo/): generated from docs/results/expect.yaml and the records it names by
`python -m benchmarks.records index`, so an installed copy quotes what the source tree's records say."""


def host_kind(hardware: dict) -> str:
    """The kind of host a figure holds for, from `data_prep.hardware.hardware_info()`: a GPU (by
    name; its CPU's bf16 does not matter there), else a CPU with or without native bf16 (the
    words of `records.host_kind`, which reads them from a hardware line)."""
    if hardware.get("gpu"):
        return f"GPU ({hardware['gpu']})"
    return "native bf16" if hardware.get("native_bf16") else "no native bf16 (fp32)"


def packaged_expectations() -> dict:
    """agent_rl/demo/expectations.json, read through the package (works installed or in a checkout)."""
    from importlib.resources import files

    return json.loads(files("agent_rl.demo").joinpath(EXPECTATIONS).read_text())


QUOTE = ("record", "host_kind", "where", "command", "label", "figure")
"""A quote's fields in expectations.json (`benchmarks.records.expectations` writes them)."""

SENTENCE_FIELDS = {"kb101": QUOTE, "no_kb101": ("host_kind",), "unseen": QUOTE,
                   "prereg": ("host_kind", "record", "figures"), "prereg_figure": QUOTE, "closing": ()}
"""The report's sentences by case (docs/results/expect.yaml `demo_report`) and the {names} each
may use: `index` refuses any other, so a typo there fails in the source tree, not in a demo."""


def expectations(hardware: dict, data: dict | None = None) -> str:
    """What the demo's gain means on this host kind: the benchmark's record for this kind on KB
    101 (the knowledge base its settings were chosen on, said so), the run on a knowledge base
    the team never saw, the pre-registered runs against rejection sampling and continued SFT, and
    what one demo run can show. The sentences are data (expect.yaml, carried in
    expectations.json); this function only chooses them. `data`: expectations.json's content
    (default: the packaged one)."""
    kind = host_kind(hardware)
    data = data if data is not None else packaged_expectations()
    quotes, says = data["quotes"], data["sentences"]
    mine = [q for q in quotes if q["where"] == "kb101" and q["host_kind"] == kind]
    out = [says["kb101"].format_map(q) for q in mine] or [says["no_kb101"].format(host_kind=kind)]
    out += [says["unseen"].format_map(q) for q in quotes if q["where"] == "unseen"]
    prereg = [q for q in quotes if q["where"] == "prereg"]
    if prereg:
        figures = "; ".join(says["prereg_figure"].format_map(q) for q in prereg)
        out.append(says["prereg"].format(host_kind=prereg[0]["host_kind"], record=prereg[0]["record"],
                                         figures=figures))
    out.append(says["closing"])
    return "\n\n".join(out) + "\n"


def grpo_skipped_markdown(skipped: dict, budget: Budget | None) -> str:
    """The report's first section where GRPO did not run: why, and the command that runs it."""
    text = "## GRPO did not run\n\nThe demo hands over the SFT model: no GRPO step ran, so this report compares nothing "
    if "rl_minutes" in skipped:
        return text + f"with RL (`--rl-minutes {skipped['rl_minutes']:g}` asked for that).\n\n"
    cal = budget.calibration if budget is not None else {}
    return text + (
        f"with RL. At this host's calibrated speed (update {cal.get('update_tok_s', 0):.0f} tok/s, generation "
        f"{cal.get('gen_tok_s', 0):.0f} tok/s), {skipped['steps']} GRPO steps with their start-up, validations and "
        f"the evaluation of GRPO's model need about {skipped['minutes_needed']:.1f} minutes; "
        f"{skipped['minutes_left']:.1f} of the {skipped['budget_minutes']:.1f}-minute budget were left after SFT and "
        f"its evaluation. A run from scratch with `python -m agent_rl.demo --budget-minutes "
        f"{skipped['budget_to_run']}` fits them.\n\n")


def rollouts_markdown(rollout_dir: Path) -> str:
    """Where the GRPO run's sampled rollouts are and the command that shows them; empty when it
    wrote none (a run stopped before its first step)."""
    steps = sorted(int(f.stem) for f in rollout_dir.glob("*.jsonl") if f.stem.isdigit())
    if not steps:
        return ""
    return (f"GRPO's sampled rollouts (step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}): "
            f"`agent-rl-eval show {rollout_dir}` prints them with the context the update does not train on "
            "shaded (`--html FILE`: one page).\n\n")


def demo_headline(summary: dict) -> dict[str, str]:
    """The record's headline from plan.json's summary: the model handed over and GRPO's own model
    against the SFT model, and the minutes the stages took."""
    out = {}
    cmp = summary.get("sft_vs_rl")
    if cmp:
        diff = cmp["diff"]["all"]
        if "selection" in summary:
            out["the model handed over − its SFT model"] = pts(summary["selection"]["handed_over_minus_sft"])
        out["GRPO's own model − its SFT model"] = f"{paired(diff)} ({diff['n']} questions)"
    if "grpo_skipped" in summary:
        out["GRPO steps"] = "0 (did not fit the budget: the SFT model handed over)"
    if summary.get("stage_s"):
        out["minutes (stages summed)"] = f"{sum(summary['stage_s'].values()) / 60:.1f}"
    return out


def question_kinds(test_parquet: Path) -> dict[str, str]:
    """Question id -> kind (single / bridge / comparison) of the generated knowledge base."""
    import pandas as pd

    df = pd.read_parquet(test_parquet, columns=["id", "kind"])
    return dict(zip(df["id"].astype(str), df["kind"].astype(str)))


def write_report(runs: Path, evals: dict[str, Path], rl_dir: Path | None, budget: Budget | None = None,
                 test_parquet: Path | None = None, stage_s: dict[str, float] | None = None,
                 chosen: dict | None = None, skipped: dict | None = None) -> Path:
    """Markdown led by the model handed over (`chosen`: agent_rl.demo.selection.choose) and SFT vs
    SFT+RL (agent EM on the same held-out questions, the paired 95% interval of the difference,
    by question kind, searches per question, the GRPO curves as PNG), then every model x mode as
    context, the hardware line, the budget and stage times. `skipped`: why GRPO did not run
    (agent_rl.demo.budget.rl_skipped, or {"rl_minutes": N} when asked not to), said first."""
    from agent_rl.evaluation.plot import plot_run
    from agent_rl.demo.selection import selection_markdown
    from agent_rl.evaluation.report import (ALL, comparison, comparison_markdown, paired_comparison,
                                            paired_comparison_markdown)
    from data_prep.hardware import hardware_line

    stage_s = stage_s or {}
    text = "# Demo report\n\n"
    summary: dict = {}
    if skipped is not None:
        summary["grpo_skipped"] = skipped
        text += grpo_skipped_markdown(skipped, budget)
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
        text += rollouts_markdown(rl_dir / ROLLOUTS)
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
    pngs = [runs / "grpo_curves.png"] if (runs / "grpo_curves.png").is_file() else []
    write_record(runs, experiment="demo", title="`make demo`: SFT and SFT+RL on the demo's knowledge base",
                 benchmark="make demo", headline=demo_headline(summary),
                 settings={"plan": summary.get("plan", {}), "selection": summary.get("selection", {})},
                 files=[runs / "plan.json", md, *pngs])
    print("\n" + text)
    return md
