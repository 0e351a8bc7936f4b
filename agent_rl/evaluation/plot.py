"""Plot a run's reward and EM curves from its metrics.jsonl to a PNG, or several runs side by side.

    agent-rl-eval plot runs/demo                # writes runs/demo/curves.png
    agent-rl-eval plot runs/demo --out a.png --keys reward/mean val/em
    agent-rl-eval plot EM-only=runs/a format=runs/b --out cmp.png \
        --keys reward/em reward/valid_format rollout/searches_mean --smooth 5
"""

from __future__ import annotations

import math
from pathlib import Path

from agent_rl.training.metrics import read_jsonl

OUTCOME = ("em", "subem", "f1")


PROTOCOL = ("rollout/invalid_action_rate", "rollout/repeated_query_rate", "rollout/answered_without_search")
"""Per-step protocol rates: a search agent going wrong shows in them before the reward drops."""


def default_keys(rows: list[dict]) -> list[str]:
    """The reward curve, the outcome-metric (EM / SubEM / F1) curves and the protocol rates
    present in the run: reward/mean, reward/<metric>, val/<metric>, val/<metric>/<data_source>,
    rollout/invalid_action_rate, rollout/repeated_query_rate, rollout/answered_without_search."""
    keys = sorted({k for r in rows for k in r if isinstance(r[k], (int, float))})
    train = [k for k in keys if k in ("reward/mean", *(f"reward/{m}" for m in OUTCOME))]
    val = [k for k in keys if k.startswith("val/") and k.split("/")[1] in OUTCOME]
    return train + val + [k for k in PROTOCOL if k in keys]


def plot_run(run_dir: str | Path, out: str | Path | None = None, keys: list[str] | None = None) -> Path:
    """Write one panel per metric group (reward/, val/, rollout/) with one line per key; return the PNG path."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    rows = read_jsonl(run_dir)
    keys = keys or default_keys(rows)
    if not keys:
        raise ValueError(f"{run_dir}: no reward or EM metrics to plot (reward/mean, reward/em, val/em, ...)")
    groups = sorted({k.split("/")[0] for k in keys})
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for key in (k for k in keys if k.split("/")[0] == group):
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="." if len(pts) < 50 else None, label=key)
        ax.set_xlabel("step")
        ax.set_title(group)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def moving_average(ys: list[float], window: int) -> list[float]:
    """Mean of each value and the up to `window - 1` before it (window 1: the values)."""
    return [sum(ys[max(0, i - window + 1): i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(ys))]


def plot_runs(runs: dict[str, str | Path], out: str | Path, keys: list[str], smooth: int = 1) -> Path:
    """One panel per metric key, one line per run (`label -> run dir`), each smoothed by a
    trailing moving average of `smooth` steps; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {label: read_jsonl(d) for label, d in runs.items()}
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, rows in data.items():
            pts = [(r["step"], r[key]) for r in rows
                   if r.get("step", 0) > 0 and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, moving_average(list(ys), smooth), label=label)
        ax.set_title(key + (f" (mean of {smooth} steps)" if smooth > 1 else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)
