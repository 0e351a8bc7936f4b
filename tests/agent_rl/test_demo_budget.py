"""The demo's budget: the stages fit the time left, GRPO gets its share, a re-fit keeps GRPO at
the edge, the default budget follows the host; the report; how an interrupted stage stops."""

from __future__ import annotations

import os
import sys
import time

import pytest

from agent_rl.demo.budget import (SIZES, STANDARD, Speeds, default_budget_minutes, eval_overrun, fit_budget,
                                  needed_s, rl_seconds_left, rl_skipped, shape_overrides)

BUDGET_MINUTES, EVAL_LIMIT, MIN_RL_STEPS = SIZES.budget_minutes, SIZES.eval_limit, SIZES.min_rl_steps
RL_SHARE, SFT_STEPS = SIZES.rl_share, SIZES.sft_steps
SMALL = SIZES.shapes[1]

# calibrated speeds (update tok/s, generation tok/s, engine load s): an AVX2 host in fp32 and
# an AVX512-BF16 host in bf16, as measured by `python -m agent_rl.demo calibrate`
SLOW = Speeds(130.0, 100.0, 8.0)
FAST = Speeds(900.0, 800.0, 10.0)


@pytest.mark.parametrize("sp", [SLOW, FAST])
@pytest.mark.parametrize("remaining_s", [900.0, 1200.0, 2000.0])
def test_plan_fits_the_time_left(sp, remaining_s):
    plan = fit_budget(remaining_s, sp)
    total = sum(plan.estimate_s.values())
    if plan.sft_minutes > 1.0:  # SFT is not at its floor: the plan fills the time, no more
        assert total == pytest.approx(remaining_s), plan.describe()
    assert 100 <= plan.eval_limit <= EVAL_LIMIT and plan.sft_steps >= 1
    assert ("grpo" in plan.estimate_s) == (plan.rl_minutes > 0) == ("evaluate SFT+RL" in plan.estimate_s)


def test_grpo_gets_its_share_of_the_training_minutes():
    # SLOW: SFT_STEPS would take more than SFT's share, so the share decides
    plan = fit_budget(1550.0, SLOW, min_eval_limit=None)
    assert 12 <= plan.sft_steps < SFT_STEPS and plan.rl_steps >= 1
    assert plan.rl_minutes == pytest.approx(RL_SHARE / (1 - RL_SHARE) * plan.sft_minutes)


def test_sft_stops_at_its_steps_and_grpo_gets_the_rest():
    """Where SFT's share would buy more than SFT_STEPS (past which the demonstrations teach no
    more), SFT gets those steps' minutes and GRPO everything else."""
    plan = fit_budget(1080.0, FAST)
    assert plan.rl_steps >= MIN_RL_STEPS
    assert plan.sft_minutes == pytest.approx(SFT_STEPS * FAST.sft_step_s / 60) and plan.sft_steps == SFT_STEPS
    assert plan.rl_minutes > RL_SHARE / (1 - RL_SHARE) * plan.sft_minutes
    assert sum(plan.estimate_s.values()) == pytest.approx(1080.0)


def test_a_slow_host_compares_on_fewer_questions_before_it_drops_grpo():
    fast, slow = fit_budget(1300.0, FAST), fit_budget(1300.0, SLOW, shapes=(STANDARD,))
    assert fast.eval_limit == EVAL_LIMIT and fast.rl_steps >= MIN_RL_STEPS and fast.shape == STANDARD
    # the standard shape alone: fewer questions, and no limit fits min_rl_steps, so the most steps
    assert 100 <= slow.eval_limit < EVAL_LIMIT and 0 < slow.rl_steps < MIN_RL_STEPS
    # the small shape fits min_rl_steps on every question: it is taken
    small = fit_budget(1300.0, SLOW)
    assert small.shape == SMALL and small.eval_limit == EVAL_LIMIT and small.rl_steps >= MIN_RL_STEPS
    # the limit kept: no GRPO fits in the standard shape
    assert fit_budget(1300.0, SLOW, min_eval_limit=None, shapes=(STANDARD,)).rl_minutes == 0
    # with little time even 100 questions leave too little: SFT and its evaluation only
    plan = fit_budget(900.0, SLOW, shapes=(STANDARD,))
    assert plan.rl_minutes == 0 and plan.rl_steps == 0 and "grpo" not in plan.estimate_s
    assert plan.eval_limit == EVAL_LIMIT and plan.estimate_s["sft"] > 60
    # and with less still, no shape: the standard one's plan without GRPO
    plan = fit_budget(500.0, SLOW)
    assert plan.rl_minutes == 0 and plan.shape == STANDARD and plan.base_eval_limit == STANDARD.base_eval_limit


