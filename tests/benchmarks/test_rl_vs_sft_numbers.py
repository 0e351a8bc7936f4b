"""benchmarks/rl_vs_sft's numbers from evaluation folders and metrics written by hand (the
real runs take hours: not in CI): a cell's row (each arm's EM, searches and better-strategy share
by question kind, the paired differences GRPO - SFT more, GRPO - RFT and RFT - SFT more, time to
gain, SFT at GRPO's minutes), each arm's command (the same clock for every arm), the summary over
cells with its t interval across KB x seed, and the tables, plots and record figures."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_rl.evaluation import report  # noqa: E402
import benchmarks.rl_vs_sft.cli  # noqa: E402,F401  (every module of the package: rl_vs_sft.<module>.<name>)
from benchmarks import records, rl_vs_sft, rl_vs_sft_tables as tables, strategy  # noqa: E402

KINDS = {"q1": "single", "q2": "single", "q3": "bridge", "q4": "bridge"}
Z = report.Z95


def _write(d: Path, ems: list[float], searches: int = 1, hits: list[bool] | None = None,
           queries: list[list[str]] | None = None) -> None:
    hits = hits or [False] * len(ems)
    queries = queries or [[f"q{i + 1} query"] * searches for i in range(len(ems))]
    recs = [{"id": f"q{i + 1}", "mode": "agent", "data_source": "kb", "em": em, "subem": em, "f1": em,
             "valid_format": True, "searches": searches, "turns": searches + 1, "prediction": "x",
             "retrieval_hit": hit, "trajectory": "".join(f"<think>t</think><search>{q}</search><information>p"
                                                          "</information>" for q in qs) + "<answer>x</answer>"}
            for i, (em, hit, qs) in enumerate(zip(ems, hits, queries))]
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    report.write_summary(report.summarize(recs), d)


def _metrics(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


SFT_STEPS = [{"step": i, "sft/loss": 2.0 - 0.1 * i, "training/elapsed_s": 100.0 * i} for i in range(1, 7)]
"""The SFT arm: 6 steps of 100 s in its 10 minutes."""
ALL_STEPS = [{"step": i, "sft/loss": 2.0 - 0.05 * i, "training/elapsed_s": 120.0 * i} for i in range(1, 6)]
"""sft_all: 5 steps of 120 s."""
EMS = {"start": [1, 0, 0, 0], "sft_more": [1, 1, 0, 0], "rft": [1, 1, 0, 1], "grpo": [1, 1, 1, 0],
       "sft_all": [1, 1, 1, 1]}
"""A cell by hand: start 1/4; SFT more 2/4 (the single-hop questions); RFT 3/4 (q4, a bridge);
GRPO 3/4 (q3, the other bridge); SFT on every question's demonstration 4/4."""
VAL_POINTS = {"rft": [(0, 0.0, 0.0), (2, 150.0, 0.0), (4, 300.0, 0.0)],
              "grpo": [(0, 0.0, 0.0), (2, 120.0, 0.0), (4, 240.0, 1.0)]}
"""(step, training seconds, running EM) of the RL arms: RFT 4 steps in 5 minutes, GRPO 4 in 4."""


def _seed_dir(tmp: Path, ems: dict | None = None, val_more: float = 0.0, val_points: dict | None = None,
              matched=None) -> Path:
    ems, val_points = ems or EMS, val_points or VAL_POINTS
    d = tmp / "seed"
    for m, em in ems.items():
        _write(d / f"eval_{m}", em, searches=2 if m == "grpo" else 1)
    _write(d / "eval_sft_matched", matched or ems["start"])
    _write(d / "val_sft_more", [val_more])
    _metrics(d / "sft_more", SFT_STEPS)
    _metrics(d / "sft_matched", SFT_STEPS)  # the same run again (its extra steps do not count)
    _metrics(d / "sft_all", ALL_STEPS)
    for arm, points in val_points.items():
        _metrics(d / arm, [{"step": s, "val/em": em, "training/elapsed_s": t} for s, t, em in points])
    return d


def _half(diffs: list[float]) -> float:
    """1.96 sd / sqrt(n) of paired differences (report.paired_difference's half width)."""
    n, mean = len(diffs), sum(diffs) / len(diffs)
    return Z * math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1)) / math.sqrt(n)


def test_a_cells_row_pairs_every_arm_on_the_same_questions(tmp_path):
    d = _seed_dir(tmp_path)
    r = rl_vs_sft.cell.seed_row(101, 7, d, list(tables.ARMS), KINDS, {}, gain=0.05)
    assert (r["kb_seed"], r["seed"], r["n"], r["arms"]) == (101, 7, 4, ["sft_more", "rft", "grpo", "sft_all"])
    assert r["em"] == {"start": 0.25, "sft_more": 0.5, "rft": 0.75, "grpo": 0.75, "sft_all": 1.0, "sft_matched": 0.25}
    # GRPO - SFT more: q3 only (0, 0, 1, 0); GRPO - RFT: q3 up, q4 down (0, 0, 1, -1); RFT - SFT more: q4 (0, 0, 0, 1)
    p = r["pairs"]
    assert list(p) == ["grpo_minus_sft_more", "grpo_minus_rft", "rft_minus_sft_more"]
    assert p["grpo_minus_sft_more"]["diff"] == pytest.approx(0.25)
    assert p["grpo_minus_sft_more"]["ci_low"] == pytest.approx(0.25 - Z * 0.5 / 2)  # sd 0.5 over 4 questions
    assert p["grpo_minus_rft"]["diff"] == 0.0
    assert p["grpo_minus_rft"]["ci_high"] == pytest.approx(_half([0, 0, 1, -1])) == pytest.approx(Z * (2 / 3) ** 0.5 / 2)
    assert p["rft_minus_sft_more"]["diff"] == pytest.approx(0.25)
    assert {a: x["diff"] for a, x in r["minus_start"].items()} == pytest.approx(
        {"sft_more": 0.25, "rft": 0.5, "grpo": 0.5, "sft_all": 0.75})
    # by question kind: the bridges moved in RFT (q4), GRPO (q3) and SFT all (both); GRPO searched twice
    assert r["by_kind"]["bridge"]["em"] == {"start": 0.0, "sft_more": 0.0, "rft": 0.5, "grpo": 0.5, "sft_all": 1.0,
                                            "sft_matched": 0.0}
    assert r["by_kind"]["single"]["n"] == 2 and r["by_kind"]["single"]["em"]["sft_more"] == 1.0
    assert r["by_kind"]["bridge"]["searches"]["grpo"] == 2.0 and r["searches"]["rft"] == 1.0
    # no classifier of queries yet: every share is n/a, for every model and kind
    assert all(v is None for shares in r["better_strategy"].values() for v in shares.values())
    assert r["steps"] == {"sft_more": 6, "rft": 4, "grpo": 4, "sft_all": 5}
    assert r["minutes"] == {"sft_more": 10.0, "rft": 5.0, "grpo": 4.0, "sft_all": 10.0}
    # GRPO passed the SFT arm's running EM (0.0) by 5 points at 4 minutes; RFT never did
    assert r["time_to_gain_min"] == {"rft": None, "grpo": 4.0} and r["time_to_gain_by"] == "trainer validation"
    assert r["val_points"]["grpo"] == [(0, 0.0, 0.0), (2, 2.0, 0.0), (4, 4.0, 1.0)]
    # SFT at GRPO's 4 minutes: the SFT arm's first 2 steps (200 s; a third ends at 300), repeated
    m = r["sft_matched"]
    assert (m["steps"], m["minutes"], m["loss_gap"]) == (2, 200.0 / 60, 0.0)
    assert m["grpo_minus"]["diff"] == pytest.approx(0.5)
    # every question answered by some model (SFT all: all four); no model's context held a gold answer
    assert r["headroom"] == {"any_right": 1.0, "never_retrieved": 1.0, "never_retrieved_ids": ["q1", "q2", "q3", "q4"]}
    json.dumps(r)  # the row goes into the benchmark's JSON as it is


def test_a_cell_of_some_arms_has_only_their_pairs(tmp_path):
    # RFT and GRPO alone: GRPO - RFT, no SFT arm (so no time to gain, no SFT at GRPO's minutes)
    d = _seed_dir(tmp_path)
    r = rl_vs_sft.cell.seed_row(5, 1, d, ["rft", "grpo"], KINDS, {}, gain=0.05)
    assert list(r["pairs"]) == ["grpo_minus_rft"] and set(r["minus_start"]) == {"rft", "grpo"}
    assert set(r["em"]) == {"start", "rft", "grpo"} and "sft_matched" not in r and "time_to_gain_min" not in r
    assert set(r["val_points"]) == {"rft", "grpo"}


def test_the_better_strategy_is_counted_by_question_kind_from_each_trajectorys_queries(tmp_path, monkeypatch):
    # a classifier by hand: a query holding the question's attribute is the better strategy
    def by_hand(query: str, question: dict) -> str | None:
        attr = question.get("attr")
        return None if attr is None else ("name + attribute" if attr in query else "name only")

    monkeypatch.setattr(rl_vs_sft.by_strategy, "query_strategy", by_hand)
    questions = {"q1": {"attr": "1901"}, "q2": {"attr": "Lund"}, "q3": {"attr": "Oslo"}}  # q4: cannot be told
    _write(tmp_path / "e", [1, 0, 1, 0], queries=[["Ann Lee 1901 birth year"], ["Bo Li birthplace", "Bo Li Lund"],
                                                 ["Cy Ro birthplace", "Oslo country"], ["Di Wu"]])
    counts = rl_vs_sft.by_strategy.strategy_counts(tmp_path / "e", questions, KINDS)
    assert counts == {"all": {"name + attribute": 3, "name only": 2, "unknown": 1},
                      "single": {"name + attribute": 2, "name only": 1},
                      "bridge": {"name only": 1, "name + attribute": 1, "unknown": 1}}
    assert strategy.better_share(counts["single"]) == pytest.approx(2 / 3)
    assert strategy.better_share(counts["all"]) == pytest.approx(3 / 5)  # the unknown one is not in the share
    assert strategy.better_share({"unknown": 4}) is None and strategy.better_share({}) is None
    assert strategy.search_queries("<search>a b</search><information><search>x</search></information>") == [
        "a b", "x"]  # (an observation's tags are neutralised before they reach a trajectory)



