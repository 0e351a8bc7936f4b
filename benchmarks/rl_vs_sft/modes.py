"""What a command runs on each knowledge base, by mode: the arms (every cell, then the table, JSON,
plot and record over cells), the start curve (`--start-curve`) or the choice (`--choose`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agent_rl.demo import stages
from agent_rl.demo.stages import Workdir
from benchmarks import records
from benchmarks import rl_vs_sft_choice as choice
from benchmarks.rl_vs_sft.arms import run_arm
from benchmarks.rl_vs_sft.best import val_points
from benchmarks.rl_vs_sft.by_strategy import strategy_by_kind, strategy_counts
from benchmarks.rl_vs_sft.cell import run_cell
from benchmarks.rl_vs_sft.compat import MERGED, SETTINGS
from benchmarks.rl_vs_sft.runs import evaluate, run, sft, split_test, start_model, trained
from benchmarks.rl_vs_sft.settings import DEV_KB_SEEDS, Settings, kb_workdir, out_dir
from benchmarks.rl_vs_sft_tables import curve_plot, curve_table, plot, summary, table
from benchmarks.strategy import better_share, query_strategy


@dataclass
class KB:
    """One knowledge base made ready in its workdir: the model, KB and demonstrations built, the
    test questions split, the index served at `url`."""

    seed: int
    """The KB's seed (`agent-rl-prep synthetic --seed`)."""
    work: Path
    """Its workdir (settings.kb_workdir)."""
    w: Workdir
    """The stages' files in `work`."""
    val: Path
    """The running-evaluation questions (the first --val-n of its test questions)."""
    rep: Path
    """The report questions (the rest)."""
    url: str
    """The retriever over its corpus."""
    kinds: dict[str, str]
    """Test question id -> its kind (single, bridge, comparison)."""
    questions: dict[str, dict]
    """Test question id -> its row of test.parquet (query_strategy reads its attributes)."""


def run_kb(kb_seed: int, s: Settings, host: str) -> list[dict]:
    """Every cell of one KB (its workdir's settings checked before): the workdir's model, KB and
    demonstrations, then what the mode runs on them; the arms' rows (none in the other modes)."""
    import pandas as pd

    from benchmarks.kb_server import serve_index

    work = kb_workdir(s, kb_seed)
    w = Workdir(work)
    run(stages.prepare_model(w), "prepare the embedded policy", done=w.model / ".complete")
    kind = [] if s.kb_kind == "standard" else ["--kind", s.kb_kind]
    run(stages.knowledge_base(w, kb_seed) + kind, f"knowledge base seed {kb_seed} ({s.kb_kind})",
        done=w.kb / "test.parquet")
    val, rep = split_test(w.kb, s.val_n)
    kb_test = pd.read_parquet(w.kb / "test.parquet")
    kinds = dict(zip(kb_test["id"].astype(str), kb_test["kind"].astype(str)))
    questions = {str(r["id"]): r for r in kb_test.to_dict("records")}
    with serve_index(w.index, w.kb / "corpus.jsonl", log_path=work / "retriever.log") as url:
        run(stages.demonstrations(w, url, s.demos, s.demo_args.split()), "grounded demonstrations", done=w.demos)
        kb = KB(kb_seed, work, w, val, rep, url, kinds, questions)
        if s.mode == "curve":
            curves(kb, s, host)
            return []
        if s.mode == "choice":
            chosen(kb, s, host)
            return []
        return cells(kb, s, host)


def write_result(result: dict, path: Path, also: str | None) -> None:
    """A mode's JSON in its workdir, and at `--json` when given."""
    for p in (path, *([Path(also)] if also else [])):
        p.write_text(json.dumps(result, indent=1) + "\n")


