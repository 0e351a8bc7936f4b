"""sync vs one_step_off vs async (`trainer.mode`): steps per hour and time to gain, side by side.

    python benchmarks/async_modes.py [--minutes 6] [--modes sync,one_step_off,async]
                                     [--search local,slow] [--latency-s 1-3] [--json PATH]

For each search kind and each mode, GRPO from the cold-start SFT model (configs/train/
demo_grpo_cpu.yaml, the same overrides for every arm) for `--minutes` of training on the
embedded knowledge base, with the running held-out evaluation of `benchmarks/learning.py`
(`--val-every` steps, first `--val-n` test questions) that its time to gain reads. Search kinds:
`local` (the flat index's retriever on this host) and `slow` (the same retriever behind an
added latency drawn uniformly from `--latency-s` per request: a web search API). Arms run one
after another on the same host, in the order given, each in its own Ray session; where torch sees
a GPU, the engine and the trainer share it (`trainer.n_gpus_per_node=1`, as `make demo` places
them: a user with one GPU).

Printed: one table with the hardware line; per arm the training steps, steps per hour of
training (validations excluded), RL minutes to SFT + `--gain` (not reached within the budget
is said so), mean staleness, groups dropped for staleness, the trainer's waiting for rollouts
and the engine's idle seconds per step, and the share of the step spent in generation.
A PNG of val/em per arm against training minutes goes beside the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import records  # noqa: E402
from benchmarks.learning import rl_overrides, time_to_gain  # noqa: E402


class SlowSearch:
    """The retriever's HTTP client plus an added latency per request. Picklable (it travels to
    the rollout worker): the client is made on first use, in the worker's event loop."""

    def __init__(self, url: str, lo_s: float, hi_s: float, seed: int = 0) -> None:
        self.url, self.lo, self.hi = url, lo_s, hi_s
        self.rng = random.Random(seed)
        self.client = None

    async def search(self, queries, topk):
        from agent_rl.rollout.retrieval_client import RetrieverClient

        if self.client is None:
            self.client = RetrieverClient(self.url)
        await asyncio.sleep(self.rng.uniform(self.lo, self.hi))
        return await self.client.search(queries, topk)


def arm_overrides(sft: Path, url: str, args: argparse.Namespace, run_dir: Path, mode: str) -> list[str]:
    """An arm's config overrides: the training questions of --kb (the config names the embedded
    KB's); on a GPU the engine and the trainer's workers on it, as the demo places them; the
    running evaluation and the clock (benchmarks/learning.py), then the command's own; the mode."""
    from agent_rl.demo.stages import device_overrides

    return [f"data.train_files=[{Path(args.kb) / 'train.parquet'}]", *device_overrides(),
            *rl_overrides(sft, url, args, run_dir), f"trainer.mode={mode}"]


def train_arm(sft: Path, url: str, args: argparse.Namespace, run_dir: Path, mode: str, search: str) -> dict:
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.trainer import ray_trainer

    cfg = load_config(TrainConfig, args.config, arm_overrides(sft, url, args, run_dir, mode))
    retriever = SlowSearch(url, *args.latency) if search == "slow" else None
    t0 = time.time()
    with ray_trainer(cfg, run_dir, retriever=retriever) as trainer:
        trainer.fit(on_step=lambda step, m: print(f"[async_modes] {mode}/{search} step {step}: "
                                                  f"{m['training/elapsed_s']:.0f}s", flush=True))
    return summarize(run_dir, args.gain) | {"wall_s": time.time() - t0}


def summarize(run_dir: Path, gain: float) -> dict:
    from agent_rl.training.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir) if r.get("step", 0) > 0]
    ttg = time_to_gain(run_dir, gain)
    steps = len(rows)
    train_s = ttg["val_points"][-1][1] * 60 if ttg["val_points"] else 0.0  # training time without validations

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else None

    gen = mean("timing/gen") or 0.0
    step_s = mean("timing/step") or float("nan")
    return {
        "steps": steps, "train_s": train_s, "steps_per_hour": 3600 * steps / train_s if train_s else 0.0,
        "time_to_gain_min": ttg["time_to_gain_min"], "steps_to_gain": ttg["steps_to_gain"],
        "val_em_start": ttg["val_em_start"], "val_em_best": ttg["val_em_best"], "val_em_last": ttg["val_em_last"],
        "val_points": ttg["val_points"], "staleness_mean": mean("async/staleness_mean"),
        "dropped_stale": sum(r.get("async/dropped_stale", 0.0) for r in rows),
        "trainer_wait_s": mean("async/trainer_wait_s") if mean("async/trainer_wait_s") is not None else gen,
        "engine_idle_s": mean("async/engine_idle_s"), "gen_share": gen / step_s if step_s == step_s else None,
        "step_s": step_s, "reward_mean": mean("reward/mean"),
    }


