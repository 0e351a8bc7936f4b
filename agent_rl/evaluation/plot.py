"""Plot a run's reward and EM curves from its metrics.jsonl to a PNG.

    python -m agent_rl.evaluation.plot runs/demo                # writes runs/demo/curves.png
    python -m agent_rl.evaluation.plot runs/demo --out a.png --keys reward/mean val/em
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from agent_rl.training.metrics import read_jsonl

OUTCOME = ("em", "subem", "f1")


def default_keys(rows: list[dict]) -> list[str]:
    """The reward curve and the outcome-metric (EM / SubEM / F1) curves present in the run:
    reward/mean, reward/<metric>, val/<metric> and val/<metric>/<data_source>."""
    keys = sorted({k for r in rows for k in r if isinstance(r[k], (int, float))})
    train = [k for k in keys if k in ("reward/mean", *(f"reward/{m}" for m in OUTCOME))]
    val = [k for k in keys if k.startswith("val/") and k.split("/")[1] in OUTCOME]
    return train + val


def plot_run(run_dir: str | Path, out: str | Path | None = None, keys: list[str] | None = None) -> Path:
    """Write one panel per metric group (reward/, val/) with one line per key; return the PNG path."""
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="run directory containing metrics.jsonl")
    ap.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png)")
    ap.add_argument("--keys", nargs="*", default=None, help="metric keys (default: reward/mean and EM curves)")
    args = ap.parse_args(argv)
    print(plot_run(args.run_dir, args.out, args.keys))


if __name__ == "__main__":
    main()
