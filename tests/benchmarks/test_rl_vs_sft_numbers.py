"""benchmarks/rl_vs_sft.py's numbers from evaluation folders and metrics written by hand (the
real runs take hours: not in CI): a seed's row (EM of the start, of the SFT arm and of the GRPO
arm, the paired GRPO - SFT difference, by question kind, time to gain against the SFT arm, and
SFT at GRPO's own minutes) and the summary over seeds (mean, median, worst)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_rl.evaluation import report  # noqa: E402
from benchmarks import rl_vs_sft, rl_vs_sft_tables as tables  # noqa: E402

KINDS = {"q1": "single", "q2": "single", "q3": "bridge", "q4": "bridge"}


def _write(d: Path, ems: list[float], searches: int = 1, hits: list[bool] | None = None) -> None:
    hits = hits or [False] * len(ems)
    recs = [{"id": f"q{i + 1}", "mode": "agent", "data_source": "kb", "em": em, "subem": em, "f1": em,
             "valid_format": True, "searches": searches, "turns": searches + 1, "prediction": "x",
             "retrieval_hit": hit} for i, (em, hit) in enumerate(zip(ems, hits))]
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    report.write_summary(report.summarize(recs), d)


def _metrics(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


SFT_STEPS = [{"step": i, "sft/loss": 2.0 - 0.1 * i, "training/elapsed_s": 100.0 * i} for i in range(1, 7)]
"""The SFT arm: 6 steps of 100 s in its 10 minutes."""


def _seed_dir(tmp: Path, start, more, grpo, val_more: float, val_points, matched=None) -> Path:
    d = tmp / "seed"
    _write(d / "eval_start", start)
    _write(d / "eval_sft_more", more, searches=1)
    _write(d / "eval_sft_matched", matched or start)
    _write(d / "eval_grpo", grpo, searches=2)
    _write(d / "val_sft_more", [val_more])
    _metrics(d / "sft_more", SFT_STEPS)
    _metrics(d / "sft_matched", SFT_STEPS)  # the same run again (its extra steps do not count)
    _metrics(d / "grpo", [{"step": s, "val/em": em, "training/elapsed_s": t} for s, t, em in val_points])
    return d


def test_a_seed_row_pairs_the_arms_on_the_same_questions(tmp_path):
    # start 1/4, SFT arm 2/4 (single-hop right), GRPO 3/4 (one bridge more): GRPO - SFT = +0.25
    d = _seed_dir(tmp_path, [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], val_more=0.0,
                  val_points=[(0, 0.0, 0.0), (2, 120.0, 0.0), (4, 240.0, 1.0)])
    r = rl_vs_sft.seed_row(7, d, KINDS, gain=0.05)
    assert (r["em_start"], r["em_sft_more"], r["em_grpo"]) == (0.25, 0.5, 0.75)
    assert r["grpo_minus_sft"]["diff"] == pytest.approx(0.25)
    assert r["grpo_minus_start"]["diff"] == pytest.approx(0.5)
    assert r["sft_more_minus_start"]["diff"] == pytest.approx(0.25)
    assert r["by_kind"]["bridge"] == {"start": 0.0, "sft_more": 0.0, "grpo": 0.5, "n": 2}
    assert r["by_kind"]["single"]["sft_more"] == 1.0
    assert (r["searches"]["sft_more"], r["searches"]["grpo"]) == (1.0, 2.0)
    # the SFT arm ran 6 steps in 10 minutes; GRPO passed its val EM (0.0) by 5 points at 4 minutes
    assert (r["sft_more_steps"], r["sft_more_minutes"]) == (6, 10.0)
    assert (r["grpo_steps"], r["grpo_minutes"]) == (4, 4.0)
    assert r["time_to_gain_min"] == 4.0 and r["time_to_gain_by"] == "trainer validation"
    # SFT at GRPO's 4 minutes: the SFT arm's first 2 steps (200 s; a third ends at 300), repeated
    assert (r["sft_matched_steps"], r["sft_matched_minutes"]) == (2, 200.0 / 60)
    assert r["em_sft_matched"] == 0.25 and r["grpo_minus_sft_matched"]["diff"] == pytest.approx(0.5)
    assert r["sft_matched_loss_gap"] == 0.0
    # q1-q3 right in some model, q4 in none; no model's context ever held a gold answer here
    assert r["headroom"] == {"any_right": 0.75, "never_retrieved": 1.0,
                             "never_retrieved_ids": ["q1", "q2", "q3", "q4"]}


def test_headroom_counts_questions_any_model_answered_or_retrieved(tmp_path):
    # q1 only the start answers, q2 only SFT at GRPO's minutes, q3 and q4 nobody; only q3's gold
    # answer never reached any model's context (q4's reached GRPO's): 2 of 4 right, 1 never retrieved
    d = tmp_path / "seed"
    _write(d / "eval_start", [1, 0, 0, 0], hits=[True, False, False, False])
    _write(d / "eval_sft_more", [0, 0, 0, 0], hits=[True, True, False, False])
    _write(d / "eval_sft_matched", [0, 1, 0, 0], hits=[False, True, False, False])
    _write(d / "eval_grpo", [0, 0, 0, 0], hits=[False, False, False, True])
    assert rl_vs_sft.headroom(d) == {"any_right": 0.5, "never_retrieved": 0.25, "never_retrieved_ids": ["q3"]}


def test_sft_at_grpos_minutes_is_the_sft_arms_prefix_by_its_own_step_times(tmp_path):
    grpo = tmp_path / "grpo"
    for secs, k in ((399.0, 3), (400.0, 4), (650.0, 6), (99.0, 0)):
        _metrics(grpo, [{"step": 1, "training/elapsed_s": 0.5 * secs}, {"step": 2, "training/elapsed_s": secs}])
        _metrics(tmp_path / "sft", SFT_STEPS)
        assert rl_vs_sft.matched_steps(tmp_path / "sft", grpo) == (k, 100.0 * k / 60)
    # the matched run repeats the SFT arm's first k steps: same losses (gap 0), or the gap says how far
    _metrics(tmp_path / "again", SFT_STEPS[:4])
    assert rl_vs_sft.same_steps_gap(tmp_path / "sft", tmp_path / "again", 4) == 0.0
    _metrics(tmp_path / "other", [{**r, "sft/loss": r["sft/loss"] + 0.01 * r["step"]} for r in SFT_STEPS[:4]])
    assert rl_vs_sft.same_steps_gap(tmp_path / "sft", tmp_path / "other", 4) == pytest.approx(0.04)
    assert rl_vs_sft.same_steps_gap(tmp_path / "sft", tmp_path / "again", 5) == float("inf")
    assert rl_vs_sft.same_steps_gap(tmp_path / "sft", tmp_path / "absent", 0) == 0.0


def test_time_to_gain_is_none_when_grpo_never_leads_the_sft_arm(tmp_path):
    d = _seed_dir(tmp_path, [0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], val_more=1.0,
                  val_points=[(0, 0.0, 0.0), (2, 60.0, 1.0)])
    assert rl_vs_sft.seed_row(1, d, KINDS, gain=0.05)["time_to_gain_min"] is None


def test_summary_gives_mean_median_and_the_worst_seed():
    rows = [{"grpo_minus_sft": {"diff": d}, "grpo_minus_start": {"diff": 0.1}, "sft_more_minus_start": {"diff": s},
             "grpo_minus_sft_matched": {"diff": d + 0.03}, "em_sft_matched": 0.5 + s, "em_start": 0.5}
            for d, s in ((0.10, 0.05), (-0.02, 0.0), (0.04, 0.10))]
    s = tables.summary(rows)
    assert s["mean"] == pytest.approx(0.04) and s["median"] == pytest.approx(0.04)
    assert (s["worst"], s["best"]) == (-0.02, 0.10)
    assert s["grpo_beats_sft_in_every_seed"] is False
    assert s["sft_more_minus_start_mean"] == pytest.approx(0.05)
    m = s["matched"]
    assert (m["mean"], m["worst"], m["best"]) == pytest.approx((0.07, 0.01, 0.13))
    assert m["grpo_beats_sft_in_every_seed"] is True and m["sft_minus_start_mean"] == pytest.approx(0.05)


def test_the_table_names_the_kb_the_host_and_every_seed(tmp_path):
    d = _seed_dir(tmp_path, [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], val_more=0.0,
                  val_points=[(0, 0.0, 0.0), (2, 120.0, 1.0)])
    row = rl_vs_sft.seed_row(3, d, KINDS, gain=0.05)
    args = argparse.Namespace(kb_seed=101, start_steps=44, minutes=10.0, gain=0.05)
    text = tables.table([row], tables.summary([row]), "[hardware] cpu='X'", args)
    assert "KB seed 101" in text and "[hardware] cpu='X'" in text
    assert "| 3 | 25.0 | 50.0 (6, 10.0) | 75.0 (2, 2.0) | +25.0 [" in text
    assert "| 25.0 (1, 1.7) | +50.0 [" in text  # SFT at GRPO's 2 minutes: 1 step of 100 s
    assert "worst seed +25.0" in text and "over 1 seed;" in text and "GRPO - SFT at GRPO's minutes: mean +50.0" in text
    assert "WARNING" not in text
    assert "at least one of the four models (start, SFT more, SFT at GRPO's minutes, GRPO): seed 3 75.0 " \
           "(gold never retrieved 100.0)" in text
    older = {k: v for k, v in row.items() if k != "headroom"}  # a row from an earlier run's JSON (--with)
    assert "at least one of the four" not in tables.table([older], tables.summary([older]), "", args)
    off = tables.table([{**row, "sft_matched_loss_gap": 0.004}], tables.summary([row]), "", args)
    assert "WARNING: seed 3's SFT at GRPO's minutes is not the SFT arm's run" in off and "0.004" in off
    assert tables.plot([row], tmp_path / "p.png").stat().st_size > 0


def test_a_finished_evaluation_does_not_need_its_model(tmp_path, monkeypatch):
    # a rerun with more seeds after a finished seed's GRPO checkpoints were deleted: the
    # evaluation that already ran is picked up; one still to run names the missing checkpoint
    from agent_rl.demo.stages import Workdir
    from agent_rl.evaluation.evaluate import EvalInputError

    ran = []
    monkeypatch.setattr(rl_vs_sft.stages, "run_stage", lambda cmd, what, tag: ran.append(cmd) or 0.0)
    w, run_dir = Workdir(tmp_path / "w"), tmp_path / "grpo"
    run_dir.mkdir()  # a GRPO run directory whose checkpoints are gone
    _write(tmp_path / "eval_done", [1, 0])
    out = rl_vs_sft.evaluate(w, run_dir, tmp_path / "q.parquet", "http://x", tmp_path / "eval_done", 2)
    assert out == tmp_path / "eval_done" and ran == []
    with pytest.raises(EvalInputError, match="not an HF model directory"):
        rl_vs_sft.evaluate(w, run_dir, tmp_path / "q.parquet", "http://x", tmp_path / "eval_new", 2)
    assert ran == []


def test_the_start_curve_trains_once_keeps_every_checkpoint_and_scores_each(tmp_path, monkeypatch):
    # one start SFT to 6 steps saving every 3 (all kept), then the checkpoints at 3 and 6 scored
    # on the report questions: EM overall and by kind, searches
    from agent_rl.demo.stages import Workdir

    ran = []
    monkeypatch.setattr(rl_vs_sft.stages, "run_stage", lambda cmd, what, tag: ran.append([str(c) for c in cmd]) or 0.0)
    d = tmp_path / "seed5"
    _write(d / "eval_curve_3", [1, 0, 0, 0], searches=2)
    _write(d / "eval_curve_6", [1, 1, 1, 0], searches=1)
    pts = rl_vs_sft.start_curve(Workdir(tmp_path / "w"), d, 5, 3, 6, tmp_path / "rep.parquet", "http://x", 4, KINDS)
    assert len(ran) == 1 and "trainer.total_training_steps=6" in ran[0] and "data.seed=5" in ran[0]
    assert "trainer.save_freq=3" in ran[0] and "trainer.max_ckpt_to_keep=null" in ran[0]
    assert [(p["step"], p["em"], p["searches"]) for p in pts] == [(3, 0.25, 2.0), (6, 0.75, 1.0)]
    assert pts[1]["by_kind"] == {"bridge": 0.5, "single": 1.0}
    args = argparse.Namespace(kb_seed=0, eval_limit=4)
    text = tables.curve_table({5: pts}, "[hardware] cpu='X'", args)
    assert "KB seed 0" in text and "[hardware] cpu='X'" in text
    assert "| 5 | 3 | 25.0 | 0.0 | 50.0 | 2.00 | 100.0 |" in text and "| 5 | 6 | 75.0 | 50.0 | 100.0 | 1.00 |" in text
    assert tables.curve_plot({5: pts}, tmp_path / "c.png").stat().st_size > 0


def test_the_start_follows_the_host_kind_unless_given(monkeypatch):
    # both kinds' curves on the dev KB chose 60; the lookup still goes by kind
    assert rl_vs_sft.START_STEPS == {True: 60, False: 60}
    monkeypatch.setattr(rl_vs_sft, "START_STEPS", {True: 60, False: 44})
    monkeypatch.setenv("AGENT_RL_NATIVE_BF16", "1")
    assert rl_vs_sft.default_start_steps() == 60
    monkeypatch.setenv("AGENT_RL_NATIVE_BF16", "0")
    assert rl_vs_sft.default_start_steps() == 44


def test_a_workdir_made_with_other_settings_is_refused_and_left_alone(tmp_path):
    def args(**kw):
        base = dict(kb_seed=101, demos=1500, demo_args="", eval_limit=200, val_n=40, start_steps=60,
                    minutes=10.0, val_every=2, overrides=[], start_curve=None, best_of_val=False, sft_val_every=10)
        return argparse.Namespace(**{**base, **kw})

    work = tmp_path / "kb101"
    rl_vs_sft.check_settings(work, args())
    rl_vs_sft.check_settings(work, args())  # the same settings: a re-run goes on
    recorded = (work / "settings.json").read_text()
    with pytest.raises(SystemExit, match=r"start_steps 60 there, 44 asked"):
        rl_vs_sft.check_settings(work, args(start_steps=44))
    with pytest.raises(SystemExit, match=r"best_of_val False there, True asked"):
        rl_vs_sft.check_settings(work, args(best_of_val=True))
    with pytest.raises(SystemExit, match=r"kb_seed 101 there, 102 asked.*overrides \[\] there"):
        rl_vs_sft.check_settings(work, args(kb_seed=102, overrides=["x=1"]))
    assert (work / "settings.json").read_text() == recorded
    # the start curve shares the KB and demonstrations, not the arms' settings
    rl_vs_sft.check_settings(work, args(start_curve=[20, 100], start_steps=44, minutes=3.0))
    with pytest.raises(SystemExit, match="start_curve"):
        rl_vs_sft.check_settings(work, args(start_curve=[10, 50]))


def test_earlier_runs_rows_count_only_under_the_same_settings_and_host_kind(tmp_path, capsys):
    xeon = "[hardware] cpu='Xeon' isa=amx torch=AVX512 threads=2 gpu=none native_bf16=yes (amx_bf16+avx512_bf16)"
    epyc = "[hardware] cpu='EPYC' isa=avx2 torch=AVX2 threads=2 gpu=none native_bf16=no (no amx_bf16)"
    d = _seed_dir(tmp_path, [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], val_more=0.0,
                  val_points=[(0, 0.0, 0.0), (2, 120.0, 1.0)])
    row = rl_vs_sft.seed_row(1, d, KINDS, gain=0.05)
    args = argparse.Namespace(kb_seed=101, start_steps=60, minutes=10.0, eval_limit=200, overrides=[], demo_args="",
                              demos=1500, val_n=40, val_every=2, seeds=[3], gain=0.05)
    old = {"kb_seed": 101, "start_steps": 60, "minutes": 10.0, "eval_limit": 200, "overrides": [], "demo_args": "",
           "host": xeon, "rows": [row, {**row, "seed": 2}]}  # an older file: no demos / val_n / val_every
    f = tmp_path / "old.json"
    f.write_text(json.dumps(old))
    got = rl_vs_sft.earlier_rows([str(f)], args, "native bf16")
    assert [(r["seed"], r["host"]) for r in got] == [(1, xeon), (2, xeon)]
    assert rl_vs_sft.host_kind_of(xeon) == "native bf16" and rl_vs_sft.host_kind_of(epyc) == "no native bf16 (fp32)"
    with pytest.raises(SystemExit, match="host kind 'native bf16' there, 'no native bf16 \\(fp32\\)' here"):
        rl_vs_sft.earlier_rows([str(f)], args, "no native bf16 (fp32)")
    for k, v, said in (("start_steps", 44, "start_steps 44 there, 60 here"), ("val_n", 50, "val_n 50 there, 40 here"),
                       ("overrides", ["x=1"], r"overrides \['x=1'\] there, \[\] here")):
        f.write_text(json.dumps({**old, k: v}))
        with pytest.raises(SystemExit, match=said):
            rl_vs_sft.earlier_rows([str(f)], args, "native bf16")
    f.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="seed 2 of --with .* counted twice"):
        rl_vs_sft.earlier_rows([str(f)], argparse.Namespace(**{**vars(args), "seeds": [2, 3]}), "native bf16")
    with pytest.raises(SystemExit, match="seed 1 of --with .* counted twice"):
        rl_vs_sft.earlier_rows([str(f), str(f)], args, "native bf16")
    # the table: the run's own host on top, the rows that ran elsewhere named under it
    rows = [*got, {**row, "seed": 3, "host": epyc}]
    text = tables.table(rows, tables.summary(rows), epyc, args)
    assert f"Seeds 1, 2 ran on: {xeon}" in text and "over 3 seeds" in text
    assert "Seed 3 ran on" not in text


def test_the_best_step_is_the_highest_running_em_and_a_tie_goes_to_fewer_steps():
    assert rl_vs_sft.best_step([(0, 0.8), (10, 0.85), (20, 0.85), (30, 0.7)]) == (10, 0.85)
    assert rl_vs_sft.best_step([(0, 0.8), (4, 0.65), (8, 0.75), (11, 0.8)]) == (0, 0.8)  # none beat the start
    assert rl_vs_sft.best_step([(0, 0.0), (5, 0.05)]) == (5, 0.05)


def _best_seed(tmp_path):
    """A seed whose SFT arm kept checkpoints 2, 4 and 6 (its last) and GRPO 2 and 3 (its last):
    on the running-evaluation questions SFT peaks at step 4 (1.0; 6 overfits to 0.5) and GRPO never
    passes the start (0.5 at step 0, 0.5 at 2, 0.0 at 3): GRPO's best is the start."""
    d = _seed_dir(tmp_path, [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], val_more=0.5,
                  val_points=[(0, 0.0, 0.5), (2, 120.0, 0.5), (3, 180.0, 0.0)])
    for arm, steps in (("sft_more", (2, 4, 6)), ("grpo", (2, 3))):
        for k in steps:
            (d / arm / "checkpoints" / f"global_step_{k}").mkdir(parents=True)
    (d / "sft_more" / "checkpoints" / "global_step_8.tmp").mkdir()  # a killed save: not a checkpoint
    _write(d / "val_start", [0.5])
    for name, em in (("val_sft_more_2", 0.0), ("val_sft_more_4", 1.0), ("val_grpo_2", 0.5), ("val_grpo_3", 0.0)):
        _write(d / name, [em])
    _write(d / "eval_sft_more_4", [1, 1, 1, 1], searches=2)  # the SFT arm's best on the report questions
    return d


