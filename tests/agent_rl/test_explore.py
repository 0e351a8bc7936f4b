"""The exploration pre-flight (agent_rl/training/explore.py) on hand-computed batches, its place in
agent-rl-train's step 1 (`first_batch`), and the side-by-side table of `agent-rl-eval explore`
(the end-to-end run of the command, on a real engine and retriever, is the slow test at the end)."""

from __future__ import annotations

import json
import re

import pytest

from agent_rl.config import TrainConfig, load_config
from agent_rl.training import explore
from agent_rl.training.data import Prompt
from agent_rl.types import Trajectory

EXACT = 1e-12  # sums of a few floats: equal to the hand value up to rounding


def traj(ids, lps, mask=None, reward=0.0, acc=0.0, searches=0, gid=0, question="", text=""):
    mask = mask or [1] * len(ids)
    return Trajectory(prompt_ids=[1], response_ids=ids, loss_mask=mask, rollout_logprobs=lps, reward=reward,
                      acc=acc, num_searches=searches, group_id=gid, question=question, response_text=text)


def batch():
    """Three groups of two, by hand:
    A (single): [5,6,7] vs [5,8]: they fork at position 1 (-log p 0.2 and 0.9); right and wrong.
    B (bridge): the same sequence twice (no fork); rewards 0.2 and 0 (a format term), both wrong.
    C (bridge): [3] twice; both right."""
    a = [traj([5, 6, 7], [-0.1, -0.2, -0.3], reward=1, acc=1, searches=1, gid=0, question="qa", text="x"),
         traj([5, 8], [-0.1, -0.9], reward=0, acc=0, searches=2, gid=0, question="qa", text="y")]
    b = [traj([4, 9, 9], [-0.5, 0.0, -0.4], mask=[1, 0, 1], reward=0.2, gid=1, question="qb"),
         traj([4, 9, 9], [-0.5, 0.0, -0.4], mask=[1, 0, 1], reward=0.0, gid=1, question="qb")]
    c = [traj([3], [-0.05], reward=1, acc=1, gid=2, question="qc", text="x"),
         traj([3], [-0.05], reward=1, acc=1, gid=2, question="qc", text="x")]
    return [a, b, c]


KINDS = {"qa": "single", "qb": "bridge", "qc": "bridge"}


def strategy(tr):
    return tr.response_text or None  # "x" / "y" told, "" not told (no search)


def test_figures_of_a_hand_computed_batch():
    f = explore.summarize(batch(), strategy)
    assert (f.groups, f.samples) == (3, 6)
    # sampled tokens only (B's middle token is an observation): (0.6 + 1.0 + 0.9 + 0.9 + 0.1) / 11
    assert f.token_nll == pytest.approx(3.5 / 11, abs=EXACT)
    assert f.fork_token_nll == pytest.approx((0.2 + 0.9) / 2, abs=EXACT)  # A alone forks
    assert f.reward_differs == pytest.approx(2 / 3)  # A and B
    assert f.metric_differs == pytest.approx(1 / 3)  # A alone: B's rewards differ by a format term only
    assert f.pass_at_1 == pytest.approx(3 / 6)
    assert f.pass_at_n == pytest.approx(2 / 3)  # A and C have a right answer
    assert f.signal == pytest.approx(0.25 / 3, abs=EXACT)  # A's p(1-p) = 1/4, B's and C's 0
    assert f.signal_at_pass_rate == pytest.approx(0.5 * 0.5 * (2 - 1) / 2, abs=EXACT)
    assert f.searches == pytest.approx(3 / 6)
    assert f.multi_strategy == pytest.approx(1 / 2)  # A samples x and y, C only x; B has none told


def test_figures_by_kind():
    pre = explore.preflight(batch(), lambda tr: KINDS[tr.question])
    assert list(pre.by_kind) == ["bridge", "single"]
    single, bridge = pre.by_kind["single"], pre.by_kind["bridge"]
    assert single.token_nll == pytest.approx(1.6 / 5, abs=EXACT)
    assert (single.pass_at_1, single.reward_differs) == (0.5, 1.0)
    assert bridge.token_nll == pytest.approx(1.9 / 6, abs=EXACT)
    assert bridge.fork_token_nll is None  # neither bridge group forks
    assert (bridge.reward_differs, bridge.metric_differs, bridge.pass_at_1, bridge.pass_at_n) == (0.5, 0.0, 0.5, 0.5)
    m = pre.metrics()
    assert m["explore/single/pass_at_1"] == 0.5 and m["explore/bridge/groups"] == 2.0
    assert "explore/bridge/fork_token_nll" not in m  # a figure that does not exist is not logged as 0
    assert "explore/multi_strategy" not in m  # no classifier passed


def test_a_sample_that_ends_first_forks_there():
    g = [traj([5, 6], [-0.1, -0.2]), traj([5, 6, 7], [-0.1, -0.2, -0.7])]
    assert explore.fork_nlls(g) == [pytest.approx(0.7)]  # the ended sample has no token at position 2
    assert explore.fork_nlls([traj([5], [-0.1]), traj([5], [-0.1])]) == []


