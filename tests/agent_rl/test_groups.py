"""The per-group steps (agent_rl/training/groups.py) are the same in every trainer mode: the
sync collector (`collect.collect_groups`) and the ahead collector (`collect.AheadCollector`)
keep the same groups and count the same losses for the same trajectories. Scripted
trajectories, no engine."""

from __future__ import annotations

import pytest

from agent_rl.types import Trajectory

# prompt -> its two samples: (answer, had a failed search)
SCRIPT = {
    "q0": [("a0", False), ("zz", False)],  # disagree: kept
    "q1": [("zz", False), ("zz", False)],  # agree: filtered
    "q2": [("a2", True), ("zz", False)],  # a failed search: dropped (with its group, or alone and then filtered)
    "q3": [("zz", False), ("a3", False)],  # disagree: kept
}
COUNTERS = ("rollout/failed_search_trajectories", "rollout/failed_search_share",
            "rollout/dropped_for_failed_search", "filter/dropped_groups")


def samples(prompt, group_id: int = 0) -> list[Trajectory]:
    return [Trajectory([1], [2, 3], [1, 1], [-0.1, -0.2], group_id=group_id, response_text=f"<answer>{a}</answer>",
                       golden_answers=prompt.golden_answers, data_source=prompt.data_source,
                       num_tool_failures=int(failed), policy_versions=[0, 0])
            for a, failed in SCRIPT[prompt.id]]


def prompts():
    from agent_rl.training.data import Prompt

    return [Prompt(p, f"question {p}", [f"a{p[1:]}"], "nq" if p in ("q0", "q1") else "hotpotqa") for p in SCRIPT]


class _Call:
    def __init__(self, fn) -> None:
        self.remote = fn


class ScriptedStream:
    """The RolloutWorker's stream methods: every group submitted is finished, with SCRIPT's samples."""

    def __init__(self) -> None:
        self.submitted: dict = {}
        self.stream_submit = _Call(lambda items: self.submitted.update({k: p for k, p, _ in items}))
        self.stream_take = _Call(self._take)

    def _take(self, keys, count):
        from agent_rl.rollout.stream import FinishedGroup

        keys = keys or sorted(self.submitted)[:count]
        return [FinishedGroup(k, p, samples(p)) for k in keys for p in [self.submitted.pop(k)]], {}


def via_sync(drop: str):
    from agent_rl.config import RewardConfig
    from agent_rl.training.data import PromptLoader
    from agent_rl.training.collect import collect_groups
    from agent_rl.training.metrics import StepTimer

    def rollout(batch):
        return [tr for g, p in enumerate(batch) for tr in samples(p, g)], {}

    loader = PromptLoader(prompts(), batch_size=2, shuffle=False)
    return collect_groups(loader, rollout, RewardConfig(), 2, True, 3, StepTimer(), drop_failed=drop)


AHEAD_MODES = {
    "one_step_off": ["trainer.mode=one_step_off"],
    # two batches ahead over a 3-step run: all four prompts are submitted before step 1 takes any
    "async": ["trainer.mode=async", "trainer.max_staleness=2"],
    # groups taken as they finish, not in submission order (the scripted stream finishes them in order)
    "async_drop": ["trainer.mode=async", "trainer.max_staleness=2", "trainer.staleness_policy=drop"],
}


def via_ahead(drop: str, mode: str = "one_step_off"):
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.collect import make_collector
    from agent_rl.training.data import PromptLoader
    from agent_rl.training.metrics import StepTimer

    # grpo compares samples within a group: a failed search takes its group along; reinforce_plus_plus does not
    estimator = "grpo" if drop == "group" else "reinforce_plus_plus"
    cfg = load_config(TrainConfig, None, [*AHEAD_MODES[mode], "actor_rollout_ref.actor.tis_cap=2",
                                          "data.train_batch_size=2", "data.shuffle=false", "algorithm.filter_groups=true",
                                          "algorithm.max_filter_rounds=3", "retriever.skip_failed_searches=true",
                                          f"algorithm.adv_estimator={estimator}"])
    loader = PromptLoader(prompts(), batch_size=2, shuffle=False)
    total_steps = 1 if mode == "one_step_off" else 3
    return make_collector(ScriptedStream(), loader, cfg, total_steps=total_steps, get=lambda x: x).collect(1, StepTimer())


