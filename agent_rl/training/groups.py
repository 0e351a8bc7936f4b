"""What happens to a prompt's group of trajectories once it is generated, in every trainer mode.

The sync collector (`collect.collect_groups`: a batch of prompts per round, more rounds while
the filter leaves too few) and the ahead collector (`collect.AheadCollector`: groups as the
stream hands them over) differ only in how groups arrive. From there every group takes the
same steps, written once here so that the modes cannot drift apart: its rewards are set
(`score_trajectories`); trajectories with a failed search are left out
(`drop_failed_searches`); a group whose samples agree is dropped (`sift`); what was seen and
lost is counted (`Tally`); the kept groups are numbered 0..G-1 and counted per data source
(`batch_of`). Pure functions on trajectories: no engine, no Ray, so both collectors and their
tests share them (the model: tinker-cookbook's rl/data_processing.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from agent_rl.rollout.reward import score_trajectory
from agent_rl.training import algos
from agent_rl.types import Trajectory

Group = list[Trajectory]
"""The n trajectories sampled for one prompt."""


def check_filter_metric(name: str) -> None:
    if name not in ("score", "acc"):
        raise ValueError(f"algorithm.filter_metric must be score or acc, got {name!r}")


@dataclass(frozen=True)
class GroupRules:
    """What a step does with its groups, from the config (`from_config`)."""

    filter_on: bool = False
    """algorithm.filter_groups, unless the estimator's agreeing groups carry signal: drop a group
    whose samples agree (DAPO dynamic sampling)."""
    filter_metric: str = "score"
    """algorithm.filter_metric: what the samples must disagree on, the reward (score) or the task metric (acc)."""
    drop_failed: str | None = None
    """"group" | "trajectory" | None: leave out trajectories with a failed search (see `drop_failed_searches`)."""

    def __post_init__(self) -> None:
        check_filter_metric(self.filter_metric)
        if self.drop_failed not in ("group", "trajectory", None):
            raise ValueError(f"drop_failed must be group, trajectory or None, got {self.drop_failed!r}")

    @classmethod
    def from_config(cls, cfg: Any) -> GroupRules:
        """The rules of a TrainConfig: failed searches leave with their group under a group
        estimator (retriever.skip_failed_searches), alone otherwise. The group filter's reason,
        advantage 0 under a group baseline, does not hold for an estimator registered with
        flat_groups_carry_signal (rejection_sampling trains on every sample of an all-right
        group), so under one the filter drops nothing and draws no extra prompts."""
        a = cfg.algorithm
        drop = None
        if cfg.retriever.skip_failed_searches:
            drop = "group" if algos.uses_groups(a.adv_estimator) else "trajectory"
        filter_on = a.filter_groups and not algos.flat_groups_carry_signal(a.adv_estimator)
        return cls(filter_on, a.filter_metric, drop)


@dataclass
class Tally:
    """What one step's collection scored and left out, summed over every round (sync) or take
    (ahead): the outage rule must see a refill round's failed searches too, not the first
    round's alone (issue 33)."""

    scored: int = 0
    """Trajectories scored."""
    failed: int = 0
    """... of them with a failed search."""
    dropped: int = 0
    """Trajectories left out for a failed search (their own or a group mate's)."""
    filtered: int = 0
    """Groups dropped because their samples agreed."""

    def add(self, other: Tally) -> None:
        self.scored += other.scored
        self.failed += other.failed
        self.dropped += other.dropped
        self.filtered += other.filtered

    def metrics(self, rules: GroupRules) -> dict[str, float]:
        """rollout/failed_search_*, and the drop and filter counts of the rules that are on."""
        out = {"rollout/failed_search_trajectories": float(self.failed),
               "rollout/failed_search_share": self.failed / max(self.scored, 1)}
        if rules.drop_failed is not None:
            out["rollout/dropped_for_failed_search"] = float(self.dropped)
        if rules.filter_on:
            out["filter/dropped_groups"] = float(self.filtered)
        return out