# the calibration `make demo` measured on a 2-core AVX2 host in fp32 (record demo_fp32_avx2)
AVX2 = Speeds(84.0, 57.0, 15.5)


def test_an_avx2_host_runs_its_least_grpo_steps_in_the_small_shape():
    """On the 33-minute budget the AVX2 demo had 28.9 minutes after calibration and ran no GRPO
    step (record demo_fp32_avx2). The standard shape still fits none; the small one fits
    min_rl_steps. By hand, at 100 questions: a small step (5440/57 + 14400/84) / 2 = 133.4 s;
    fixed 30 + 40 + base (35.5 + 10 x 250/57 = 79.4) + SFT agent (35.5 + 100 x 100/57 = 210.9)
    + GRPO (45 + 15.5 + 2 x 20 x 100/57 = 130.7) + SFT+RL 210.9 = 701.9 s; training 1032.1 s, 0.4
    of it 412.8 s to GRPO (3.09 steps), 619.3 s to SFT (11 steps of 54.3 s). At 120 questions
    GRPO would get 2.86 steps: too few, so 100."""
    remaining = 1734.0
    assert fit_budget(remaining, AVX2, shapes=(STANDARD,)).rl_minutes == 0
    plan = fit_budget(remaining, AVX2)
    assert plan.shape == SMALL and plan.eval_limit == 100 and plan.base_eval_limit == 10
    assert plan.rl_steps == MIN_RL_STEPS == 3 and plan.rl_minutes * 60 == pytest.approx(412.84, abs=0.05)
    assert plan.sft_minutes * 60 == pytest.approx(619.26, abs=0.05) and plan.sft_steps == 11
    assert sum(plan.estimate_s.values()) == pytest.approx(remaining)
    assert "the small shape" in plan.describe() and "4 prompts instead of 8" in plan.describe()
    # 84 s less: at 100 questions GRPO's share is 0.4 x 948.1 = 379.2 s (2.84 steps), so 80
    # questions (fixed 631.8 s, 0.4 x 1018.2 = 407.3 s: 3.05 steps)
    tight = fit_budget(1650.0, AVX2)
    assert tight.shape == SMALL and tight.eval_limit == 80 and tight.rl_steps == 3
    assert tight.rl_minutes * 60 == pytest.approx(407.3, abs=0.1)
    # where no limit fits min_rl_steps, the plan with the most GRPO steps
    short = fit_budget(1500.0, AVX2)
    assert short.rl_steps == 2 and short.rl_steps == max(
        fit_budget(1500.0, AVX2, eval_limit=n, min_eval_limit=None, shapes=(SMALL,)).rl_steps for n in range(60, 201, 20))


def test_the_small_shape_overrides_the_grpo_batch_only():
    assert shape_overrides(STANDARD) == []
    assert shape_overrides(SMALL) == ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]
    assert AVX2.step_s(SMALL) == pytest.approx(AVX2.rl_step_s / 2) and AVX2.step_s(STANDARD) == AVX2.rl_step_s
    assert SMALL.sft_eval == "rl" and STANDARD.sft_eval == "sft"  # agent mode alone costs an agent evaluation


def test_demonstrations_do_not_depend_on_the_calibration():
    """SFT stops on the clock, not at the planned step count: a calibration taken while the host
    was busy (fewer planned steps) must not leave SFT repeating a small set of demonstrations."""
    assert fit_budget(1100.0, SLOW).demos == fit_budget(1100.0, FAST).demos == 1500
    assert fit_budget(1100.0, FAST, max_demos=400).demos == 400