def test_em_by_strategy_groups_questions_by_whether_any_search_held_the_attribute(tmp_path):
    # q1: attribute in its one search, right, found the answer; q2: name, then attribute -> the better
    # strategy, wrong, found it; q3: name only (twice), right, did not; q4: name only, wrong, did not;
    # q5: no attribute to tell -> left out
    questions = {f"q{i}": {"hop_attributes": [a]} for i, a in enumerate(["1901", "Lund", "Oslo", "Rome"], 1)}
    _write(tmp_path / "e", [1, 0, 1, 0, 1], hits=[True, True, False, False, True],
           queries=[["Ann Lee 1901"], ["Bo Li", "Bo Li lund"], ["Cy Ro", "Cy Ro birthplace"], ["Di Wu"], ["Ed Ma"]])
    by = rl_vs_sft.by_strategy.em_by_strategy(tmp_path / "e", questions)
    assert by == {"name + attribute": {"n": 2, "em": 0.5, "hit": 1.0}, "name only": {"n": 2, "em": 0.5, "hit": 0.0}}
    # one kind's questions only (q2, q3): one each way
    assert rl_vs_sft.by_strategy.em_by_strategy(tmp_path / "e", questions, {"q2", "q3"}) == {
        "name + attribute": {"n": 1, "em": 0.0, "hit": 1.0}, "name only": {"n": 1, "em": 1.0, "hit": 0.0}}
    kinds = {"q1": "single", "q2": "bridge", "q3": "bridge", "q4": "single", "q5": "single"}
    assert rl_vs_sft.by_strategy.strategy_by_kind(tmp_path / "e", questions, kinds) == {
        "all": by,
        "bridge": {"name + attribute": {"n": 1, "em": 0.0, "hit": 1.0}, "name only": {"n": 1, "em": 1.0, "hit": 0.0}},
        "single": {"name + attribute": {"n": 1, "em": 1.0, "hit": 1.0}, "name only": {"n": 1, "em": 0.0, "hit": 0.0}}}
    _write(tmp_path / "f", [0], queries=[["Ann Lee"]])  # no question told apart by name + attribute
    assert rl_vs_sft.by_strategy.em_by_strategy(tmp_path / "f", questions) == {
        "name + attribute": {"n": 0, "em": None, "hit": None}, "name only": {"n": 1, "em": 0.0, "hit": 0.0}}
    row = {"kb_seed": 9, "seed": 1, "em_by_strategy": {
        "start": by, "grpo": {"name + attribute": {"n": 3, "em": 1.0}, "name only": {"n": 1, "em": 0.0}}}}
    lines = tables.strategy_em_lines([row, {"kb_seed": 8, "seed": 1}], ["start", "grpo", "rft"])
    # the start's row has hits; grpo's is a row written before hits were kept
    assert lines[-1] == "| 9 | 1 | 50.0, 100.0 (2) / 100.0 (3) / - | 50.0, 0.0 (2) / 0.0 (1) / - |" and len(lines) == 6
    assert tables.strategy_em_lines([{"kb_seed": 8, "seed": 1}], ["start"]) == []  # rows from before: nothing
    assert tables.strategy_em_lines([{"kb_seed": 8, "seed": 1, "em_by_strategy": {"start": {  # the standard kind
        "name + attribute": {"n": 0, "em": None}, "name only": {"n": 0, "em": None}}}}], ["start"]) == []


def test_a_query_is_the_better_strategy_when_it_holds_an_attribute_the_question_gives():
    row = {"hop_attributes": ["Varnholt", ""], "namesakes": [3, 1]}
    assert strategy.query_strategy("Orla Venn of varnholt birth year", row) == "name + attribute"
    assert strategy.query_strategy("Orla Venn birth year", row) == "name only"
    assert strategy.query_strategy("Orla Venn birth year", {"hop_attributes": ["", ""]}) is None  # nothing to tell
    assert strategy.query_strategy("Ann Lee birth year", {}) is None  # the standard kind
    import numpy as np  # a row of pandas' to_dict("records") holds numpy arrays

    assert strategy.query_strategy("painter Orla Venn", {"hop_attributes": np.array(["painter"])}) == "name + attribute"


def _traj(step: int, group: int, question: str, queries: list[str], reward: float) -> dict:
    """A record of agent_rl.training.rollout_data: the searches sampled, an observation that
    holds an attribute (the model did not write it: it does not count)."""
    pieces = [{"sampled": True, "text": f"<search> {q} </search>"} for q in queries]
    pieces.append({"sampled": False, "text": "<information>Bo Li of Lund, <search> Bo Li lund </search></information>"})
    return {"step": step, "group_id": group, "question": question, "reward": reward,
            "breakdown": {"metric": float(reward == 1.0)}, "pieces": pieces}


def test_group_strategy_gives_each_strategy_grpos_advantage_within_the_groups_that_sampled_both():
    questions = {"Q1": {"hop_attributes": ["lund"]}, "Q2": {"hop_attributes": ["oslo"]}}
    batches = [  # step 1, group 0 (mixed): better 1, 1; name only 0, 0 -> mean .5, std sqrt(1/3): +-0.866
        _traj(1, 0, "Q1", ["Bo Li lund"], 1.0), _traj(1, 0, "Q1", ["Bo Li", "Bo Li Lund"], 1.0),
        _traj(1, 0, "Q1", ["Bo Li"], 0.0), _traj(1, 0, "Q1", ["Bo Li"], 0.0),
        _traj(1, 1, "Q2", ["Cy Ro"], 1.0), _traj(1, 1, "Q2", ["Cy Ro"], 0.0),  # name only: not mixed
        # step 2, group 0 (mixed): better 0, name only 1, no search 0 -> mean 1/3, std sqrt(1/3)
        _traj(2, 0, "Q2", ["Cy Ro oslo"], 0.0), _traj(2, 0, "Q2", ["Cy Ro"], 1.0), _traj(2, 0, "Q2", [], 0.0)]
    g = rl_vs_sft.by_strategy.group_strategy(batches, questions)
    assert g["groups"] == 3 and g["mixed"] == 2
    assert g["by_step"] == [{"step": 1, "trajectories": 6, "better": pytest.approx(2 / 6)},
                            {"step": 2, "trajectories": 3, "better": 0.5}]
    r3 = math.sqrt(1 / 3)
    better, name = g["name + attribute"], g["name only"]
    assert better["n"] == 3 and name["n"] == 3
    assert better["reward"] == pytest.approx(2 / 3) and better["em"] == pytest.approx(2 / 3)
    assert better["advantage"] == pytest.approx((0.5 / r3 + 0.5 / r3 - (1 / 3) / r3) / 3, rel=1e-5)
    assert name["reward"] == pytest.approx(1 / 3) and name["em"] == pytest.approx(1 / 3)
    assert name["advantage"] == pytest.approx((-0.5 / r3 - 0.5 / r3 + (2 / 3) / r3) / 3, rel=1e-5)
    assert rl_vs_sft.by_strategy.group_strategy([], questions) == {
        "by_step": [], "groups": 0, "mixed": 0, "name + attribute": {"n": 0, "reward": None, "em": None, "advantage": None},
        "name only": {"n": 0, "reward": None, "em": None, "advantage": None}}
    row = {"kb_seed": 7, "seed": 1, "group_strategy": {"grpo": g, "rft": rl_vs_sft.by_strategy.group_strategy([], questions)}}
    lines = tables.group_strategy_lines([row, {"kb_seed": 7, "seed": 2}])
    assert len(lines) == 6 and lines[-1] == ("| 7 | 1 | GRPO | 33.3 (step 1) → 50.0 (step 2) | 2 of 3 | "
                                             "0.667 / 66.7 / +0.38 (3) | 0.333 / 33.3 / -0.19 (3) |")
    assert tables.group_strategy_lines([{"kb_seed": 7, "seed": 1}]) == []


def test_with_log_batches_the_rl_arms_write_every_steps_whole_batch_in_their_folder(tmp_path):
    from agent_rl.demo.stages import Workdir

    w, d = Workdir(tmp_path / "w"), tmp_path / "w" / "seed1"
    for arm in tables.ARMS:
        cmd = [str(c) for c in rl_vs_sft.arms.arm_stage(w, arm, tmp_path / "s", tmp_path / "v", "http://x", d, 1,
                                                   _args(log_batches=True), tmp_path / "all.parquet")[0]]
        logged = [c for c in cmd if c.startswith("trainer.rollout_data")]
        assert logged == ([f"trainer.rollout_data_dir={d / arm / 'rollouts'}", "trainer.rollout_data_freq=1",
                           "trainer.rollout_data_n=1000000"] if arm in tables.RL_ARMS else [])
        plain = rl_vs_sft.arms.arm_stage(w, arm, tmp_path / "s", tmp_path / "v", "http://x", d, 1, _args(), tmp_path / "a")[0]
        assert not any(str(c).startswith("trainer.rollout_data") for c in plain)