@pytest.mark.parametrize("mode", list(AHEAD_MODES))
@pytest.mark.parametrize("drop", ["group", "trajectory"])
def test_sync_and_ahead_collectors_keep_the_same_groups_and_count_the_same(drop, mode):
    """Sync draws q0, q1 (q1 filtered), then q2, q3 by the keep rate; ahead takes q0, q1, then
    q2, then q3, one free place at a time (async: from the groups already submitted): the same
    trajectories either way, so algorithm.filter_groups refills the batch in every mode."""
    sync_trajs, sync_ids, sync_m = via_sync(drop)
    ahead_trajs, ahead_ids, ahead_m = via_ahead(drop, mode)
    kept = [(t.response_text, t.group_id, t.reward) for t in sync_trajs]
    assert kept == [("<answer>a0</answer>", 0, 1.0), ("<answer>zz</answer>", 0, 0.0),
                    ("<answer>zz</answer>", 1, 0.0), ("<answer>a3</answer>", 1, 1.0)]
    assert [(t.response_text, t.group_id, t.reward) for t in ahead_trajs] == kept
    assert sync_ids == ahead_ids == ["q0", "q1", "q2", "q3"]
    counters = {k: sync_m[k] for k in sync_m if k in COUNTERS or k.startswith("batch/groups/")}
    assert counters == {k: ahead_m[k] for k in ahead_m if k in COUNTERS or k.startswith("batch/groups/")}
    assert counters == {"rollout/failed_search_trajectories": 1.0, "rollout/failed_search_share": 1 / 8,
                        "rollout/dropped_for_failed_search": 2.0 if drop == "group" else 1.0,
                        "filter/dropped_groups": 1.0 if drop == "group" else 2.0,  # q2's lone sample has no spread
                        "batch/groups/nq": 1.0, "batch/groups/hotpotqa": 1.0}


def rft_collect(monkeypatch, estimator: str, mode: str):
    """One step's groups from `mode`'s collector with algorithm.filter_groups on, SCRIPT's q1
    answered right by both samples."""
    from types import SimpleNamespace

    import ray

    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.collect import make_collector
    from agent_rl.training.data import PromptLoader
    from agent_rl.training.metrics import StepTimer

    monkeypatch.setitem(SCRIPT, "q1", [("a1", False), ("a1", False)])
    ahead = [*AHEAD_MODES[mode], "actor_rollout_ref.actor.tis_cap=2"] if mode in AHEAD_MODES else []
    cfg = load_config(TrainConfig, None, ["data.train_batch_size=2", "data.shuffle=false", "algorithm.filter_groups=true",
                                          f"algorithm.adv_estimator={estimator}", *ahead])
    loader = PromptLoader(prompts(), batch_size=2, shuffle=False)
    if mode == "sync":  # worker.rollout.remote(prompts, n), read through ray.get
        monkeypatch.setattr(ray, "get", lambda ref: ref)
        worker = SimpleNamespace(rollout=SimpleNamespace(
            remote=lambda batch, n: ([tr for g, p in enumerate(batch) for tr in samples(p, g)], {})))
        return make_collector(worker, loader, cfg, total_steps=1).collect(1, StepTimer())
    return make_collector(ScriptedStream(), loader, cfg, total_steps=1, get=lambda x: x).collect(1, StepTimer())


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_rejection_sampling_keeps_a_group_whose_every_sample_is_right(monkeypatch, mode):
    """The group filter drops a group whose samples agree, for advantage 0 under a group
    baseline; rejection sampling has none and trains on each right answer, so with the filter
    on it keeps q1 (both right) in every collector. GRPO, on the same samples, drops q1 and
    draws q2 and q3 for it."""
    trajs, ids, metrics = rft_collect(monkeypatch, "rejection_sampling", mode)
    assert ids == ["q0", "q1"] and "filter/dropped_groups" not in metrics
    assert [(t.response_text, t.group_id, t.acc) for t in trajs] == [
        ("<answer>a0</answer>", 0, 1.0), ("<answer>zz</answer>", 0, 0.0),
        ("<answer>a1</answer>", 1, 1.0), ("<answer>a1</answer>", 1, 1.0)]
    trajs, ids, metrics = rft_collect(monkeypatch, "grpo", mode)
    assert ids == ["q0", "q1", "q2", "q3"] and metrics["filter/dropped_groups"] == 1.0
    assert "<answer>a1</answer>" not in [t.response_text for t in trajs]


def test_whether_agreeing_groups_are_filtered_is_the_estimators_registration(monkeypatch):
    """GroupRules reads the registry, not the name: the rejection_sampling function registered
    again without flat_groups_carry_signal is filtered, another name declaring it is not."""
    from agent_rl.config import TrainConfig
    from agent_rl.training import algos
    from agent_rl.training.groups import GroupRules

    for name, info in (("plain_keep", {}), ("my_rft", {"flat_groups_carry_signal": True})):  # this test only
        monkeypatch.setitem(algos.ADV_ESTIMATORS._fns, name, algos.rejection_sampling)
        monkeypatch.setitem(algos.ADV_ESTIMATORS._info, name, {"uses_groups": False, **info})
    cfg = TrainConfig()
    cfg.algorithm.filter_groups = True
    filtered = {}
    for name in ("grpo", "rejection_sampling", "plain_keep", "my_rft"):
        cfg.algorithm.adv_estimator = name
        filtered[name] = GroupRules.from_config(cfg).filter_on
    assert filtered == {"grpo": True, "rejection_sampling": False, "plain_keep": True, "my_rft": False}
    cfg.algorithm.filter_groups = False
    assert not GroupRules.from_config(cfg).filter_on  # off stays off
