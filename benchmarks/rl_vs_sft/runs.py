"""The benchmark's stages (each skipped when an earlier attempt finished it) and what a finished
run or evaluation left: its steps and minutes, its checkpoints, its EM, paired differences."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from agent_rl.demo import stages
from agent_rl.demo.stages import Workdir
from benchmarks.rl_vs_sft_tables import PAIRS, pair_name


def run(cmd: list | Callable[[], list], what: str, done: Path) -> None:
    """A stage of the benchmark, unless `done` exists (a finished stage of an earlier attempt).
    `cmd` may be a function building the command, called only when the stage runs."""
    if done.exists():
        print(f"[rl_vs_sft] {what}: done earlier ({done})", flush=True)
        return
    secs = stages.run_stage(cmd() if callable(cmd) else cmd, what, tag="rl_vs_sft")
    print(f"[rl_vs_sft] {what}: {secs:.0f}s", flush=True)


def split_test(kb: Path, val_n: int) -> tuple[Path, Path]:
    """The KB's test questions as two files: the first `val_n` for the running evaluation, the
    rest for the report (no question is in both)."""
    import pandas as pd

    val, rep = kb / "val.parquet", kb / "report.parquet"
    if not (val.exists() and rep.exists()):
        df = pd.read_parquet(kb / "test.parquet")
        df.iloc[:val_n].to_parquet(val)
        df.iloc[val_n:].to_parquet(rep)
    return val, rep


def evaluate(w: Workdir, model: Path, data: Path, url: str, out: Path, limit: int) -> Path:
    """Greedy, agent mode, the same seeded sample (seed 0) for every model. `model` is a model
    or run directory, resolved only when the evaluation has not run yet: a finished seed's GRPO
    checkpoints (2 GiB each) can be deleted and the command rerun with more seeds."""
    from agent_rl.evaluation.evaluate import resolve_model_dir

    run(lambda: stages.evaluation(w, resolve_model_dir(model), url, data, out, limit, seed=0),
        f"evaluate {out.parent.name}/{out.name} ({limit} questions)", done=out / "summary.json")
    return out


def sft(w: Workdir, out: Path, seed: int, steps: int, max_time_s: float, model: Path, save_every: int = 0,
        demos: Path | None = None, extra: list[str] = ()) -> Path:
    """SFT from `model` on `demos` (default the workdir's); `save_every` > 0: a checkpoint every
    that many steps, all kept (the start curve, best checkpoints); `extra`: overrides after the
    stage's own (an arm's clock, lr, epochs)."""
    keep = keep_every(save_every) if save_every else []
    run(stages.sft(demos or w.demos, model, out, steps, max_time_s, seed=seed) + keep + list(extra),
        f"SFT -> {out.parent.name}/{out.name}", done=out / "model" / "config.json")
    return out / "model"


def start_model(w: Workdir, d: Path, seed: int, s, url: str) -> Path:
    """A cell's start: SFT's model after `s.start_steps`, or with `s.start_rule` "explore" the
    checkpoint (every `s.start_every` steps, and the last) that the handover rule picks by their
    exploration pre-flights on the KB's training questions (`agent-rl-eval explore --choose`; its
    figures and choice in `d`/start_explore.json)."""
    if s.start_rule == "steps":
        return sft(w, d / "start", seed, s.start_steps, 24 * 3600, w.model)
    final = sft(w, d / "start", seed, s.start_steps, 24 * 3600, w.model, save_every=s.start_every)
    ckpts = [(f"step{k}", checkpoint(d / "start", k)) for k in checkpoint_steps(d / "start") if k < s.start_steps]
    out = d / "start_explore.json"
    run([stages.PY, "-m", "agent_rl.evaluation.cli", "explore", *(f"{name}={p}" for name, p in ckpts),
         f"step{s.start_steps}={final}", "--data", w.kb / "train.parquet", "--retriever-url", url,
         "--config", stages.TRAIN_CFG, "--limit", str(EXPLORE_QUESTIONS), "--seed", str(seed), "--choose",
         "--json", out], f"explore the start's {len(ckpts) + 1} checkpoints", done=out)
    return Path(json.loads(out.read_text())["start"]["model"])


EXPLORE_QUESTIONS = 32
"""Training questions each start checkpoint samples its groups on (`agent-rl-eval explore --limit`)."""


def keep_every(steps: int) -> list[str]:
    """A checkpoint every `steps` steps, all kept (the start curve, best checkpoints)."""
    return [f"trainer.save_freq={steps}", "trainer.max_ckpt_to_keep=null"]


def step_times(run_dir: Path) -> dict[int, float]:
    """{step: training minutes at its end} from a run's metrics.jsonl (steps 1 on)."""
    from agent_rl.training.metrics import read_jsonl

    return {r["step"]: r["training/elapsed_s"] / 60 for r in read_jsonl(run_dir)
            if r.get("step", 0) > 0 and "training/elapsed_s" in r}


def trained(run_dir: Path) -> tuple[int, float]:
    """(steps, training minutes) of a run: its last step's."""
    return max(step_times(run_dir).items(), default=(0, 0.0))


def checkpoint(run_dir: Path, k: int) -> Path:
    return run_dir / "checkpoints" / f"global_step_{k}"


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's checkpoints (`checkpoints/global_step_K`; not a killed save's `.tmp`), ascending."""
    found = (re.fullmatch(r"global_step_(\d+)", p.name) for p in (run_dir / "checkpoints").glob("global_step_*"))
    return sorted(int(m.group(1)) for m in found if m)


def agent_em(eval_dir: Path) -> float:
    """An evaluation's agent-mode EM over all its questions (its summary.json)."""
    from agent_rl.evaluation import report

    return report.read_summary(eval_dir)["modes"]["agent"][report.ALL]["em"]


def pairs_of(evals: dict[str, Path], kinds: dict[str, str]) -> tuple[dict, dict]:
    """(the PAIRS differences between the arms in `evals`, each arm's difference from the start):
    paired over the report questions, first minus second."""
    from agent_rl.evaluation import report

    def minus(a: str, b: str) -> dict:
        return report.paired_comparison(evals[b], evals[a], group_of=kinds)["diff"][report.ALL]

    return ({pair_name(a, b): minus(a, b) for a, b in PAIRS if a in evals and b in evals},
            {arm: minus(arm, "start") for arm in evals if arm != "start"})