def test_verdict_can_learn_on_the_batch():
    pre = explore.preflight(batch())
    assert pre.verdict == "can learn" and pre.advice == []
    assert pre.informative == pytest.approx(2 / 3)
    assert pre.metrics()["explore/can_learn"] == 1.0


def test_verdict_at_risk_names_each_floor_and_what_to_change():
    t = explore.Thresholds(entropy_floor=0.4, informative_floor=0.5)
    pre = explore.preflight(batch(), informative_on="acc", thresholds=t)
    assert pre.informative == pytest.approx(1 / 3)  # on the task metric: A alone
    assert pre.verdict == "at risk: entropy 0.318 nats < 0.4 (arXiv 2606.18487); 33% of groups differ in task metric < 50%"
    text = " ".join(pre.advice)
    assert "earlier SFT checkpoint" in text and "temperature" in text and "0.3 nats" in text
    assert "rollout.n" in text and "algorithm.filter_groups=true" in text
    assert pre.metrics()["explore/can_learn"] == 0.0
    on = explore.preflight(batch(), informative_on="acc", thresholds=t, filter_on=True)
    assert not any("filter_groups" in a for a in on.advice)  # the run drops flat groups already


def test_a_collapsed_start_is_at_risk_with_the_default_floors():
    """Every sample the same confident right answer: the demo's SFT start taken too far."""
    groups = [[traj([3, 4], [-0.01, -0.01], reward=1, acc=1, gid=g) for _ in range(4)] for g in range(3)]
    pre = explore.preflight(groups)
    assert pre.verdict == ("at risk: entropy 0.010 nats < 0.18 (arXiv 2606.18487); "
                           "0% of groups differ in rewards < 25%")
    assert pre.overall.fork_token_nll is None and pre.overall.signal == 0.0
    assert any("all right" in a for a in pre.advice)  # pass@1 1.0: harder questions or an earlier checkpoint


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no groups"):
        explore.summarize([])
    with pytest.raises(ValueError, match="informative_on"):
        explore.assess(explore.summarize(batch()), informative_on="em")


def test_kept_share_from_either_collector():
    assert explore.kept_share({"filter/frac_groups_kept": 0.4}, 8) == 0.4  # sync: the first round's
    assert explore.kept_share({"filter/dropped_groups": 6.0}, 2) == pytest.approx(0.25)  # ahead: 2 kept, 6 dropped
    assert explore.kept_share({}, 2) is None


# ----------------------------------------------------------------------------- agent-rl-train's step 1
def _trainer_batch():
    trajs = [tr for g in batch() for tr in g]
    prompts = [Prompt(id=q, question=q, stratum=k) for q, k in KINDS.items()]
    return trajs, prompts


def test_first_batch_prints_the_block_and_returns_explore_metrics(capsys):
    trajs, prompts = _trainer_batch()
    m = explore.first_batch(1, trajs, {}, TrainConfig(), prompts)
    out = capsys.readouterr().out
    assert out.startswith("[preflight] exploration pre-flight on step 1's batch (rollout.n 4, temperature 1.0")
    assert "| figure" in out and "bridge" in out and "single" in out and "verdict: can learn" in out
    assert m["explore/informative"] == pytest.approx(2 / 3) and m["explore/bridge/groups"] == 2.0


def test_first_batch_only_at_step_1_and_with_the_knob_on(capsys):
    trajs, prompts = _trainer_batch()
    assert explore.first_batch(2, trajs, {}, TrainConfig(), prompts) == {}
    off = load_config(TrainConfig, None, ["trainer.preflight=false"])
    assert explore.first_batch(1, trajs, {}, off, prompts) == {}
    assert capsys.readouterr().out == ""


def test_first_batch_reads_the_share_the_filter_kept(capsys):
    trajs, prompts = _trainer_batch()
    cfg = load_config(TrainConfig, None, ["algorithm.filter_groups=true"])
    m = explore.first_batch(1, trajs, {"filter/frac_groups_kept": 0.125}, cfg, prompts)
    assert m["explore/informative"] == 0.125 and m["explore/can_learn"] == 0.0
    out = capsys.readouterr().out
    assert "note: algorithm.filter_groups kept 12% of the groups it read" in out
    assert "filter_groups=true" not in out  # on already: not advised


def test_the_trainer_calls_it_on_the_collected_batch():
    """fit() stays a reading of the step: the pre-flight is one call on what the collector returned."""
    import inspect

    from agent_rl.training.trainer import RayTrainer

    src = inspect.getsource(RayTrainer.fit)
    assert "explore.first_batch(self.step, trajs, metrics, cfg, self.loader.prompts)" in src
    assert src.index("self.collector.collect(") < src.index("explore.first_batch") < src.index("update_actor")