# ----------------------------------------------------------------------------- the arms
def cells(kb: KB, s: Settings, host: str) -> list[dict]:
    """Each seed's cell on the KB (with sft_all, demonstrations of every training question first)."""
    import pandas as pd

    w_all = Workdir(kb.work, variant="_all")  # demonstrations of every training question: demos/kb_train_all.parquet
    if "sft_all" in s.arms:
        n_train = len(pd.read_parquet(kb.w.kb / "train.parquet", columns=["id"]))
        run(stages.demonstrations(w_all, kb.url, n_train, s.demo_args.split()),
            f"grounded demonstrations of all {n_train} training questions", done=w_all.demos)
    return [run_cell(kb.w, kb.work / f"seed{seed}", kb.seed, seed, kb.val, kb.rep, kb.url, kb.kinds, kb.questions, s,
                     w_all.demos, host) for seed in s.seeds]


def report_cells(rows: list[dict], s: Settings, host: str, t0: float) -> None:
    """The arms' result over every cell (this run's and `--with`'s rows): the table printed and
    written, the JSON, the plot and the record, in `settings.out_dir`."""
    out = out_dir(s)
    out.mkdir(parents=True, exist_ok=True)
    summ = summary(rows)
    text = table(rows, summ, host, s)
    print("\n" + text)
    result = {"kb_seeds": s.kb_seed, "dev_kb_seeds": DEV_KB_SEEDS, "arms": s.arms, "rows": rows, "summary": summ,
              "host": host, **{k: getattr(s, k) for k in MERGED}, "with": s.with_json,
              "wall_minutes": (time.time() - t0) / 60, "png": str(plot(rows, out / "rl_vs_sft.png"))}
    (out / "rl_vs_sft.md").write_text(text)
    write_result(result, out / "rl_vs_sft.json", s.json)
    kbs, best = ", ".join(map(str, s.kb_seed)), ", best checkpoints" if s.best_of_val else ""
    records.keep(s, "rl_vs_sft", result, files=[result["png"]], default_dir=out,
                 title=f"{', '.join(s.arms)} from one start, {s.minutes:g} minutes an arm (every second), "
                       f"{s.kb_kind} KB {kbs}, {s.demos} demonstrations{best}")


# ----------------------------------------------------------------------------- the start curve
def start_curve(w: Workdir, d: Path, seed: int, every: int, steps: int, rep: Path, url: str, limit: int,
                kinds: dict[str, str], questions: dict[str, dict] | None = None) -> list[dict]:
    """One start SFT to `steps`, its checkpoint every `every` steps evaluated on the report
    questions: [{step, em, by_kind, searches, strict_format}], and where the KB's questions tell the
    strategies apart (the lookalike kind) the better strategy's share of searches and
    `strategy_by_kind` (what the start policy's searches each way earn, before any arm runs)."""
    from agent_rl.evaluation import report

    run_dir = d / "start_curve"
    sft(w, run_dir, seed, steps, 24 * 3600, w.model, save_every=every)
    told = any(query_strategy("", q) is not None for q in (questions or {}).values())  # strategies told apart
    points = []
    for k in range(every, steps + 1, every):
        out = evaluate(w, run_dir / "checkpoints" / f"global_step_{k}", rep, url, d / f"eval_curve_{k}", limit)
        st = report.grouped_stats(out, "agent", kinds)
        a = st.pop(report.ALL)
        points.append({"step": k, "n": a["n"], "em": a["em"], "searches": a["searches_mean"],
                       "strict_format": 1 - a["invalid_format_rate"],
                       "by_kind": {g: st[g]["em"] for g in sorted(st)}})
        if told:
            points[-1]["better_strategy"] = better_share(strategy_counts(out, questions, kinds)[report.ALL])
            points[-1]["em_by_strategy"] = strategy_by_kind(out, questions, kinds)
    return points