def test_each_arm_keeps_its_best_checkpoint_by_the_running_evaluation(tmp_path, monkeypatch):
    # every evaluation was made by hand: nothing runs (a stage that ran would be a defect here)
    from agent_rl.demo.stages import Workdir

    monkeypatch.setattr(rl_vs_sft.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    assert rl_vs_sft.checkpoint_steps(d / "sft_more") == [2, 4, 6]
    args = argparse.Namespace(val_n=1, eval_limit=4)
    w, q = Workdir(tmp_path / "w"), tmp_path / "q.parquet"
    first = {0: (d / "val_start", d / "eval_start")}
    sft = rl_vs_sft.best_checkpoint(w, d, "sft_more", q, q, "http://x", args,
                                    {**first, 6: (d / "val_sft_more", d / "eval_sft_more")})
    grpo = rl_vs_sft.best_checkpoint(w, d, "grpo", q, q, "http://x", args, {**first, 3: (None, d / "eval_grpo")})
    assert sft["val_points"] == [(0, 0.5), (2, 0.0), (4, 1.0), (6, 0.5)]
    assert (sft["step"], sft["val_em"], sft["eval"]) == (4, 1.0, str(d / "eval_sft_more_4"))
    assert sft["minutes"] == pytest.approx(400.0 / 60)  # SFT_STEPS: 100 s a step
    assert (grpo["step"], grpo["minutes"], grpo["eval"]) == (0, 0.0, str(d / "eval_start"))
    row = rl_vs_sft.best_row(d, KINDS, sft, grpo)
    # report questions: start 1/4, SFT's best 4/4, GRPO's best (the start) 1/4
    assert (row["sft"]["em"], row["grpo"]["em"]) == (1.0, 0.25)
    assert row["grpo_minus_sft"]["diff"] == pytest.approx(-0.75)
    assert row["sft_minus_start"]["diff"] == pytest.approx(0.75) and row["grpo_minus_start"]["diff"] == 0.0
    # a workdir whose arm kept no checkpoint (trained without --best-of-val) is named, not guessed at
    with pytest.raises(SystemExit, match="kept no checkpoints"):
        rl_vs_sft.best_checkpoint(w, d, "sft_matched", q, q, "http://x", args, first)


def test_time_to_gain_by_the_checkpoints_scores_counts_the_first_checkpoint_past_the_bar(tmp_path):
    d = _best_seed(tmp_path)  # GRPO's checkpoints by the evaluation command: 0.5 at steps 0 and 2, 0.0 at 3
    points = [(3, 0.0), (0, 0.5), (2, 0.5)]  # in any order: the first by step counts
    assert rl_vs_sft.checkpoint_time_to_gain(d / "grpo", points, 0.5) == 2.0  # step 2 ended at 120 s
    assert rl_vs_sft.checkpoint_time_to_gain(d / "grpo", points, 0.55) is None  # the start never counts
    assert rl_vs_sft.checkpoint_time_to_gain(d / "grpo", [(0, 1.0), (3, 0.0)], 0.5) is None
    assert rl_vs_sft.minutes_to([(0, 0.0, 0.9), (4, 4.0, 0.6), (2, 2.0, 0.7)], 0.7) == 2.0


def test_the_table_marks_a_time_to_gain_the_trainer_scored():
    args = argparse.Namespace(kb_seed=101, start_steps=60, minutes=10.0, gain=0.05)
    kind = {"start": 0.5, "sft_more": 0.5, "grpo": 0.5, "n": 2}
    p = {"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    row = {"seed": 1, "em_start": 0.5, "em_sft_more": 0.5, "em_grpo": 0.5, "em_sft_matched": 0.5,
           "grpo_minus_sft": p, "grpo_minus_start": p, "sft_more_minus_start": p, "grpo_minus_sft_matched": p,
           "by_kind": {"single": kind}, "searches": {"start": 1.0, "sft_more": 1.0, "grpo": 1.0},
           "sft_more_steps": 6, "sft_more_minutes": 10.0, "grpo_steps": 4, "grpo_minutes": 9.0,
           "sft_matched_steps": 5, "sft_matched_minutes": 8.3, "sft_matched_loss_gap": 0.0,
           "time_to_gain_min": 4.0, "time_to_gain_by": "evaluation command"}
    older = {k: v for k, v in row.items() if k != "time_to_gain_by"}  # a row of a run before the key
    both = tables.table([row, {**older, "seed": 2}], tables.summary([row, {**older, "seed": 2}]), "", args)
    assert "| 4.0 |" in both and "| 4.0 * |" in both and "* minutes to +5 from the trainer's" in both
    alone = tables.table([row], tables.summary([row]), "", args)
    assert "| 4.0 |" in alone and "*" not in alone


def test_the_table_adds_the_best_checkpoints_only_for_rows_that_have_them(tmp_path, monkeypatch):
    from agent_rl.demo.stages import Workdir

    monkeypatch.setattr(rl_vs_sft.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    args = argparse.Namespace(kb_seed=101, start_steps=60, minutes=10.0, gain=0.05, val_n=1, eval_limit=4)
    w, q = Workdir(tmp_path / "w"), tmp_path / "q.parquet"
    first = {0: (d / "val_start", d / "eval_start")}
    row = rl_vs_sft.seed_row(1, d, KINDS, gain=0.05)
    row["best_checkpoints"] = rl_vs_sft.best_row(
        d, KINDS, rl_vs_sft.best_checkpoint(w, d, "sft_more", q, q, "http://x", args,
                                            {**first, 6: (d / "val_sft_more", d / "eval_sft_more")}),
        rl_vs_sft.best_checkpoint(w, d, "grpo", q, q, "http://x", args, {**first, 3: (None, d / "eval_grpo")}))
    older = {k: v for k, v in row.items() if k != "best_checkpoints"}
    rows = [row, {**older, "seed": 2}]
    summ = tables.summary(rows)
    assert summ["best_checkpoints"]["seeds"] == 1 and summ["best_checkpoints"]["mean"] == pytest.approx(-0.75)
    text = tables.table(rows, summ, "", args)
    assert "| 1 | 4 (6.7 min), 100.0 | 0 (0.0 min), 50.0 | 25.0 / 100.0 / 25.0 | -75.0 [" in text
    assert "GRPO best - SFT best: mean -75.0" in text and "over 1 seed." in text
    assert "| 2 | 4 (" not in text
    assert "best checkpoint" not in tables.table([older], tables.summary([older]), "", args)
    json.dumps(row)  # the row goes into the benchmark's JSON as it is


def test_the_plot_draws_best_checkpoints_by_one_scorer(tmp_path):
    # a --best-of-val row: six bars (the four arms, then each arm's best checkpoint); the right
    # panel's line is the evaluation command's score of GRPO's checkpoints at the trainer's minutes
    # for those steps (step 6 has no trainer point: not drawn), against SFT's best checkpoint
    row = {"seed": 1, "em_start": 0.5, "em_sft_more": 0.4, "em_sft_matched": 0.45, "em_grpo": 0.6,
           "val_em_sft_more": 0.3,
           "val_points": [[0, 0.0, 0.5], [4, 2.5, 0.7], [8, 5.0, 0.9]],
           "best_checkpoints": {"sft": {"em": 0.55, "val_em": 0.65, "val_points": [[0, 0.65], [10, 0.6]]},
                                "grpo": {"em": 0.7, "val_em": 0.8, "val_points": [[0, 0.65], [4, 0.8], [6, 0.75], [8, 0.7]]}}}
    assert tables.bars(row) == [("start SFT", 0.5), ("SFT, same budget", 0.4), ("SFT, GRPO's minutes", 0.45),
                                ("GRPO", 0.6), ("SFT's best checkpoint", 0.55), ("GRPO's best checkpoint", 0.7)]
    assert tables.running_curve(row) == ([(0.0, 0.65), (2.5, 0.8), (5.0, 0.7)], 0.65)
    older = {k: v for k, v in row.items() if k != "best_checkpoints"}  # without --best-of-val: the trainer's
    assert len(tables.bars(older)) == 4
    assert tables.running_curve(older) == ([(0.0, 0.5), (2.5, 0.7), (5.0, 0.9)], 0.3)
    assert tables.plot([row, {**older, "seed": 2}], tmp_path / "p.png").stat().st_size > 0  # six bars beside four


def test_a_seeds_per_question_file_holds_every_models_answers_and_the_checkpoints_scores(tmp_path, monkeypatch):
    from agent_rl.demo.stages import Workdir

    monkeypatch.setattr(rl_vs_sft.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    args = argparse.Namespace(val_n=1, eval_limit=4)
    w, q = Workdir(tmp_path / "w"), tmp_path / "q.parquet"
    first = {0: (d / "val_start", d / "eval_start")}
    row = rl_vs_sft.seed_row(3, d, KINDS, gain=0.05)
    without = json.loads(json.dumps(rl_vs_sft.per_question(d, KINDS, row)))  # as the file holds it
    assert sorted(without["models"]) == ["grpo", "sft_matched", "sft_more", "start"]
    assert without["running_evaluation"] == {"grpo_trainer_validation": {"0": 0.5, "2": 0.5, "3": 0.0}}
    row["best_checkpoints"] = rl_vs_sft.best_row(
        d, KINDS, rl_vs_sft.best_checkpoint(w, d, "sft_more", q, q, "http://x", args,
                                            {**first, 6: (d / "val_sft_more", d / "eval_sft_more")}),
        rl_vs_sft.best_checkpoint(w, d, "grpo", q, q, "http://x", args, {**first, 3: (None, d / "eval_grpo")}))
    got = json.loads(json.dumps(rl_vs_sft.per_question(d, KINDS, row)))
    assert got["seed"] == 3
    # GRPO 3/4: q1-q3 right (q3 a bridge), 2 searches each; SFT's best (step 4) all four
    assert got["models"]["grpo"] == {"em": 75.0, "searches": 2.0, "by_kind": {"bridge": 50.0, "single": 100.0},
                                     "em_by_id": {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}}
    assert got["models"]["sft_more"]["em_by_id"] == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert got["models"]["sft_best_step_4"]["em"] == 100.0
    assert got["models"]["grpo_best_step_0"] == got["models"]["start"]  # GRPO never passed its start
    assert got["running_evaluation"] == {"sft_more": {"0": 0.5, "2": 0.0, "4": 1.0, "6": 0.5},
                                         "grpo": {"0": 0.5, "2": 0.5, "3": 0.0},
                                         "grpo_trainer_validation": {"0": 0.5, "2": 0.5, "3": 0.0}}
