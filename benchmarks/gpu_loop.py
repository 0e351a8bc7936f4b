"""The loop on a GPU, its figures side by side (docs/gpu.md, "The loop on a GPU"):

    python benchmarks/gpu_loop.py --runs artifacts/demo_runs --rollout R.json --train T.json [--json OUT]

Reads what one run on the GPU machine wrote: `make demo`'s pipeline (`agent_rl.demo`:
its GRPO metrics and its report's SFT vs SFT+RL comparison), `benchmarks/rollout.py --json`
(interleaved rollout vs plain generation of the same prompts and lengths, same engine) and
`benchmarks/gpu.py --only training --json` (one PPO update vs the bare forward+backward of
the same micro-batches). Prints one table with the host line and writes it as JSON.

The CPU's GRPO steps per hour beside the GPU's come from `--cpu-step-s` (the seconds of one
demo GRPO step on the 2-core host, README).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def grpo_figures(runs: Path) -> dict:
    """From the demo's GRPO run: steps, seconds per step (median over steps after the first),
    steps per hour, the weight sync's seconds, and the time split of a step."""
    rows = [json.loads(line) for line in (runs / "grpo" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing/step" in r]
    if not rows:
        return {"error": f"no GRPO steps in {runs / 'grpo' / 'metrics.jsonl'}"}
    steady = rows[1:] or rows
    step_s = statistics.median(r["timing/step"] for r in steady)
    out = {"steps": len(rows), "step_s_median": step_s, "first_step_s": rows[0]["timing/step"],
           "steps_per_hour": 3600.0 / step_s}
    for key in sorted({k for r in steady for k in r if k.startswith("timing/")}):
        vals = [r[key] for r in steady if key in r]
        out[key.replace("/", "_") + "_median"] = statistics.median(vals)
    for key in ("reward/mean", "reward/em"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[key.replace("/", "_") + "_first_last"] = [vals[0], vals[-1]]
    return out


def demo_figures(runs: Path) -> dict:
    """The report's SFT vs SFT+RL: agent EM (%) of each on the same questions and the paired
    difference with its 95% interval (all questions), and the stage times."""
    plan = json.loads((runs / "plan.json").read_text())
    cmp, out = plan.get("sft_vs_rl"), {"stage_s": plan.get("stage_s", {})}
    if cmp:
        g = "all"
        d = cmp["diff"][g]
        out["sft_vs_rl"] = {"n": cmp["n"], "sft_em": 100 * cmp["a"][g]["em"], "rl_em": 100 * cmp["b"][g]["em"],
                            "diff": 100 * d["diff"], "ci": [100 * d["ci_low"], 100 * d["ci_high"]],
                            "sft_searches": cmp["a"][g]["searches_mean"], "rl_searches": cmp["b"][g]["searches_mean"]}
    return out


def collect(runs: Path, rollout: Path | None, train: Path | None, cpu_step_s: float | None) -> dict:
    out: dict = {}
    for name, fn in (("grpo", lambda: grpo_figures(runs)), ("demo", lambda: demo_figures(runs))):
        try:
            out[name] = fn()
        except (OSError, ValueError, KeyError) as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    if rollout is not None and rollout.is_file():
        r = json.loads(rollout.read_text())
        out["rollout"] = {k: r.get(k) for k in ("interleaved_tok_s", "plain_tok_s", "plain_prefill_tok_s",
                                                "ratio_to_plain", "ratio_to_plain_prefill", "ratio_to_batch_per_turn",
                                                "interleaved_searches", "settings", "hardware")}
    if train is not None and train.is_file():
        t = json.loads(train.read_text()).get("training", {})
        out["training"] = {k: t.get(k) for k in ("update_tok_s", "bare_tok_s", "ratio_to_bare", "old_logprob_tok_s",
                                                 "sft_tok_s", "export_cuda_ipc_s", "peak_mem_gib", "mfu", "error")}
    if cpu_step_s:
        out["cpu_steps_per_hour"] = 3600.0 / cpu_step_s
    return out


def _f(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def print_table(res: dict, host: str) -> None:
    g, r, t, d = res.get("grpo", {}), res.get("rollout", {}), res.get("training", {}), res.get("demo", {})
    cmp = d.get("sft_vs_rl", {})
    print(f"\nThe loop on a GPU  ({host})")
    print(f"{'figure':<58} value")
    rows = [
        ("interleaved rollout tok/s / plain generation (goal >= 0.85)", _f(r.get("ratio_to_plain"), ".3f")),
        ("  interleaved tok/s, plain tok/s", f"{_f(r.get('interleaved_tok_s'), '.0f')}, {_f(r.get('plain_tok_s'), '.0f')}"),
        ("GRPO steps (demo config, through Ray + vLLM CUDA)", str(g.get("steps", "-"))),
        ("GRPO seconds per step (median after the first)", _f(g.get("step_s_median"))),
        ("GRPO steps per hour: GPU", _f(g.get("steps_per_hour"), ".0f")),
        ("GRPO steps per hour: 2-core CPU (README)", _f(res.get("cpu_steps_per_hour"), ".0f")),
        ("weight sync seconds per step (CUDA IPC, median)", _f(g.get("timing_sync_median"), ".3f")),
        ("actor update / bare forward+backward", _f(t.get("ratio_to_bare"), ".3f")),
        ("SFT vs SFT+RL agent EM (same held-out questions)",
         f"{_f(cmp.get('sft_em'), '.1f')} -> {_f(cmp.get('rl_em'), '.1f')}, paired {_f(cmp.get('diff'), '+.1f')} "
         f"{[round(x, 1) for x in cmp.get('ci', [])] or ''} on {cmp.get('n', '-')} questions"),
    ]
    for name, value in rows:
        print(f"{name:<58} {value}")
    for name in ("grpo", "demo", "rollout", "training"):
        err = res.get(name, {}).get("error") if isinstance(res.get(name), dict) else None
        if err:
            print(f"[{name}] {err}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("artifacts/demo_runs"), help="the demo's runs folder")
    ap.add_argument("--rollout", type=Path, help="benchmarks/rollout.py --json output")
    ap.add_argument("--train", type=Path, help="benchmarks/gpu.py --only training --json output")
    ap.add_argument("--cpu-step-s", type=float, default=None, help="seconds of one demo GRPO step on the CPU host")
    ap.add_argument("--json", type=Path, help="write the figures here")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import records

    records.add_args(ap)
    args = ap.parse_args(argv)
    from data_prep.hardware import hardware_line

    res = collect(args.runs, args.rollout, args.train, args.cpu_step_s)
    res["host"] = hardware_line()
    print_table(res, res["host"])
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str) + "\n")
    records.keep(args, "gpu_loop", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