def curves(kb: KB, s: Settings, host: str) -> None:
    """`--start-curve`: each seed's start curve on the KB, its table, JSON, plot and record."""
    every, steps = s.start_curve
    by_seed = {seed: start_curve(kb.w, kb.work / f"seed{seed}", seed, every, steps, kb.rep, kb.url, s.eval_limit,
                                 kb.kinds, kb.questions) for seed in s.seeds}
    text = curve_table(by_seed, host, s)
    print("\n" + text)
    result = {"kb_seed": kb.seed, "kb_kind": s.kb_kind, "dev_kb_seeds": DEV_KB_SEEDS, "every": every, "steps": steps,
              "eval_limit": s.eval_limit, "curves": {str(seed): c for seed, c in by_seed.items()}, "host": host,
              "png": str(curve_plot(by_seed, kb.work / "start_curve.png"))}
    (kb.work / "start_curve.md").write_text(text)
    write_result(result, kb.work / "start_curve.json", s.json)
    records.keep(s, "start_curve", result, files=[result["png"]], default_dir=kb.work,
                 title=f"Where SFT stops improving, KB {kb.seed}: the start the benchmark uses")


# ----------------------------------------------------------------------------- the choice
def chosen(kb: KB, s: Settings, host: str) -> None:
    """`--choose`: every grid point scored (run_choice), the rule's choice, its table, JSON and record."""
    seed = s.seeds[0]
    scored = run_choice(kb.w, kb.work / f"seed{seed}", seed, kb.val, kb.url, s)
    picked = choice.choose(scored)
    text = choice.table(scored, picked, host, s)
    print("\n" + text)
    # SETTINGS["shared"] holds kb_seed too: the command's list replaces the KB's seed, as the kept records have it
    result = {"kb_seed": kb.seed, "kb_kind": s.kb_kind, "seed": seed, "grid": choice.GRID, "candidates": scored,
              "chosen": picked, "host": host, **{k: getattr(s, k) for k in SETTINGS["choice"] + SETTINGS["shared"]}}
    (kb.work / "choice.md").write_text(text)
    write_result(result, kb.work / "choice.json", s.json)
    records.keep(s, "rl_vs_sft_choice", result, default_dir=kb.work,
                 title=f"The control arms' settings, chosen on the {s.kb_kind} kind's dev KB {kb.seed}")


def run_choice(w: Workdir, d: Path, seed: int, val: Path, url: str, s: Settings) -> dict[str, dict]:
    """The pre-registered choice of the control arms' settings (`--choose`, benchmarks/rl_vs_sft_choice.py):
    the cell's start, then every grid point as its arm from it (same minutes, clock and checkpoints as
    a reported run with --best-of-val) in `d`/choice/<name>, each checkpoint and the start scored on
    the running-evaluation questions. A point's scores go to its file (`point_file`), with the
    start's fingerprint, then its checkpoints (GiBs each) are deleted: a re-run reads the scores,
    also in another checkout that carried them (the choice takes hours on a CPU) once it has made
    the same start again. Returns {name: {arm, settings, steps, minutes, points, start}}."""
    from agent_rl.training.identity import model_fingerprint

    start = start_model(w, d, seed, s, url)
    start_id = model_fingerprint(start)
    start_val = evaluate(w, start, val, url, d / "val_start", s.val_n)
    scored = {}
    for arm, name, settings in choice.candidates():
        one = dataclasses.replace(s, **settings, best_of_val=True)  # cli.parse refused any given
        out, kept = d / "choice" / name, point_file(d, name, s)
        if not kept.exists():
            run_arm(w, arm, start, val, url, d / "choice", seed, one, name=name)
            points = val_points(w, d / "choice", name, val, url, one, {0: start_val})
            steps, minutes = trained(out)
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps({"arm": arm, "settings": settings, "steps": steps, "minutes": minutes,
                                        "points": points, "start": start_id}) + "\n")
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
        c = json.loads(kept.read_text())
        if c.get("start") != start_id:
            raise SystemExit(f"rl_vs_sft: {kept} was scored from another start than {start} (made on another host "
                             "kind or with other settings): its scores do not join this choice; move it away "
                             "to score that point again")
        scored[name] = {**c, "points": [tuple(p) for p in c["points"]]}
    return scored


def point_file(d: Path, name: str, s: Settings) -> Path:
    """Where a grid point's scores are kept: <--record-dir>/points/<name>.json when the record is
    kept (docs/results carries them to another checkout), else beside the point's run."""
    if s.record_dir:
        return Path(s.record_dir) / "points" / f"{name}.json"
    return d / "choice" / name / "points.json"
