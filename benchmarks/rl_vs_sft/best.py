"""Best checkpoints (`--best-of-val`): every checkpoint of an arm and the start scored on the
running-evaluation questions, the best on the report questions; and time to gain, an RL arm's
minutes until it first leads the SFT arm there."""

from __future__ import annotations

from pathlib import Path

from agent_rl.demo.stages import Workdir
from benchmarks.rl_vs_sft.runs import agent_em, checkpoint, checkpoint_steps, evaluate, pairs_of, step_times
from benchmarks.rl_vs_sft.settings import Settings
from benchmarks.rl_vs_sft_tables import RL_ARMS, best_step


def minutes_to(points: list[tuple[int, float, float]], bar: float) -> float | None:
    """The training minutes of `learning.first_reaching`'s point (step, minutes, EM); None when
    no point after step 0 reaches `bar`."""
    from benchmarks.learning import first_reaching

    hit = first_reaching(points, bar)
    return None if hit is None else hit[1]


def checkpoint_time_to_gain(run_dir: Path, val_points: list[tuple[int, float]], bar: float) -> float | None:
    """`minutes_to` by the evaluation command's scores of a run's checkpoints (`best_checkpoint`'s
    (step, EM) points), each at its step's training minutes."""
    times = step_times(run_dir)
    return minutes_to([(k, times.get(k, 0.0), em) for k, em in val_points], bar)


def val_points(w: Workdir, d: Path, name: str, val: Path, url: str, s: Settings,
               known: dict[int, Path]) -> list[tuple[int, float]]:
    """[(step, agent EM)] of run `d`/`name`'s checkpoints and the start (step 0) on the
    running-evaluation questions, each scored into `d`/val_<name>_<step> by the evaluation command
    unless `known` (step -> an evaluation already made) has it."""
    run_dir = d / name
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise SystemExit(f"rl_vs_sft: {run_dir} kept no checkpoints (trained without --best-of-val); "
                         "give another --workdir")
    dirs = {k: known.get(k) or evaluate(w, checkpoint(run_dir, k), val, url, d / f"val_{name}_{k}", s.val_n)
            for k in [0, *steps]}
    return [(k, agent_em(v)) for k, v in dirs.items()]


def best_checkpoint(w: Workdir, d: Path, arm: str, val: Path, rep: Path, url: str, s: Settings,
                    known: dict[int, tuple[Path | None, Path | None]]) -> dict:
    """The arm's checkpoints and the start (step 0) scored on the running-evaluation questions,
    the best (`best_step`) on the report questions. `known`: step -> (its evaluation on the val
    questions, on the report questions) already made, either None."""
    run_dir = d / arm
    points = val_points(w, d, arm, val, url, s, {k: v for k, (v, _) in known.items() if v})
    k, em = best_step(points)
    rep_dir = known.get(k, (None, None))[1] or evaluate(w, checkpoint(run_dir, k), rep, url, d / f"eval_{arm}_{k}",
                                                        s.eval_limit)
    return {"step": k, "minutes": step_times(run_dir).get(k, 0.0), "val_em": em, "val_points": points, "eval": str(rep_dir)}


def best_row(d: Path, kinds: dict[str, str], best: dict[str, dict]) -> dict:
    """Each arm's best checkpoint (`best_checkpoint`) with its agent EM on the report questions,
    and the paired differences between them (PAIRS) and from the start."""
    pairs, minus_start = pairs_of({"start": d / "eval_start", **{a: Path(b["eval"]) for a, b in best.items()}}, kinds)
    return {"arms": {a: {**b, "em": agent_em(Path(b["eval"]))} for a, b in best.items()},
            "pairs": pairs, "minus_start": minus_start}


def best_of_cell(w: Workdir, d: Path, start: Path, val: Path, rep: Path, url: str, kinds: dict[str, str],
                 s: Settings, row: dict) -> dict:
    """What `--best-of-val` adds to a cell's row (`cell.seed_row`'s): every arm's best checkpoint
    and, with the SFT arm, time to gain by the evaluation command's scores of the checkpoints.
    Each arm's last checkpoint and the start reuse the evaluations the cell already made."""
    evaluate(w, start, val, url, d / "val_start", s.val_n)
    first = {0: (d / "val_start", d / "eval_start")}
    best = {arm: best_checkpoint(w, d, arm, val, rep, url, s, {
        **first, row["steps"][arm]: (d / "val_sft_more" if arm == "sft_more" else None, d / f"eval_{arm}")})
        for arm in s.arms}
    out: dict = {"best_checkpoints": best_row(d, kinds, best)}
    if "sft_more" in s.arms:
        out["time_to_gain_min"] = {arm: checkpoint_time_to_gain(d / arm, best[arm]["val_points"],
                                                                row["val_em_sft_more"] + s.gain)
                                   for arm in s.arms if arm in RL_ARMS}
        out["time_to_gain_by"] = "evaluation command"
    return out