def _args(**kw) -> rl_vs_sft.settings.Settings:
    base = dict(kb_seed=[101], kb_kind="standard", demos=1500, demo_args="", eval_limit=200, val_n=40, start_steps=60,
                minutes=10.0, clock=rl_vs_sft.settings.CLOCK, val_every=2, overrides=[], start_curve=None, best_of_val=False,
                sft_val_every=10, sft_lr=None, sft_epochs=None, rft_lr=None, gain=0.05, arms=list(tables.ARMS),
                seeds=[1], workdir=None, log_batches=False)
    return rl_vs_sft.settings.Settings(**{**base, **kw})


def test_every_arm_runs_from_the_start_on_one_clock_with_its_own_settings(tmp_path):
    from agent_rl.demo.stages import Workdir

    w, d, start, val = Workdir(tmp_path / "w"), tmp_path / "w" / "seed3", tmp_path / "start", tmp_path / "val.parquet"
    args = _args(sft_lr=2e-5, sft_epochs=3, rft_lr=1e-5, overrides=["actor_rollout_ref.actor.optim.lr=5e-6"])

    def stage(arm: str, a=args) -> tuple[list[str], Path, Path]:
        cmd, done, model = rl_vs_sft.arms.arm_stage(w, arm, start, val, "http://x", d, 3, a, tmp_path / "all.parquet")
        return [str(c) for c in cmd], done, model

    for arm in tables.ARMS:  # the same minutes, every second counted, from the same start
        cmd = stage(arm)[0]
        assert "trainer.max_time_s=600" in cmd and "trainer.max_time_counts=all" in cmd and f"actor_rollout_ref.model.path={start}" in cmd
        assert f"trainer.default_local_dir={d / arm}" in cmd
    more, done, model = stage("sft_more")
    assert "agent_rl.coldstart.cli" in more and f"data.train_files=[{w.demos}]" in more and "data.seed=1003" in more
    assert more[-4:] == ["trainer.max_time_counts=all", "actor_rollout_ref.actor.optim.lr=2e-05",
                         "trainer.total_training_steps=null", "trainer.total_epochs=3"]  # after the stage's own
    assert (done, model) == (d / "sft_more" / "model" / "config.json", d / "sft_more" / "model")
    every = stage("sft_all")[0]
    assert f"data.train_files=[{tmp_path / 'all.parquet'}]" in every and every[-1] == "trainer.max_time_counts=all"
    assert not any("optim.lr" in c or "total_epochs" in c for c in every)  # the SFT config's lr, until the clock
    rft, done, model = stage("rft")
    assert "agent_rl.training.cli" in rft and "data.seed=3" in rft and "trainer.test_freq=2" in rft
    # the user's overrides first, then the arm's own: its lr wins, and no override changes one arm alone
    lrs = [c for c in rft if c.startswith("actor_rollout_ref.actor.optim.lr=")]
    assert lrs == ["actor_rollout_ref.actor.optim.lr=5e-6", "actor_rollout_ref.actor.optim.lr=1e-05"]
    assert rft.index("algorithm.adv_estimator=rejection_sampling") > rft.index("actor_rollout_ref.actor.optim.lr=5e-6")
    assert (done, model) == (d / "rft" / "finished.json", d / "rft")
    grpo = stage("grpo")[0]
    assert not any("adv_estimator" in c for c in grpo)
    assert [c for c in grpo if c.startswith("actor_rollout_ref.actor.optim.lr=")] == ["actor_rollout_ref.actor.optim.lr=5e-6"]
    i = rft.index("algorithm.adv_estimator=rejection_sampling")  # RFT is GRPO's run (in its own directory)
    assert [c.replace(str(d / "rft"), str(d / "grpo")) for c in rft[:i]] == grpo[:i] and rft[i + 2:] == grpo[i:]
    # best checkpoints: SFT arms save every --sft-val-every steps, RL arms every --val-every (saves on the clock)
    best = _args(best_of_val=True)
    assert "trainer.save_freq=10" in stage("sft_all", best)[0] and "trainer.save_freq=2" in stage("grpo", best)[0]
    # defaults: no lr or epochs of the SFT arm's own (the config's, until the clock)
    assert stage("sft_more", _args())[0][-1] == "trainer.max_time_counts=all"


def test_the_workdirs_of_one_and_several_knowledge_bases(tmp_path):
    assert rl_vs_sft.settings.kb_workdir(_args(kb_seed=[101]), 101) == ROOT / "runs" / "rl_vs_sft" / "kb101"
    assert rl_vs_sft.settings.kb_workdir(_args(kb_seed=[3], kb_kind="lookalike"), 3) == ROOT / "runs" / "rl_vs_sft" / "lookalike_kb3"
    one = _args(kb_seed=[101], workdir=str(tmp_path / "gpu_rvs"))  # scripts/gpu_check.sh's --workdir: the KB's own
    assert rl_vs_sft.settings.kb_workdir(one, 101) == rl_vs_sft.settings.out_dir(one) == tmp_path / "gpu_rvs"
    two = _args(kb_seed=[11, 12], kb_kind="lookalike")
    assert rl_vs_sft.settings.out_dir(two) == ROOT / "runs" / "rl_vs_sft" / "lookalike_kbs11_12"
    two.workdir = str(tmp_path / "pre")
    assert rl_vs_sft.settings.kb_workdir(two, 12) == tmp_path / "pre" / "lookalike_kb12" and rl_vs_sft.settings.out_dir(two) == tmp_path / "pre"


def test_the_t_interval_across_cells_is_students_with_cells_minus_one_df():
    assert tables.t975(1) == 12.7062 and tables.t975(2) == 4.3027 and tables.t975(30) == 2.0423
    for df, exact in ((31, 2.03951), (40, 2.02108), (120, 1.97993), (10_000, 1.96020)):  # scipy.stats.t.ppf
        assert tables.t975(df) == pytest.approx(exact, abs=2e-5)
    # three cells +4, +9, +9 (issue 85's KB-101 seeds): mean 7.33, sd 1/sqrt(1200), sd/sqrt(3) = 1/60
    lo, hi = tables.t_interval([0.04, 0.09, 0.09])
    assert (lo, hi) == pytest.approx((0.22 / 3 - 4.3027 / 60, 0.22 / 3 + 4.3027 / 60))
    assert tables.t_interval([0.05]) is None and tables.t_interval([]) is None
    assert tables.t_interval([0.1, 0.3]) == pytest.approx((0.2 - 12.7062 * 0.1, 0.2 + 12.7062 * 0.1))


def _row(kb: int, seed: int, pairs: dict[str, float], start: float = 0.5, arms=tables.ARMS) -> dict:
    p = {name: {"diff": x, "ci_low": x - 0.1, "ci_high": x + 0.1, "n": 200} for name, x in pairs.items()}
    em = {"start": start, **{a: start + 0.01 * (i + 1) for i, a in enumerate(arms)}}
    return {"kb_seed": kb, "seed": seed, "n": 200, "arms": list(arms), "em": em, "pairs": p,
            "minus_start": {a: {"diff": em[a] - start, "ci_low": 0.0, "ci_high": 0.0, "n": 200} for a in arms},
            "steps": {a: 10 + i for i, a in enumerate(arms)}, "minutes": {a: 9.5 for a in arms},
            "searches": {m: 1.0 for m in em}, "better_strategy": {m: {} for m in em},
            "by_kind": {"single": {"n": 100, "em": em, "searches": {m: 1.0 for m in em}}}}


def test_the_summary_over_cells_gives_each_pair_its_spread_and_t_interval():
    rows = [_row(11, 1, {"grpo_minus_sft_more": 0.04, "grpo_minus_rft": -0.02, "rft_minus_sft_more": 0.06}),
            _row(12, 1, {"grpo_minus_sft_more": 0.09, "grpo_minus_rft": 0.01, "rft_minus_sft_more": 0.08}),
            _row(13, 1, {"grpo_minus_sft_more": 0.09}, arms=("sft_more", "grpo"))]  # a cell without RFT
    s = tables.summary(rows)
    assert (s["cells"], s["kb_seeds"]) == (3, [11, 12, 13])
    g = s["pairs"]["grpo_minus_sft_more"]
    assert (g["cells"], g["df"], g["worst"], g["best"]) == (3, 2, 0.04, 0.09)
    assert (g["mean"], g["median"]) == pytest.approx((0.22 / 3, 0.09))
    assert (g["t_low"], g["t_high"]) == pytest.approx((0.22 / 3 - 4.3027 / 60, 0.22 / 3 + 4.3027 / 60))
    assert g["above_zero_in_every_cell"] is True
    r = s["pairs"]["grpo_minus_rft"]  # two cells: df 1, t 12.7062, sd of (-0.02, 0.01) = 0.03 / sqrt(2)
    assert (r["cells"], r["df"], r["mean"]) == (2, 1, pytest.approx(-0.005))
    assert r["t_high"] == pytest.approx(-0.005 + 12.7062 * 0.015) and r["above_zero_in_every_cell"] is False
    assert s["minus_start"]["grpo"]["cells"] == 3 and s["minus_start"]["rft"]["cells"] == 2
    one = tables.summary(rows[:1])["pairs"]["grpo_minus_sft_more"]
    assert (one["df"], one["t_low"], one["t_high"]) == (0, None, None)
    assert "matched" not in s and "best_checkpoints" not in s