def fmt(v, spec: str = ".1f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def table(arms: dict, args: argparse.Namespace) -> str:
    from data_prep.hardware import hardware_line

    lines = [hardware_line(), "",
             f"| search | mode | steps in {args.minutes:g} min | steps / hour | vs sync | RL min to SFT + "
             f"{100 * args.gain:.0f} pts (steps) | running EM start -> best -> last | staleness mean | dropped stale "
             "| trainer waits for rollouts s/step | engine idle s/step | s / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (search, mode), a in arms.items():
        base = arms.get((search, "sync"))
        ratio = a["steps_per_hour"] / base["steps_per_hour"] if base and base["steps_per_hour"] else None
        ttg = "not reached" if a["time_to_gain_min"] is None else f"{a['time_to_gain_min']:.1f} ({a['steps_to_gain']})"
        lines.append(f"| {search} | {mode} | {a['steps']} | {a['steps_per_hour']:.0f} | {fmt(ratio, '.2f')}x | {ttg} | "
                     f"{100 * a['val_em_start']:.1f} -> {100 * a['val_em_best']:.1f} -> {100 * a['val_em_last']:.1f} | "
                     f"{fmt(a['staleness_mean'], '.2f')} | {a['dropped_stale']:.0f} | {fmt(a['trainer_wait_s'])} | "
                     f"{fmt(a['engine_idle_s'])} | {fmt(a['step_s'])} |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (search, mode), a in arms.items():
        pts = a["val_points"]
        ax.plot([p[1] for p in pts], [100 * p[2] for p in pts], marker="o", label=f"{mode} / {search}")
    ax.set_xlabel("RL training minutes (validations excluded)")
    ax.set_ylabel("running held-out EM (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=6.0, help="RL training budget per arm (default 6)")
    ap.add_argument("--modes", default="sync,one_step_off,async", help="trainer.mode values, in run order")
    ap.add_argument("--search", default="local,slow", help="local (this host's retriever) and/or slow (+ latency)")
    ap.add_argument("--latency-s", default="1-3", help="slow search: added seconds per request, LO-HI (default 1-3)")
    ap.add_argument("--sft", default=str(ROOT / "runs/sft/demo_cpu"), help="SFT model: HF dir or agent-rl-sft run dir")
    ap.add_argument("--config", default=str(ROOT / "configs/train/demo_grpo_cpu.yaml"))
    ap.add_argument("--kb", default=str(ROOT / "artifacts/kb"))
    ap.add_argument("--index", default=str(ROOT / "artifacts/kb_index_flat"))
    ap.add_argument("--val-every", type=int, default=3, help="steps between running held-out evaluations (3)")
    ap.add_argument("--val-n", type=int, default=60, help="held-out questions of the running evaluation (60)")
    ap.add_argument("--gain", type=float, default=0.05)
    ap.add_argument("--workdir", default=None, help="default runs/async_modes/<time>")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*", help="training config overrides for every arm, key=value")
    records.add_args(ap)
    args = ap.parse_args(argv)
    from data_prep.hardware import hardware_info, offline_env

    offline_env()
    from agent_rl.evaluation.evaluate import resolve_model_dir
    from benchmarks.kb_server import serve_index

    args.latency = tuple(float(x) for x in args.latency_s.split("-"))
    args.config = Path(args.config)
    kb = Path(args.kb)
    args.test = [kb / "test.parquet"]
    sft = resolve_model_dir(args.sft)
    work = Path(args.workdir or ROOT / "runs" / "async_modes" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    arms: dict = {}
    with serve_index(Path(args.index), kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
        for search in args.search.split(","):
            for mode in args.modes.split(","):
                arms[(search, mode)] = train_arm(sft, url, args, work / f"{search}_{mode}", mode, search)
                print(table(arms, args), flush=True)
    text = table(arms, args)
    print("\n" + text)
    png = plot(arms, work / "val_em.png")
    result = {"hardware": hardware_info(), "minutes": args.minutes, "latency_s": args.latency, "png": str(png),
              "arms": {f"{s}/{m}": a for (s, m), a in arms.items()}, "table": text, "overrides": args.overrides}
    (work / "async_modes.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    records.keep(args, "async_modes", result, files=[png], default_dir=work)
    return 0


if __name__ == "__main__":  # vLLM and Ray start processes with spawn
    sys.exit(main())