# ----------------------------------------------------------------------------- agent-rl-eval explore
def test_comparison_table_side_by_side():
    sft = explore.preflight(batch(), lambda tr: KINDS[tr.question])
    flat = explore.preflight([batch()[2]], lambda tr: KINDS[tr.question])  # group C alone: no fork
    text = explore.comparison({"sft": sft, "flat": flat})
    assert text.splitlines()[:5] == [
        "| figure                            |   sft |  flat |",
        "|-----------------------------------|------:|------:|",
        "| groups x samples                  | 3 x 2 | 1 x 2 |",
        "| entropy est. (nats, mean -log p)  | 0.318 | 0.050 |",
        "|   at first divergence             | 0.550 |   n/a |",
    ]
    assert "| groups sampling >1 strategy" not in text  # nobody has it: the row is left out
    single = text.split("kind single:\n")[1].split("\n\n")[0]
    assert single.splitlines()[0] == "| figure                            |   sft |"  # flat has no single question
    assert "kind bridge:\n| figure                            |   sft |  flat |" in text
    verdicts = text.split("\n\n")[-2:]
    assert verdicts[0] == "sft: can learn"
    assert verdicts[1].splitlines()[0] == ("flat: at risk: entropy 0.050 nats < 0.18 (arXiv 2606.18487); "
                                           "0% of groups differ in rewards < 25%")
    assert len(verdicts[1].splitlines()) == 1 + len(flat.advice) == 5  # entropy, pass rate, n, filter


def test_the_start_is_the_latest_checkpoint_that_can_learn():
    """Checkpoints in training order: the later, the more collapsed. The latest that passes every
    floor is taken (not the earliest, not the one with the most disagreement); where none passes,
    the largest informative share, the earliest of equals; nothing to choose from is an error."""
    learns, collapsed = explore.preflight(batch()), explore.preflight([batch()[2]])  # 2/3 vs 0 informative
    assert not learns.risks and collapsed.risks
    wider = explore.preflight(batch(), thresholds=explore.Thresholds(entropy_floor=0.4))  # at risk, informative 2/3
    assert explore.choose_start({"s10": learns, "s20": learns, "s40": collapsed}) == (
        "s20", "the latest of 3 that can learn (1 later one(s) at risk)")
    assert explore.choose_start({"s10": collapsed, "s20": learns})[0] == "s20"
    assert explore.choose_start({"s10": collapsed, "s20": wider, "s30": wider, "s40": collapsed}) == (
        "s20", "none of 4 passes every floor: the largest informative share (67%)")
    with pytest.raises(ValueError, match="no checkpoints"):
        explore.choose_start({})


@pytest.mark.slow
def test_explore_command_end_to_end(tiny_policy, tiny_kb, retriever_url, tmp_path):
    """agent-rl-eval explore on the tiny policy, a real retriever, 2 questions x 2 samples of one
    short turn (the settings a training YAML gives): the table, the model's column, its verdict,
    the --json figures and --choose's start. Several models side by side:
    test_comparison_table_side_by_side; the rule: test_the_start_is_the_latest_checkpoint_that_can_learn.
    Its own process, as a user runs it: an in-process vLLM engine's shutdown tears down vLLM's
    process-wide parallel state, which the session's `engine` fixture still uses."""
    import subprocess
    import sys
    from pathlib import Path

    short = tmp_path / "short.yaml"  # one turn of 24 tokens: the command's path, not the model's skill
    # on the transformers backend (vLLM's contract; starts in seconds): the subject is the command
    short.write_text("max_turns: 1\nactor_rollout_ref:\n  rollout:\n    max_tokens_per_turn: 24\n    engine_mode: hf\n")
    out_json = tmp_path / "explore.json"
    console = Path(sys.executable).with_name("agent-rl-eval")
    proc = subprocess.run([str(console), "explore", f"a={tiny_policy}", "--data", str(tiny_kb / "train.parquet"),
                           "--retriever-url", retriever_url, "--n", "2", "--limit", "2", "--temperature", "1.5",
                           "--json", str(out_json), "--config", str(short), "--max-model-len", "1024",
                           "--dtype", "float32", "--choose"], capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "[explore] 2 questions x n 2 at temperature 1.5" in out
    assert re.search(r"^\| groups x samples +\| +2 x 2 \|$", out, re.M), out
    assert "\nkind " in out  # the generated KB's questions carry their kind
    assert re.search(r"^a: (can learn|at risk: )", out, re.M), out
    figures = json.loads(out_json.read_text())["a"]
    assert figures["explore/groups"] == 2.0 and figures["explore/samples"] == 4.0
    assert figures["explore/token_nll"] > 0  # sampled at temperature 1.5: no token is certain
    # --choose: one checkpoint is the start whatever its verdict (the rule: test_the_start_is_the_latest...)
    start = json.loads(out_json.read_text())["start"]
    assert start["label"] == "a" and start["model"] == str(tiny_policy)
    assert f"start: a = {tiny_policy} (" in out