def test_the_table_names_the_kb_the_host_every_arm_and_the_intervals(tmp_path):
    d = _seed_dir(tmp_path)
    row = {**rl_vs_sft.cell.seed_row(101, 3, d, list(tables.ARMS), KINDS, {}, gain=0.05), "host": "[hardware] cpu='X'"}
    args = _args(start_steps=44, sft_lr=2e-5, sft_epochs=3)
    text = tables.table([row], tables.summary([row]), "[hardware] cpu='X'", args)
    assert "SFT more, RFT, GRPO, SFT all (ref.) from one start, 10 minutes an arm (every second counted)" in text
    assert "KB kind standard, KB seed 101, start SFT 44 steps" in text and "[hardware] cpu='X'" in text
    assert "SFT more: lr 2e-05, 3 epochs; RFT: the GRPO config's lr" in text
    half = 100 * Z * 0.5 / 2
    assert (f"| 101 | 3 | 25.0 | 50.0 (6, 10.0) | 75.0 (4, 5.0) | 75.0 (4, 4.0) | 100.0 (5, 10.0) | "
            f"+25.0 [{25 - half:+.1f}, {25 + half:+.1f}] | +0.0 [") in text
    assert "| not reached * | 4.0 * |" in text  # minutes to +5: RFT, GRPO (by the trainer's evaluation)
    assert "| 101 | 3 | bridge | 2 | 0.0 / 0.0 / 50.0 / 50.0 / 100.0 | 1.00 / 1.00 / 1.00 / 2.00 / 1.00 | " \
           "n/a / n/a / n/a / n/a / n/a |" in text
    assert "GRPO - SFT more over 1 cell: mean +25.0, median +25.0, worst +25.0, best +25.0; across KB x seed " \
           "(t, df 0): n/a (one cell)." in text
    assert "RFT - SFT more over 1 cell" in text and "GRPO - RFT over 1 cell: mean +0.0" in text
    assert "From the start, on average: SFT more +25.0, RFT +50.0, GRPO +50.0, SFT all (ref.) +75.0." in text
    assert "GRPO - SFT at GRPO's minutes (the SFT arm's run to its last step within GRPO's minutes) over 1 cell: " \
           "mean +50.0" in text
    assert "Answered right by at least one model (start, SFT more, RFT, GRPO, SFT all (ref.), SFT at GRPO's " \
           "minutes): KB 101 seed 3 100.0 (gold never retrieved 100.0)" in text
    assert "WARNING" not in text and "best checkpoint" not in text
    off = {**row, "sft_matched": {**row["sft_matched"], "loss_gap": 0.004}}
    assert "WARNING: KB 101 seed 3's SFT at GRPO's minutes is not the SFT arm's run" in tables.table(
        [off], tables.summary([off]), "", args)
    # several cells: the t interval across them, and the cells that ran elsewhere named under the host
    rows = [_row(11, 1, {"grpo_minus_sft_more": 0.04}), {**_row(12, 1, {"grpo_minus_sft_more": 0.09}), "host": "B"},
            _row(13, 1, {"grpo_minus_sft_more": 0.09})]
    text = tables.table(rows, tables.summary(rows), "A", args)
    assert "KB seeds 11, 12, 13" in text and "across KB x seed (t, df 2): [+0.2, +14.5]." in text
    assert "KB 12 seed 1 ran on: B" in text
    assert tables.plot([row], tmp_path / "p.png").stat().st_size > 0


def test_the_table_marks_a_time_to_gain_the_trainer_scored():
    row = {**_row(1, 1, {}, arms=("sft_more", "grpo")), "time_to_gain_min": {"grpo": 4.0},
           "time_to_gain_by": "evaluation command"}
    older = {**row, "seed": 2, "time_to_gain_by": "trainer validation"}
    both = tables.table([row, older], tables.summary([row, older]), "", _args())
    assert "| 4.0 |" in both and "| 4.0 * |" in both and "* minutes to +5 from the trainer's" in both
    alone = tables.table([row], tables.summary([row]), "", _args())
    assert "| 4.0 |" in alone and "*" not in alone


def test_sft_at_grpos_minutes_is_the_sft_arms_prefix_by_its_own_step_times(tmp_path):
    grpo = tmp_path / "grpo"
    for secs, k in ((399.0, 3), (400.0, 4), (650.0, 6), (99.0, 0)):
        _metrics(grpo, [{"step": 1, "training/elapsed_s": 0.5 * secs}, {"step": 2, "training/elapsed_s": secs}])
        _metrics(tmp_path / "sft", SFT_STEPS)
        assert rl_vs_sft.arms.matched_steps(tmp_path / "sft", grpo) == (k, 100.0 * k / 60)
    # the matched run repeats the SFT arm's first k steps: same losses (gap 0), or the gap says how far
    _metrics(tmp_path / "again", SFT_STEPS[:4])
    assert rl_vs_sft.arms.same_steps_gap(tmp_path / "sft", tmp_path / "again", 4) == 0.0
    _metrics(tmp_path / "other", [{**r, "sft/loss": r["sft/loss"] + 0.01 * r["step"]} for r in SFT_STEPS[:4]])
    assert rl_vs_sft.arms.same_steps_gap(tmp_path / "sft", tmp_path / "other", 4) == pytest.approx(0.04)
    assert rl_vs_sft.arms.same_steps_gap(tmp_path / "sft", tmp_path / "again", 5) == float("inf")
    assert rl_vs_sft.arms.same_steps_gap(tmp_path / "sft", tmp_path / "absent", 0) == 0.0


def test_headroom_counts_questions_any_model_answered_or_retrieved(tmp_path):
    # q1 only the start answers, q2 only one arm, q3 and q4 nobody; only q3's gold answer never
    # reached any model's context (q4's reached the last one's): 2 of 4 right, 1 never retrieved
    for name, ems, hits in (("a", [1, 0, 0, 0], [True, False, False, False]), ("b", [0, 0, 0, 0], [True, True, False, False]),
                            ("c", [0, 1, 0, 0], [False, True, False, False]), ("e", [0, 0, 0, 0], [False, False, False, True])):
        _write(tmp_path / name, ems, hits=hits)
    assert rl_vs_sft.cell.headroom([tmp_path / n for n in "abce"]) == {"any_right": 0.5, "never_retrieved": 0.25,
                                                                  "never_retrieved_ids": ["q3"]}


def test_a_finished_evaluation_does_not_need_its_model(tmp_path, monkeypatch):
    # a rerun with more seeds after a finished seed's GRPO checkpoints were deleted: the
    # evaluation that already ran is picked up; one still to run names the missing checkpoint
    from agent_rl.demo.stages import Workdir
    from agent_rl.evaluation.evaluate import EvalInputError

    ran = []
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda cmd, what, tag: ran.append(cmd) or 0.0)
    w, run_dir = Workdir(tmp_path / "w"), tmp_path / "grpo"
    run_dir.mkdir()  # a GRPO run directory whose checkpoints are gone
    _write(tmp_path / "eval_done", [1, 0])
    out = rl_vs_sft.runs.evaluate(w, run_dir, tmp_path / "q.parquet", "http://x", tmp_path / "eval_done", 2)
    assert out == tmp_path / "eval_done" and ran == []
    with pytest.raises(EvalInputError, match="not an HF model directory"):
        rl_vs_sft.runs.evaluate(w, run_dir, tmp_path / "q.parquet", "http://x", tmp_path / "eval_new", 2)
    assert ran == []


def test_the_start_curve_trains_once_keeps_every_checkpoint_and_scores_each(tmp_path, monkeypatch):
    # one start SFT to 6 steps saving every 3 (all kept), then the checkpoints at 3 and 6 scored
    # on the report questions: EM overall and by kind, searches
    from agent_rl.demo.stages import Workdir

    ran = []
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda cmd, what, tag: ran.append([str(c) for c in cmd]) or 0.0)
    d = tmp_path / "seed5"
    _write(d / "eval_curve_3", [1, 0, 0, 0], searches=2)
    _write(d / "eval_curve_6", [1, 1, 1, 0], searches=1)
    pts = rl_vs_sft.modes.start_curve(Workdir(tmp_path / "w"), d, 5, 3, 6, tmp_path / "rep.parquet", "http://x", 4, KINDS)
    assert len(ran) == 1 and "trainer.total_training_steps=6" in ran[0] and "data.seed=5" in ran[0]
    assert "trainer.save_freq=3" in ran[0] and "trainer.max_ckpt_to_keep=null" in ran[0]
    assert [(p["step"], p["em"], p["searches"]) for p in pts] == [(3, 0.25, 2.0), (6, 0.75, 1.0)]
    assert pts[1]["by_kind"] == {"bridge": 0.5, "single": 1.0}
    args = argparse.Namespace(kb_seed=[0], eval_limit=4)
    text = tables.curve_table({5: pts}, "[hardware] cpu='X'", args)
    assert "KB seed 0" in text and "[hardware] cpu='X'" in text
    assert "| 5 | 3 | 25.0 | 0.0 | 50.0 | 2.00 | 100.0 |" in text and "| 5 | 6 | 75.0 | 50.0 | 100.0 | 1.00 |" in text
    assert tables.curve_plot({5: pts}, tmp_path / "c.png").stat().st_size > 0
    assert "better strategy" not in text  # the standard kind's questions tell no strategies apart