def test_a_re_plan_does_not_drop_grpo_at_the_edge():
    """The plan after the demonstrations revises one that runs GRPO: it does not charge the
    demonstrations again, and a few seconds less than estimated keep GRPO (with fewer steps)
    instead of dropping it at the MIN_RL_STEPS / 2 edge and giving SFT every minute."""
    edge = next(t for t in range(600, 3000, 5) if fit_budget(float(t), SLOW, min_eval_limit=None).rl_minutes > 0)
    first = fit_budget(float(edge), SLOW, min_eval_limit=None)
    later = edge - 30.0  # the demonstrations took 30 s longer than their estimate... and more
    assert fit_budget(later - 15.0, SLOW, min_eval_limit=None).rl_minutes == 0  # a fresh plan drops it
    revised = fit_budget(later - 15.0, SLOW, min_eval_limit=None, demos_built=True, keep_rl=True)
    assert revised.rl_minutes > 0 and "demonstrations" not in {k for k, v in revised.estimate_s.items() if v}
    assert revised.eval_limit == first.eval_limit
    # kept only while a step fits
    assert fit_budget(300.0, SLOW, min_eval_limit=None, demos_built=True, keep_rl=True).rl_minutes == 0


def test_the_default_budget_grows_with_what_the_host_needs():
    assert default_budget_minutes(FAST, spent_s=120) == BUDGET_MINUTES[0]  # a fast host: the short budget
    slow = default_budget_minutes(SLOW, spent_s=120)
    assert slow == pytest.approx(min(BUDGET_MINUTES[1], (120 + needed_s(SLOW)) / 60 + 0.5))
    assert BUDGET_MINUTES[0] < slow <= BUDGET_MINUTES[1]
    # inside that budget the slow host's plan runs GRPO
    assert fit_budget(60 * slow - 120, SLOW).rl_minutes > 0
    # a host with native bf16 keeps the short budget even where it is slow (README: within 20 min)
    assert default_budget_minutes(SLOW, spent_s=120, native_bf16=True) == BUDGET_MINUTES[0]


def test_grpo_is_re_planned_with_the_time_left():
    left = rl_seconds_left(600.0, FAST, EVAL_LIMIT)
    # the two validations on the selection questions: 2 x 40 questions x 100 tokens at 800 tok/s
    assert FAST.select_s() == pytest.approx(2 * 40 * 100 / 800.0)
    assert left == pytest.approx(600.0 - 45 - FAST.engine_load_s - FAST.select_s() - FAST.eval_s(EVAL_LIMIT, "rl"))
    assert rl_seconds_left(10.0, FAST, EVAL_LIMIT) == 0.0


def test_grpo_is_charged_for_evaluations_that_ran_over():
    """Where the SFT evaluation took longer than estimated (the fp32 emulation: 20-50% over),
    GRPO's validations and the SFT+RL evaluation are charged as much more, out of GRPO's minutes;
    an evaluation that ran faster changes nothing."""
    assert eval_overrun(130.0, 100.0) == pytest.approx(1.3)
    assert eval_overrun(80.0, 100.0) == 1.0 and eval_overrun(5.0, 0.0) == 1.0
    # SLOW: select_s = 2 x 40 x 100 / 100 = 80 s; eval_s(200, "rl") = 8 + 20 + 200 x 100 / 100 = 228 s
    assert SLOW.select_s() + SLOW.eval_s(EVAL_LIMIT, "rl") == pytest.approx(308.0)
    plain, over = rl_seconds_left(900.0, SLOW, EVAL_LIMIT), rl_seconds_left(900.0, SLOW, EVAL_LIMIT, 1.5)
    assert plain == pytest.approx(900.0 - 45 - 8 - 308.0)
    assert plain - over == pytest.approx(0.5 * 308.0)
    assert rl_seconds_left(400.0, SLOW, EVAL_LIMIT, 1.5) == 0.0


def test_a_skipped_grpo_names_the_budget_that_runs_its_least_steps():
    """Where GRPO did not fit, the demo says what min_rl_steps steps would need and the budget
    that fits them. SLOW by hand: a step 5440/100 + 14400/130 = 165.17 s, three 495.5 s; GRPO's
    fixed part 45 + 8 + (80 + 228) = 361 s, its evaluations charged 1.5x: 53 + 462 = 515 s."""
    s = rl_skipped(300.0, 33.0, SLOW, EVAL_LIMIT)
    assert s["steps"] == MIN_RL_STEPS == 3 and s["minutes_left"] == pytest.approx(5.0)
    assert s["minutes_needed"] == pytest.approx((361 + 3 * (54.4 + 14400 / 130)) / 60)  # 14.28
    assert s["budget_to_run"] == 43  # ceil(33 + (856.5 - 300) / 60 = 42.28)
    assert rl_skipped(300.0, 33.0, SLOW, EVAL_LIMIT, 1.5)["budget_to_run"] == 45  # ceil(33 + 11.84)
    # a budget that left what the steps need would have run them: then GRPO's share is positive
    need_s = 60 * s["minutes_needed"]
    assert rl_seconds_left(need_s, SLOW, EVAL_LIMIT) == pytest.approx(3 * SLOW.rl_step_s)