@dataclass
class Sifted:
    """`sift`'s answer for one round's or one take's groups."""

    kept: list[Group]
    tally: Tally
    filter_metrics: dict[str, float] = field(default_factory=dict)
    """filter/* of `algos.filter_groups` over the groups left after the failed-search rule
    (empty with the filter off)."""


def score_trajectories(trajs: list[Trajectory], prompts: list, reward_cfg: Any) -> list:
    """Set each trajectory's `reward` and `acc` (the task metric alone) from its response text
    (response only, never the prompt); returns the `RewardResult`s (answer, EM/F1 metric, format
    flags). A trajectory without its own golden answers takes those of `prompts[group_id]`."""
    results = [
        score_trajectory(tr, tr.golden_answers or prompts[tr.group_id].golden_answers, reward_cfg)
        for tr in trajs
    ]
    for tr, r in zip(trajs, results):
        tr.reward, tr.acc = r.score, r.metric
    return results


def group_trajectories(trajs: list[Trajectory]) -> list[Group]:
    """Trajectories grouped by prompt (`group_id`), groups in first-appearance order."""
    groups: dict[int, Group] = {}
    for tr in trajs:
        groups.setdefault(tr.group_id, []).append(tr)
    return list(groups.values())


def drop_failed_searches(groups: list[Group], whole_group: bool) -> list[Group]:
    """Leave out trajectories with a failed search (an error observation, usually reward 0):
    trained on, they would teach the policy that searching fails. With `whole_group` their
    group goes too, since its other members' advantages were computed against them."""
    if whole_group:
        return [g for g in groups if not any(tr.num_tool_failures > 0 for tr in g)]
    kept = [[tr for tr in g if tr.num_tool_failures == 0] for g in groups]
    return [g for g in kept if g]


def sift(groups: list[Group], results: list, rules: GroupRules) -> Sifted:
    """The scored `groups` (`results`: their RewardResults, in the order of the groups'
    trajectories) less the trajectories with a failed search (`rules.drop_failed`) and, with
    the filter on, less the groups whose samples agree on `rules.filter_metric`: under a
    group baseline their advantage is 0 on every token, so they only dilute the batch."""
    trajs = [tr for g in groups for tr in g]
    if len(results) != len(trajs):
        raise ValueError(f"sift: {len(results)} results for {len(trajs)} trajectories")
    value = {id(tr): r.metric if rules.filter_metric == "acc" else r.score for tr, r in zip(trajs, results)}
    tally = Tally(scored=len(trajs), failed=sum(tr.num_tool_failures > 0 for tr in trajs))
    if rules.drop_failed is not None:
        groups = drop_failed_searches(groups, whole_group=rules.drop_failed == "group")
        tally.dropped = len(trajs) - sum(len(g) for g in groups)
    filter_metrics: dict[str, float] = {}
    if rules.filter_on:
        result = algos.filter_groups(torch.tensor([value[id(tr)] for g in groups for tr in g]),
                                     [i for i, g in enumerate(groups) for _ in g])
        filter_metrics = {f"filter/{k}": v for k, v in result.metrics.items()}
        tally.filtered = len(groups) - len(result.kept_groups)
        groups = [groups[i] for i in result.kept_groups]
    return Sifted(groups, tally, filter_metrics)


def batch_of(kept: list[Group]) -> tuple[list[Trajectory], dict[str, float]]:
    """The trajectories the update learns from, with group ids renumbered 0..G-1 (ids from
    different rounds or takes would collide), and batch/groups/<data_source>: the kept groups
    per source (the filter keeps some sources more than others)."""
    for gid, group in enumerate(kept):
        for tr in group:
            tr.group_id = gid
    sources = Counter(g[0].data_source or "unknown" for g in kept)
    return [tr for g in kept for tr in g], {f"batch/groups/{src}": float(n) for src, n in sources.items()}