def test_the_start_curve_on_the_lookalike_kind_shows_what_the_starts_searches_each_way_earn(tmp_path, monkeypatch):
    # step 3: q1 searched with its attribute (right, found), q2..q4 by name only (q3 right; q2 found)
    # -> better share 1/4; name + attribute 100.0 EM, 100.0 hit (1); name only 33.3, 33.3 (3)
    from agent_rl.demo.stages import Workdir

    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: 0.0)
    d = tmp_path / "seed5"
    questions = {q: {"hop_attributes": [a]} for q, a in zip(KINDS, ["Lund", "Oslo", "Rome", "Pisa"])}
    _write(d / "eval_curve_3", [1, 0, 1, 0], hits=[True, True, False, False],
           queries=[["Ann lund"], ["Bo Li"], ["Cy Ro"], ["Di Wu"]])
    pts = rl_vs_sft.modes.start_curve(Workdir(tmp_path / "w"), d, 5, 3, 3, tmp_path / "rep.parquet", "http://x", 4, KINDS,
                                questions)
    assert pts[0]["better_strategy"] == pytest.approx(0.25)
    by = pts[0]["em_by_strategy"]
    assert by["all"]["name only"] == pytest.approx({"n": 3, "em": 1 / 3, "hit": 1 / 3})
    assert by["single"] == {"name + attribute": {"n": 1, "em": 1.0, "hit": 1.0}, "name only": {"n": 1, "em": 0.0, "hit": 1.0}}
    assert by["bridge"]["name + attribute"] == {"n": 0, "em": None, "hit": None}
    text = tables.curve_table({5: pts}, "[hardware] cpu='X'", argparse.Namespace(kb_seed=[7], eval_limit=4))
    assert "| 5 | 3 | 25.0 | all | 100.0, 100.0 (1) | 33.3, 33.3 (3) |" in text
    assert "| 5 | 3 | 25.0 | bridge | n/a, n/a (0) | 50.0, 0.0 (2) |" in text


def test_a_workdir_made_with_other_settings_is_refused_and_left_alone(tmp_path):
    work = tmp_path / "kb101"
    rl_vs_sft.compat.check_settings(work, _args(), 101)
    rl_vs_sft.compat.check_settings(work, _args(arms=["grpo"]), 101)  # the same settings, other arms: a re-run goes on
    recorded = (work / "settings.json").read_text()
    with pytest.raises(SystemExit, match=r"start_steps 60 there, 44 asked"):
        rl_vs_sft.compat.check_settings(work, _args(start_steps=44), 101)
    with pytest.raises(SystemExit, match=r"best_of_val False there, True asked"):
        rl_vs_sft.compat.check_settings(work, _args(best_of_val=True), 101)
    with pytest.raises(SystemExit, match=r"kb_seed 101 there, 102 asked.*overrides \[\] there"):
        rl_vs_sft.compat.check_settings(work, _args(overrides=["x=1"]), 102)
    for k, v in (("kb_kind", "lookalike"), ("sft_lr", 2e-5), ("sft_epochs", 3), ("rft_lr", 1e-5)):
        with pytest.raises(SystemExit, match=rf"{k} .* there, {v!r} asked"):
            rl_vs_sft.compat.check_settings(work, _args(**{k: v}), 101)
    assert (work / "settings.json").read_text() == recorded
    # the start curve shares the KB and demonstrations, not the arms' settings
    rl_vs_sft.compat.check_settings(work, _args(start_curve=[20, 100], start_steps=44, minutes=3.0), 101)
    with pytest.raises(SystemExit, match="start_curve"):
        rl_vs_sft.compat.check_settings(work, _args(start_curve=[10, 50]), 101)