def test_report_says_first_that_grpo_did_not_run_and_how_to_run_it(tmp_path):
    """A demo whose budget fit no GRPO step (a 2-core AVX2 host at the default budget) said so
    only in its log; the report compared nothing and did not say why. Now its first section does,
    and the record's headline says 0 steps."""
    import json

    from agent_rl.evaluation import report
    from agent_rl.demo.budget import Budget
    from agent_rl.demo.records import read_record
    from agent_rl.demo.report import write_report

    recs = [{"mode": "agent", "data_source": "kb", "id": f"q{i}", "em": float(i < 2), "subem": 0.0, "f1": 0.0,
             "searches": 1, "turns": 2, "valid_format": True, "retrieval_hit": 1.0, "prediction": "x"} for i in range(4)]
    d = tmp_path / "sft"
    d.mkdir()
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    report.write_summary(report.summarize(recs), d)
    plan = Budget(demos=1500, sft_minutes=16.9, rl_minutes=0, eval_limit=4, base_eval_limit=4,
                  estimate_s={"sft": 1000.0}, budget_minutes=33.0,
                  calibration={"update_tok_s": 84.0, "gen_tok_s": 57.0})
    skipped = rl_skipped(0.0, 33.0, Speeds(84.0, 57.0, 30.0), EVAL_LIMIT)
    md = write_report(tmp_path, {"SFT": d}, None, plan, None, skipped=skipped).read_text()
    assert md.index("## GRPO did not run") < md.index("Every model and mode")
    assert "update 84 tok/s, generation 57 tok/s" in md
    assert f"`python -m agent_rl.demo --budget-minutes {skipped['budget_to_run']}` fits them" in md
    assert "What GRPO adds" not in md
    assert read_record(tmp_path).headline["GRPO steps"].startswith("0 ")
    md = write_report(tmp_path, {"SFT": d}, None, plan, None, skipped={"rl_minutes": 0.0}).read_text()
    assert "(`--rl-minutes 0` asked for that)" in md


def test_report_leads_with_what_grpo_adds(tmp_path):
    """write_report on evaluation dirs and a GRPO run written here: the SFT vs SFT+RL table
    (paired, by question kind) comes first, then the PNG, then every model and mode."""
    import json

    import pandas as pd

    from agent_rl.evaluation import report
    from agent_rl.demo.budget import Budget
    from agent_rl.demo.report import write_report

    kinds = ["single", "bridge", "comparison", "bridge"]
    pd.DataFrame({"id": [f"q{i}" for i in range(4)], "kind": kinds}).to_parquet(tmp_path / "test.parquet")

    def eval_dir(name, modes, ems):
        recs = [{"mode": m, "data_source": "kb", "id": f"q{i}", "em": e, "subem": e, "f1": e, "searches": 1,
                 "turns": 2, "valid_format": True, "retrieval_hit": 1.0, "prediction": "x"}
                for m in modes for i, e in enumerate(ems)]
        d = tmp_path / name
        d.mkdir()
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        report.write_summary(report.summarize(recs), d)
        return d

    evals = {"base": eval_dir("base", ("agent", "rag", "direct"), [0, 0, 0, 0]),
             "SFT": eval_dir("sft", ("agent", "rag", "direct"), [1, 0, 0, 0]),
             "SFT+RL": eval_dir("rl", ("agent",), [1, 1, 0, 1])}
    rl = tmp_path / "grpo"
    rl.mkdir()
    (rl / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s, "reward/em": 0.05 * s,
                                                          "reward/valid_format": 1.0, "rollout/searches_mean": 1.5})
                                              + "\n" for s in range(1, 6)))
    plan = Budget(demos=200, sft_minutes=5, rl_minutes=5, eval_limit=4, base_eval_limit=4, estimate_s={"sft": 300.0},
                budget_minutes=18)
    md = write_report(tmp_path, evals, rl, plan, tmp_path / "test.parquet").read_text()
    assert md.index("What GRPO adds") < md.index("grpo_curves.png") < md.index("Every model and mode")
    assert "| SFT+RL − SFT, paired 95% CI | **+50.0**" in md and "bridge (n=2)" in md and "comparison (n=1)" in md
    assert (tmp_path / "grpo_curves.png").stat().st_size > 0
    summary = json.loads((tmp_path / "plan.json").read_text())
    assert summary["sft_vs_rl"]["diff"]["bridge"]["diff"] == 1.0 and summary["plan"]["budget_minutes"] == 18
    assert "hands over" not in md and "selection" not in summary  # no selection: none reported
    assert "agent-rl-eval show" not in md  # the run kept no rollouts: nothing to point at
    # GRPO lost on the selection questions: the SFT model is handed over (+0.0), GRPO's +50.0 still shown
    chosen = {"n": 40, "alpha": 0.05, "sft_em": 0.5, "rl_em": 0.4, "rl_step": 5, "wins": 1, "losses": 5, "p": 0.219,
              "chosen": "SFT", "model": "sft"}
    md = write_report(tmp_path, evals, rl, plan, tmp_path / "test.parquet", chosen=chosen).read_text()
    assert md.index("hands over: the SFT model") < md.index("What GRPO adds") and "**+50.0**" in md
    summary = json.loads((tmp_path / "plan.json").read_text())
    assert summary["selection"] == {**chosen, "handed_over_minus_sft": 0.0}
    chosen.update(rl_em=0.6, wins=7, losses=3, p=0.344, chosen="SFT+RL")
    (rl / "rollouts").mkdir()  # the demo's GRPO run keeps a few rollouts (trainer.rollout_data_dir), steps 2 and 10
    for step in (10, 2):
        (rl / "rollouts" / f"{step}.jsonl").write_text("{}\n")
    md = write_report(tmp_path, evals, rl, plan, tmp_path / "test.parquet", chosen=chosen).read_text()
    assert f"GRPO's sampled rollouts (steps 2, 10): `agent-rl-eval show {rl / 'rollouts'}` prints them" in md
    assert json.loads((tmp_path / "plan.json").read_text())["selection"]["handed_over_minus_sft"] == 0.5
    from agent_rl.demo.records import read_record

    rec = read_record(tmp_path)  # the run's record beside its report, its figures plan.json's
    assert rec.benchmark == "make demo" and rec.headline["the model handed over − its SFT model"] == "+50.0"
    assert rec.headline["GRPO's own model − its SFT model"].startswith("+50.0 [") and "(4 questions)" in \
        rec.headline["GRPO's own model − its SFT model"]
    assert {"plan.json", "report.md", "grpo_curves.png"} <= set(rec.files) and rec.settings["plan"]["budget_minutes"] == 18


# ----------------------------------------------------------------------------- stopping a stage
CHILD = """
import sys, time
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    open(sys.argv[1], "w").write("cleaned up")
    sys.exit(130)
"""


@pytest.mark.parametrize("main_thread_blocks_it", [False, True])
@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_sigterm_to_the_demo_stops_its_stage_as_ctrl_c_would(tmp_path, main_thread_blocks_it, sigint_ignored):
    """`kill <demo>` must let the running stage clean up (its finally blocks: a checkpoint, Ray
    shut down, the GPU freed): the stage gets SIGINT, not SIGKILL (a killed GRPO stage left its
    Ray workers holding an H200's memory, docs/gpu.md). Also when the kernel hands the signal to
    another thread (here: the main thread blocks it), which does not interrupt the main
    thread's wait for the stage; and when the demo was started with SIGINT ignored, as a
    non-interactive shell starts a background job (CI's does: its stage slept on)."""
    import signal
    import threading

    from agent_rl.demo import stages

    marker = tmp_path / "marker"
    old, old_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stages._TERMINATED.clear()
    try:
        if sigint_ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        stages.stop_on_sigterm()
        threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()  # its thread takes SIGTERM
        if main_thread_blocks_it:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        t0 = time.time()
        with pytest.raises(KeyboardInterrupt):
            stages.run_stage([sys.executable, "-c", CHILD, str(marker)], "a stage that sleeps")
        assert time.time() - t0 < 30
        assert marker.read_text() == "cleaned up"
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)
        stages._TERMINATED.clear()


def test_a_failing_stage_raises_with_its_exit_code(monkeypatch):
    import subprocess

    from agent_rl.demo import stages

    with pytest.raises(subprocess.CalledProcessError) as e:
        stages.run_stage([sys.executable, "-c", "import sys; sys.exit(3)"], "a failing stage")
    assert e.value.returncode == 3