def test_a_workdir_from_before_the_clock_counted_every_second_is_refused(tmp_path):
    # an earlier version's settings.json: no kb_kind, clock, lr or epochs; its arms' minutes were
    # the training steps' alone, so its finished arms are not this rule's
    work = tmp_path / "kb101"
    work.mkdir()
    old = {k: v for k, v in rl_vs_sft.compat.workdir_settings(_args(), 101).items() if k not in rl_vs_sft.compat.LEGACY}
    (work / "settings.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit, match=r"clock 'training steps' there, 'every second' asked"):
        rl_vs_sft.compat.check_settings(work, _args(), 101)
    # one that ran only the start curve (no arms group) holds nothing of the arms to refuse
    curve = tmp_path / "curve"
    curve.mkdir()
    (curve / "settings.json").write_text(json.dumps({**{k: old[k] for k in rl_vs_sft.compat.SETTINGS["shared"] if k in old},
                                                     "start_curve": [20, 100]}))
    rl_vs_sft.compat.check_settings(curve, _args(), 101)
    assert json.loads((curve / "settings.json").read_text())["clock"] == "every second"


def test_earlier_runs_rows_count_only_under_the_same_settings_and_host_kind(tmp_path):
    xeon = "[hardware] cpu='Xeon' isa=amx torch=AVX512 threads=2 gpu=none native_bf16=yes (amx_bf16+avx512_bf16)"
    epyc = "[hardware] cpu='EPYC' isa=avx2 torch=AVX2 threads=2 gpu=none native_bf16=no (no amx_bf16)"
    args = _args(kb_seed=[101], seeds=[3])
    same = {k: getattr(args, k) for k in rl_vs_sft.compat.MERGED}
    row = _row(101, 1, {"grpo_minus_sft_more": 0.05})
    f = tmp_path / "old.json"
    f.write_text(json.dumps({**same, "kb_seeds": [101, 102], "host": xeon,
                             "rows": [row, {**row, "seed": 2}, {**row, "kb_seed": 102, "seed": 3}]}))
    got = rl_vs_sft.compat.earlier_rows([str(f)], args, "native bf16")
    assert [(r["kb_seed"], r["seed"], r["host"]) for r in got] == [(101, 1, xeon), (101, 2, xeon), (102, 3, xeon)]
    assert rl_vs_sft.compat.host_kind_of(xeon) == "native bf16" and rl_vs_sft.compat.host_kind_of(epyc) == "no native bf16 (fp32)"
    with pytest.raises(SystemExit, match="host kind 'native bf16' there, 'no native bf16 \\(fp32\\)' here"):
        rl_vs_sft.compat.earlier_rows([str(f)], args, "no native bf16 (fp32)")
    for k, v, said in (("start_steps", 44, "start_steps 44 there, 60 here"), ("val_n", 50, "val_n 50 there, 40 here"),
                       ("overrides", ["x=1"], r"overrides \['x=1'\] there, \[\] here"),
                       ("rft_lr", 1e-5, "rft_lr 1e-05 there, None here")):
        f.write_text(json.dumps({**same, k: v, "host": xeon, "rows": [row]}))
        with pytest.raises(SystemExit, match=said):
            rl_vs_sft.compat.earlier_rows([str(f)], args, "native bf16")
    # a file of the two-arm version: its minutes counted the training steps only
    old = {k: v for k, v in same.items() if k not in rl_vs_sft.compat.LEGACY}
    f.write_text(json.dumps({**old, "kb_seed": 101, "host": xeon, "rows": [{"seed": 1, "grpo_minus_sft": {}}]}))
    with pytest.raises(SystemExit, match="clock 'training steps' there, 'every second' here"):
        rl_vs_sft.compat.earlier_rows([str(f)], args, "native bf16")
    f.write_text(json.dumps({**same, "host": xeon, "rows": [{**row, "seed": 3}]}))
    with pytest.raises(SystemExit, match="KB 101 seed 3 of --with .* counted twice"):
        rl_vs_sft.compat.earlier_rows([str(f)], args, "native bf16")
    f.write_text(json.dumps({**same, "host": xeon, "rows": [row]}))
    with pytest.raises(SystemExit, match="KB 101 seed 1 of --with .* counted twice"):
        rl_vs_sft.compat.earlier_rows([str(f), str(f)], args, "native bf16")


def test_the_best_step_is_the_highest_running_em_and_a_tie_goes_to_fewer_steps():
    assert tables.best_step([(0, 0.8), (10, 0.85), (20, 0.85), (30, 0.7)]) == (10, 0.85)
    assert tables.best_step([(0, 0.8), (4, 0.65), (8, 0.75), (11, 0.8)]) == (0, 0.8)  # none beat the start
    assert tables.best_step([(0, 0.0), (5, 0.05)]) == (5, 0.05)


def _best_seed(tmp_path):
    """A cell whose SFT arm kept checkpoints 2, 4 and 6 (its last) and GRPO 2 and 3 (its last):
    on the running-evaluation questions SFT peaks at step 4 (1.0; 6 overfits to 0.5) and GRPO never
    passes the start (0.5 at step 0, 0.5 at 2, 0.0 at 3): GRPO's best is the start."""
    ems = {"start": [1, 0, 0, 0], "sft_more": [1, 1, 0, 0], "grpo": [1, 1, 1, 0]}
    d = _seed_dir(tmp_path, ems, val_more=0.5, val_points={"grpo": [(0, 0.0, 0.5), (2, 120.0, 0.5), (3, 180.0, 0.0)]})
    for arm, steps in (("sft_more", (2, 4, 6)), ("grpo", (2, 3))):
        for k in steps:
            (d / arm / "checkpoints" / f"global_step_{k}").mkdir(parents=True)
    (d / "sft_more" / "checkpoints" / "global_step_8.tmp").mkdir()  # a killed save: not a checkpoint
    _write(d / "val_start", [0.5])
    for name, em in (("val_sft_more_2", 0.0), ("val_sft_more_4", 1.0), ("val_grpo_2", 0.5), ("val_grpo_3", 0.0)):
        _write(d / name, [em])
    _write(d / "eval_sft_more_4", [1, 1, 1, 1], searches=2)  # the SFT arm's best on the report questions
    return d


def _bests(tmp_path, d):
    from agent_rl.demo.stages import Workdir

    args = argparse.Namespace(val_n=1, eval_limit=4)
    w, q = Workdir(tmp_path / "w"), tmp_path / "q.parquet"
    first = {0: (d / "val_start", d / "eval_start")}
    return {"sft_more": rl_vs_sft.best.best_checkpoint(w, d, "sft_more", q, q, "http://x", args,
                                                  {**first, 6: (d / "val_sft_more", d / "eval_sft_more")}),
            "grpo": rl_vs_sft.best.best_checkpoint(w, d, "grpo", q, q, "http://x", args, {**first, 3: (None, d / "eval_grpo")})}


def test_each_arm_keeps_its_best_checkpoint_by_the_running_evaluation(tmp_path, monkeypatch):
    # every evaluation was made by hand: nothing runs (a stage that ran would be a defect here)
    from agent_rl.demo.stages import Workdir

    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    assert rl_vs_sft.runs.checkpoint_steps(d / "sft_more") == [2, 4, 6]
    best = _bests(tmp_path, d)
    sft, grpo = best["sft_more"], best["grpo"]
    assert sft["val_points"] == [(0, 0.5), (2, 0.0), (4, 1.0), (6, 0.5)]
    assert (sft["step"], sft["val_em"], sft["eval"]) == (4, 1.0, str(d / "eval_sft_more_4"))
    assert sft["minutes"] == pytest.approx(400.0 / 60)  # SFT_STEPS: 100 s a step
    assert (grpo["step"], grpo["minutes"], grpo["eval"]) == (0, 0.0, str(d / "eval_start"))
    row = rl_vs_sft.best.best_row(d, KINDS, best)
    # report questions: start 1/4, SFT's best 4/4, GRPO's best (the start) 1/4
    assert (row["arms"]["sft_more"]["em"], row["arms"]["grpo"]["em"]) == (1.0, 0.25)
    assert list(row["pairs"]) == ["grpo_minus_sft_more"] and row["pairs"]["grpo_minus_sft_more"]["diff"] == pytest.approx(-0.75)
    assert row["minus_start"]["sft_more"]["diff"] == pytest.approx(0.75) and row["minus_start"]["grpo"]["diff"] == 0.0
    # a workdir whose arm kept no checkpoint (trained without --best-of-val) is named, not guessed at
    with pytest.raises(SystemExit, match="kept no checkpoints"):
        rl_vs_sft.best.best_checkpoint(Workdir(tmp_path / "w"), d, "sft_matched", d, d, "http://x",
                                  argparse.Namespace(val_n=1, eval_limit=4), {})


def test_time_to_gain_by_the_checkpoints_scores_counts_the_first_checkpoint_past_the_bar(tmp_path):
    d = _best_seed(tmp_path)  # GRPO's checkpoints by the evaluation command: 0.5 at steps 0 and 2, 0.0 at 3
    points = [(3, 0.0), (0, 0.5), (2, 0.5)]  # in any order: the first by step counts
    assert rl_vs_sft.best.checkpoint_time_to_gain(d / "grpo", points, 0.5) == 2.0  # step 2 ended at 120 s
    assert rl_vs_sft.best.checkpoint_time_to_gain(d / "grpo", points, 0.55) is None  # the start never counts
    assert rl_vs_sft.best.checkpoint_time_to_gain(d / "grpo", [(0, 1.0), (3, 0.0)], 0.5) is None
    assert rl_vs_sft.best.minutes_to([(0, 0.0, 0.9), (4, 4.0, 0.6), (2, 2.0, 0.7)], 0.7) == 2.0


def test_the_table_plot_and_record_add_the_best_checkpoints_only_for_rows_that_have_them(tmp_path, monkeypatch):
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    row = rl_vs_sft.cell.seed_row(101, 1, d, ["sft_more", "grpo"], KINDS, {}, gain=0.05)
    row["best_checkpoints"] = rl_vs_sft.best.best_row(d, KINDS, _bests(tmp_path, d))
    older = {k: v for k, v in row.items() if k != "best_checkpoints"}
    rows = [row, {**older, "seed": 2}]
    summ = tables.summary(rows)
    b = summ["best_checkpoints"]
    assert b["cells"] == 1 and b["pairs"]["grpo_minus_sft_more"]["mean"] == pytest.approx(-0.75)
    text = tables.table(rows, summ, "", _args(val_n=1))
    assert "| 101 | 1 | 4 (6.7 min), 100.0 | 0 (0.0 min), 50.0 | 25.0 / 100.0 / 25.0 | -75.0 [" in text
    assert "Best checkpoints, GRPO - SFT more over 1 cell: mean -75.0" in text and "| 101 | 2 | 4 (" not in text
    assert "best checkpoint" not in tables.table([older], tables.summary([older]), "", _args())
    json.dumps(row)
    # the plot: the models' bars, then each arm's best checkpoint; the right panel, GRPO's checkpoints
    # by the command at the trainer's minutes for their steps, against SFT's best
    assert tables.bars(row) == [("start", 0.25), ("SFT more", 0.5), ("GRPO", 0.75), ("SFT at GRPO's minutes", 0.25),
                                ("SFT more's best checkpoint", 1.0), ("GRPO's best checkpoint", 0.25)]
    assert tables.running_curves(row) == {"grpo": ([(0.0, 0.5), (2.0, 0.5), (3.0, 0.0)], 1.0)}
    assert tables.running_curves(older) == {"grpo": ([(0.0, 0.5), (2.0, 0.5), (3.0, 0.0)], 0.5)}
    assert tables.plot(rows, tmp_path / "p.png").stat().st_size > 0
    # the record's figures: the best checkpoints' first; one cell's interval over questions
    result = {"rows": rows, "summary": summ}
    got = records.rl_vs_sft_headline(result)
    assert got == tables.headline(result)
    assert list(got)[0] == "GRPO \u2212 SFT more (best checkpoints)" and got[list(got)[0]].startswith("\u221275.0 [")
    assert got["GRPO \u2212 SFT more (same minutes, last checkpoints)"] == \
        "median +25.0, range +25.0 to +25.0; mean +25.0, t [+25.0, +25.0] over 2 cells"  # the same +25.0 in both cells
    assert got["agent EM: start / SFT more / GRPO"] == "25.0 / 50.0 / 75.0" and got["steps: SFT more / GRPO"] == "6,6 / 3,3"


def test_the_records_figures_across_cells(tmp_path):
    rows = [_row(11, 1, {"grpo_minus_sft_more": 0.04}), _row(12, 1, {"grpo_minus_sft_more": 0.09}),
            _row(13, 1, {"grpo_minus_sft_more": 0.09})]
    got = tables.headline({"rows": rows, "summary": tables.summary(rows)})
    assert got["GRPO \u2212 SFT more (same minutes, last checkpoints)"] == \
        "median +9.0, range +4.0 to +9.0; mean +7.3, t [+0.2, +14.5] over 3 cells"
    one = tables.headline({"rows": rows[:1], "summary": tables.summary(rows[:1])})
    assert one["GRPO \u2212 SFT more (same minutes, last checkpoints)"] == "+4.0 [\u22126.0, +14.0] (1 cell)"


def test_a_cells_per_question_file_holds_every_models_answers_and_the_checkpoints_scores(tmp_path, monkeypatch):
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    d = _best_seed(tmp_path)
    row = rl_vs_sft.cell.seed_row(101, 3, d, ["sft_more", "grpo"], KINDS, {}, gain=0.05)
    without = json.loads(json.dumps(rl_vs_sft.cell.per_question(d, KINDS, row)))  # as the file holds it
    assert sorted(without["models"]) == ["grpo", "sft_matched", "sft_more", "start"]
    assert without["running_evaluation"] == {"grpo_trainer_validation": {"0": 0.5, "2": 0.5, "3": 0.0}}
    row["best_checkpoints"] = rl_vs_sft.best.best_row(d, KINDS, _bests(tmp_path, d))
    got = json.loads(json.dumps(rl_vs_sft.cell.per_question(d, KINDS, row)))
    assert (got["kb_seed"], got["seed"]) == (101, 3)
    # GRPO 3/4: q1-q3 right (q3 a bridge), 2 searches each; SFT's best (step 4) all four
    assert got["models"]["grpo"] == {"em": 75.0, "searches": 2.0, "by_kind": {"bridge": 50.0, "single": 100.0},
                                     "em_by_id": {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}}
    assert got["models"]["sft_more"]["em_by_id"] == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert got["models"]["sft_more_best_step_4"]["em"] == 100.0
    assert got["models"]["grpo_best_step_0"] == got["models"]["start"]  # GRPO never passed its start
    assert got["running_evaluation"] == {"sft_more": {"0": 0.5, "2": 0.0, "4": 1.0, "6": 0.5},
                                         "grpo": {"0": 0.5, "2": 0.5, "3": 0.0},
                                         "grpo_trainer_validation": {"0": 0.5, "2": 0.5, "3": 0.0}}


def _checkpoints(run_dir: Path, over: dict, steps: int) -> None:
    """A run's checkpoints as the trainer keeps them with `trainer.save_freq` > 0: every that many
    steps and at the last."""
    every = int(over.get("trainer.save_freq", -1))
    for k in sorted({*range(every, steps + 1, every), steps}) if every > 0 else []:
        (run_dir / "checkpoints" / f"global_step_{k}").mkdir(parents=True)


def _fake_stage(cmd: list, what: str, tag: str) -> float:
    """Each stage's files as its command would leave them, made up in no time: the KB (6 test
    questions, 3 single and 3 bridge), demonstrations, SFT and RL runs (SFT 6 steps of 100 s,
    RL 4 of 120 s with running evaluations), and evaluations whose answers depend on the model."""
    import zlib

    import pandas as pd

    cmd = [str(c) for c in cmd]
    opt = {k: v for k, v in zip(cmd, cmd[1:])}
    over = dict(c.split("=", 1) for c in cmd if "=" in c and not c.startswith("-"))
    if "synthetic" in cmd:
        kb = Path(opt["--out"])
        kb.mkdir(parents=True)
        pd.DataFrame({"id": [f"kb_test_{i}" for i in range(6)], "kind": ["single", "bridge"] * 3,
                      "question": ["q"] * 6}).to_parquet(kb / "test.parquet")
        pd.DataFrame({"id": [f"kb_train_{i}" for i in range(9)]}).to_parquet(kb / "train.parquet")
        (kb / "kind").write_text(opt.get("--kind", "standard"))
    elif "model" in cmd and "data_prep" in cmd:
        Path(opt["--out"]).mkdir(parents=True)
        (Path(opt["--out"]) / ".complete").write_text("")
    elif "demos" in cmd:
        Path(opt["--out"]).parent.mkdir(parents=True, exist_ok=True)
        Path(opt["--out"]).write_text(opt["--limit"])
    elif "agent_rl.coldstart.cli" in cmd:
        out = Path(over["trainer.default_local_dir"])
        by_epochs = 2 * int(over.get("trainer.total_epochs", 3))  # 2 steps an epoch
        steps = min(6, int(over["trainer.total_training_steps"]) if over["trainer.total_training_steps"] != "null" else by_epochs)
        _metrics(out, [{"step": i, "sft/loss": 2.0 - 0.1 * i, "training/elapsed_s": 100.0 * i} for i in range(1, steps + 1)])
        (out / "model").mkdir()
        (out / "model" / "config.json").write_text(json.dumps(over))
        _checkpoints(out, over, steps)
    elif "agent_rl.training.cli" in cmd:
        _metrics(Path(over["trainer.default_local_dir"]), [{"step": s, "val/em": 0.1 * s, "training/elapsed_s": 120.0 * s}
                                                           for s in range(5)])
        (Path(over["trainer.default_local_dir"]) / "command.json").write_text(json.dumps(cmd))
        _checkpoints(Path(over["trainer.default_local_dir"]), over, 4)
    elif "agent_rl.evaluation.cli" in cmd and "explore" in cmd:  # the handover rule: here the next-to-last passes
        models = [a.split("=", 1) for a in cmd[cmd.index("explore") + 1:cmd.index("--data")]]
        label, model = models[-2]
        Path(opt["--json"]).write_text(json.dumps({**{m: {"verdict": "can learn"} for m, _ in models},
                                                   "start": {"label": label, "model": model, "why": "made up"}}))
    elif "agent_rl.evaluation.cli" in cmd:
        ids = list(pd.read_parquet(opt["--data"])["id"])[: int(opt["--limit"])]
        recs = [{"id": i, "mode": "agent", "data_source": "kb", "em": float(zlib.crc32(f"{opt['--model']}{i}".encode()) % 2),
                 "subem": 0.0, "f1": 0.0, "valid_format": True, "searches": 1, "turns": 2, "prediction": "x",
                 "retrieval_hit": False, "trajectory": "<search>a name</search>"} for i in ids]
        out = Path(opt["--out"])
        out.mkdir(parents=True)
        (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        report.write_summary(report.summarize(recs), out)
    else:
        raise AssertionError(f"unexpected stage {what}: {cmd}")
    return 0.0


@pytest.fixture
def fake_stages(monkeypatch):
    """The whole command's stages made up (_fake_stage), its retriever a URL that nothing serves."""
    from contextlib import contextmanager

    @contextmanager
    def served(*a, **k):
        yield "http://x"

    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", _fake_stage)
    monkeypatch.setattr("benchmarks.kb_server.serve_index", served)
    monkeypatch.setattr("agent_rl.evaluation.evaluate.resolve_model_dir", lambda p: Path(p))


def test_main_runs_every_arm_of_every_cell_and_writes_the_result_and_record(tmp_path, monkeypatch, fake_stages):
    """The whole command on two lookalike KBs x one seed with every stage made up (_fake_stage):
    each KB's workdir and settings, the KB kind passed to the builder, every arm on the clock that
    counts every second, demonstrations of every training question for sft_all, and the run's
    JSON, table, plot and record across both cells. A second run reuses everything."""
    argv = ["--kb-seed", "11", "12", "--kb-kind", "lookalike", "--seeds", "1", "--minutes", "10", "--eval-limit", "4",
            "--val-n", "2", "--demos", "3", "--rft-lr", "1e-5", "--workdir", str(tmp_path / "w")]
    assert rl_vs_sft.cli.main(argv) == 0
    for k in (11, 12):
        work = tmp_path / "w" / f"lookalike_kb{k}"
        assert (work / "kb" / "kind").read_text() == "lookalike"
        assert (work / "demos" / "kb_train.parquet").read_text() == "3"
        assert (work / "demos" / "kb_train_all.parquet").read_text() == "9"  # every training question
        settings = json.loads((work / "settings.json").read_text())
        assert (settings["kb_seed"], settings["kb_kind"], settings["clock"], settings["rft_lr"]) == (k, "lookalike", "every second", 1e-5)
        d = work / "seed1"
        for arm in ("sft_more", "sft_all"):
            over = json.loads((d / arm / "model" / "config.json").read_text())
            assert over["trainer.max_time_counts"] == "all" and over["trainer.max_time_s"] == "600"
        assert json.loads((d / "sft_all" / "model" / "config.json").read_text())["data.train_files"] == \
            f"[{work / 'demos' / 'kb_train_all.parquet'}]"
        rft = json.loads((d / "rft" / "command.json").read_text())
        assert "trainer.max_time_counts=all" in rft and "algorithm.adv_estimator=rejection_sampling" in rft
        assert "trainer.max_time_counts=all" in json.loads((d / "grpo" / "command.json").read_text())
        assert json.loads((d / "per_question.json").read_text())["kb_seed"] == k
    result = json.loads((tmp_path / "w" / "rl_vs_sft.json").read_text())
    assert result["kb_seeds"] == [11, 12] and result["arms"] == list(tables.ARMS) and result["kb_kind"] == "lookalike"
    assert [(r["kb_seed"], r["seed"]) for r in result["rows"]] == [(11, 1), (12, 1)]
    assert result["summary"]["cells"] == 2 and result["summary"]["pairs"]["grpo_minus_rft"]["df"] == 1
    assert result["rows"][0]["steps"] == {"sft_more": 6, "rft": 4, "grpo": 4, "sft_all": 6}
    assert "across KB x seed (t, df 1)" in (tmp_path / "w" / "rl_vs_sft.md").read_text()
    rec = json.loads((tmp_path / "w" / "record.json").read_text())
    assert rec["headline"] == tables.headline(result) and (tmp_path / "w" / "rl_vs_sft.png").stat().st_size > 0
    # a second run finds every stage done; other settings in a KB's workdir are refused before anything runs
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert rl_vs_sft.cli.main(argv) == 0
    with pytest.raises(SystemExit, match="rft_lr 1e-05 there, 2e-05 asked"):
        rl_vs_sft.cli.main([*argv[:-4], "--rft-lr", "2e-5", "--workdir", str(tmp_path / "w")])


def test_with_the_explore_rule_the_arms_start_from_the_checkpoint_the_handover_rule_picks(tmp_path, fake_stages):
    """`--start-rule explore`: the start SFT keeps a checkpoint every --start-every steps, the
    checkpoints and its final model are explored side by side on the KB's training questions
    (`agent-rl-eval explore --choose`, in training order) and every arm starts from the one it
    picks (the fake picks the next-to-last: step 4 of 6); the rule is a setting of the workdir."""
    argv = ["--kb-seed", "11", "--seeds", "1", "--start-steps", "6", "--start-rule", "explore", "--start-every", "2",
            "--arms", "grpo", "sft_more", "--eval-limit", "4", "--val-n", "2", "--demos", "3",
            "--workdir", str(tmp_path / "w")]
    assert rl_vs_sft.cli.main(argv) == 0
    d = tmp_path / "w" / "seed1"
    chosen = json.loads((d / "start_explore.json").read_text())
    assert list(chosen)[:3] == ["step2", "step4", "step6"] and chosen["start"]["label"] == "step4"
    step4 = d / "start" / "checkpoints" / "global_step_4"
    assert chosen["start"]["model"] == str(step4)
    grpo = json.loads((d / "grpo" / "command.json").read_text())
    assert f"actor_rollout_ref.model.path={step4}" in grpo
    sft_more = json.loads((d / "sft_more" / "model" / "config.json").read_text())
    assert sft_more["actor_rollout_ref.model.path"] == str(step4)
    assert json.loads((tmp_path / "w" / "settings.json").read_text())["start_rule"] == "explore"
    with pytest.raises(SystemExit, match="start_rule 'explore' there, 'steps' asked"):
        rl_vs_sft.cli.main([a for a in argv if a not in ("--start-rule", "explore")])


def test_the_command_runs_as_a_module_from_the_checkout():
    """`python -m benchmarks.rl_vs_sft` (the README's form; the package replaced the script):
    its help is the package's docstring under the command's name, and a bad combination is
    refused by argparse (exit 2) before anything runs."""
    import subprocess

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "benchmarks.rl_vs_sft", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    shown = run("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m benchmarks.rl_vs_sft [-h]")
    assert rl_vs_sft.__doc__.splitlines()[0] in shown.stdout and "--start-curve EVERY STEPS" in shown.stdout
    refused = run("--kb-seed", "0", "1", "--start-curve", "3", "6")
    assert refused.returncode == 2 and "--start-curve runs on one --kb-seed" in refused.stderr


def test_main_draws_the_start_curve_on_one_kb(tmp_path, monkeypatch, fake_stages):
    argv = ["--kb-seed", "0", "--seeds", "1", "2", "--start-curve", "3", "6", "--eval-limit", "4", "--val-n", "2",
            "--workdir", str(tmp_path / "w")]
    assert rl_vs_sft.cli.main(argv) == 0
    curve = json.loads((tmp_path / "w" / "start_curve.json").read_text())
    assert (curve["kb_seed"], sorted(curve["curves"])) == (0, ["1", "2"])
    assert [p["step"] for p in curve["curves"]["1"]] == [3, 6] and not (tmp_path / "w" / "rl_vs_sft.json").exists()
    with pytest.raises(SystemExit):  # one KB: the dev KB's curve chooses the start
        rl_vs_sft.cli.main(["--kb-seed", "0", "1", "--start-curve", "3", "6"])


def test_the_choice_takes_each_arms_best_checkpoint_and_breaks_ties_by_smaller_lr_then_fewer_epochs():
    from benchmarks import rl_vs_sft_choice as choice

    def sft(lr, ep, points):
        return {"arm": "sft_more", "settings": {"sft_lr": lr, "sft_epochs": ep}, "points": points}

    def rft(lr, points):
        return {"arm": "rft", "settings": {"rft_lr": lr}, "points": points}

    scored = {"a": sft(1e-4, 1, [(0, 0.5), (6, 0.75)]),            # best 0.75
              "b": sft(3e-5, 2, [(0, 0.5), (10, 0.75), (12, 0.5)]),  # 0.75 too, a smaller lr
              "c": sft(3e-5, 1, [(0, 0.5), (6, 0.75)]),            # the same lr, fewer epochs: chosen
              "d": sft(1e-5, 4, [(0, 0.5), (10, 0.5)]),            # the smallest lr, but only the start's 0.5
              "r1": rft(7e-6, [(0, 0.5), (2, 0.5)]),
              "r2": rft(1e-4, [(0, 0.5), (2, 0.6), (4, 0.6)])}     # 0.6, first at step 2
    got = choice.choose(scored)
    assert got["sft_more"] == {"name": "c", "settings": {"sft_lr": 3e-5, "sft_epochs": 1}, "step": 6, "val_em": 0.75}
    assert got["rft"] == {"name": "r2", "settings": {"rft_lr": 1e-4}, "step": 2, "val_em": 0.6}
    # every candidate at the start's EM: the smallest lr and fewest epochs, at step 0
    flat = {n: {**c, "points": [(0, 0.5), (6, 0.5)]} for n, c in scored.items()}
    assert choice.choose(flat)["sft_more"]["name"] == "d" and choice.choose(flat)["sft_more"]["step"] == 0
    assert choice.choose(flat)["rft"]["name"] == "r1"
    # the grid is the pre-registration's: 3 lrs x 3 epochs for SFT, 3 lrs for RFT
    names = [n for _, n, _ in choice.candidates()]
    assert len(names) == 12 == len(set(names)) and "sft_more_lr3e-05_ep2" in names and "rft_lr7e-06" in names
    prereg = (ROOT / "docs" / "preregistration" / "rl_beyond_imitation.md").read_text()
    assert "{1e-5, 3e-5, 1e-4} × `--sft-epochs` in {1, 2, 4}" in prereg and "{7e-6 (GRPO's), 3e-5, 1e-4}" in prereg


def test_main_chooses_on_the_dev_kb_only_scores_every_grid_point_and_frees_its_checkpoints(tmp_path, monkeypatch, fake_stages):
    from benchmarks import rl_vs_sft_choice as choice

    monkeypatch.setenv("AGENT_RL_NATIVE_BF16", "1")  # the choice's host kind (refused on the other: below)
    argv = ["--kb-kind", "lookalike", "--kb-seed", "7", "--seeds", "1", "--choose", "--minutes", "10", "--demos", "3",
            "--val-n", "2", "--eval-limit", "4", "--sft-val-every", "2", "--val-every", "2", "--workdir", str(tmp_path / "w")]
    assert rl_vs_sft.cli.main(argv) == 0
    d = tmp_path / "w" / "seed1"
    result = json.loads((tmp_path / "w" / "choice.json").read_text())
    assert sorted(result["candidates"]) == sorted(n for _, n, _ in choice.candidates())
    start_val = rl_vs_sft.runs.agent_em(d / "val_start")
    for name, c in result["candidates"].items():
        run_dir = d / "choice" / name
        assert not (run_dir / "checkpoints").exists()  # scored, then freed
        assert c["points"][0] == [0, start_val]  # the start, scored once for all
        if c["arm"] == "sft_more":
            over = json.loads((run_dir / "model" / "config.json").read_text())
            assert over["actor_rollout_ref.actor.optim.lr"] == f"{c['settings']['sft_lr']}"
            assert over["trainer.total_epochs"] == str(c["settings"]["sft_epochs"])
            assert over["trainer.max_time_counts"] == "all" and over["trainer.max_time_s"] == "600"
            steps = min(6, 2 * c["settings"]["sft_epochs"])  # the fake: 2 steps an epoch, 6 at most, checkpoints every 2
            assert [k for k, _ in c["points"]] == [0, *range(2, steps + 1, 2)] and c["steps"] == steps
        else:
            cmd = json.loads((run_dir / "command.json").read_text())
            assert f"actor_rollout_ref.actor.optim.lr={c['settings']['rft_lr']}" in cmd
            assert "algorithm.adv_estimator=rejection_sampling" in cmd and "trainer.max_time_counts=all" in cmd
            assert [k for k, _ in c["points"]] == [0, 2, 4]
        for k, em in c["points"][1:]:
            assert em == rl_vs_sft.runs.agent_em(d / "choice" / f"val_{name}_{k}")
    # the rule by hand over what was scored: highest best EM, then smaller lr, then fewer epochs
    for arm, keys in choice.CHOSEN.items():
        mine = [(max(e for _, e in c["points"]), *(c["settings"][k] for k in keys), n)
                for n, c in result["candidates"].items() if c["arm"] == arm]
        top = max(m[0] for m in mine)
        assert result["chosen"][arm]["name"] == min(m for m in mine if m[0] == top)[1:][-1]
    md = (tmp_path / "w" / "choice.md").read_text()
    assert f"- SFT_LR: {result['chosen']['sft_more']['settings']['sft_lr']:g}" in md and "- RFT_LR: " in md
    rec = json.loads((tmp_path / "w" / "record.json").read_text())
    assert rec["headline"]["candidates"] == "12" and rec["benchmark"] == "benchmarks/rl_vs_sft_choice.py"
    # a re-run reads every point's scores: nothing runs
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert rl_vs_sft.cli.main(argv) == 0
    # no choice on a reported KB, with the values it chooses given, or over several seeds
    for bad in (["--kb-seed", "201"], ["--sft-lr", "1e-5"], ["--seeds", "1", "2"]):
        with pytest.raises(SystemExit):
            rl_vs_sft.cli.main([*argv, *bad])
    monkeypatch.setenv("AGENT_RL_NATIVE_BF16", "0")  # nor on the host kind without native bf16
    with pytest.raises(SystemExit):
        rl_vs_sft.cli.main(argv)


def test_the_choices_points_kept_with_its_record_join_a_choice_in_another_checkout_from_the_same_start(
        tmp_path, monkeypatch, fake_stages, capsys):
    """With --record-dir each grid point's scores go to <record-dir>/points/<name>.json with the
    start's fingerprint: a checkout without the workdir (runs/ is not carried) makes the start again
    and scores only the points not kept; a point kept from another start is refused by name and
    left as it was."""
    import shutil

    from benchmarks import rl_vs_sft_choice as choice

    monkeypatch.setenv("AGENT_RL_NATIVE_BF16", "1")
    rec = tmp_path / "docs" / "choice_kb7"
    argv = ["--kb-kind", "lookalike", "--kb-seed", "7", "--seeds", "1", "--choose", "--minutes", "10", "--demos", "3",
            "--val-n", "2", "--eval-limit", "4", "--sft-val-every", "2", "--val-every", "2", "--record-dir", str(rec)]
    assert rl_vs_sft.cli.main([*argv, "--workdir", str(tmp_path / "w1")]) == 0
    kept = sorted(p.stem for p in (rec / "points").glob("*.json"))
    assert kept == sorted(n for _, n, _ in choice.candidates()) and (rec / "record.json").is_file()
    first = json.loads((tmp_path / "w1" / "choice.json").read_text())["chosen"]
    start = json.loads((rec / "points" / f"{kept[0]}.json").read_text())["start"]
    assert start and all(json.loads(p.read_text())["start"] == start for p in (rec / "points").glob("*.json"))
    (rec / "points" / "rft_lr3e-05.json").unlink()  # scored in this checkout only
    shutil.rmtree(tmp_path / "w1")  # another checkout: the start, checkpoints and evaluations gone

    ran = []
    real = rl_vs_sft.runs.stages.run_stage
    monkeypatch.setattr(rl_vs_sft.runs.stages, "run_stage", lambda cmd, *a, **k: ran.append(cmd) or real(cmd, *a, **k))
    assert rl_vs_sft.cli.main([*argv, "--workdir", str(tmp_path / "w1")]) == 0
    trained = [c for c in ran if any("/seed1/choice/" in str(x) for x in c)]
    assert trained and all(any("rft_lr3e-05" in str(x) for x in c) for c in trained)  # that point alone
    assert any(any(str(x).endswith("start") for x in c) for c in ran)  # the start, made again
    assert json.loads((tmp_path / "w1" / "choice.json").read_text())["chosen"] == first

    other = rec / "points" / "sft_more_lr1e-05_ep1.json"
    before = other.read_text()
    other.write_text(json.dumps({**json.loads(before), "start": "another"}) + "\n")
    with pytest.raises(SystemExit, match="sft_more_lr1e-05_ep1.json was scored from another start"):
        rl_vs_sft.cli.main([*argv, "--workdir", str(tmp_path / "w1")])
    assert json.loads(other.read_text())["start"] == "another"
