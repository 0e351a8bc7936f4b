"""Driver side of `trainer.mode` one_step_off | async: rollouts submitted ahead of the trainer.

The loader's prompts are submitted to the rollout worker's stream (`agent_rl.rollout.stream`)
with keys in submission order, up to `ahead` batches beyond the one being trained
(one_step_off: 1; async: trainer.max_staleness). A step takes `train_batch_size` groups:

- in submission order (one_step_off, and async with staleness_policy=wait): a group submitted
  at policy version v is trained by version v + ahead at the latest, so its staleness is
  within the bound by construction;
- in the order they finish (async, staleness_policy=drop): a slow group (three searches, one
  slow tool) does not hold the step; a group whose oldest token lags the trainer by more than
  trainer.max_staleness versions is dropped and counted.

The taken groups go through the steps of sync mode (agent_rl.training.groups: scoring, the
failed-search rule, group filtering, the counts, renumbering) and the trainer's outage wait;
a dropped or filtered group is replaced by the next one. A checkpoint holds `state()`: the next key and every group submitted and not
trained, with its trajectories in flight (`SavedGroup`); `restore` submits them again first,
so a resumed run trains each prompt once and continues, not regenerates, what was sampled.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agent_rl.rollout.manager import rollout_metrics
from agent_rl.training.data import PromptLoader
from agent_rl.training.groups import GroupRules, Tally, batch_of, score_trajectories, sift
from agent_rl.training.metrics import reward_metrics
from agent_rl.types import Trajectory

log = logging.getLogger(__name__)


class AheadCollector:
    """`worker`: the RolloutWorker actor handle; `get`: how a call's result is awaited
    (ray.get; tests pass a plain worker object and the identity); `outage(metrics, t)`: the
    trainer's outage rule, run on each step's metrics (none in tests)."""

    def __init__(self, worker: Any, loader: PromptLoader, cfg: Any, total_steps: int, get: Any = None,
                 outage: Any = None) -> None:
        tr = cfg.trainer
        self.worker, self.loader, self.cfg, self.total_steps = worker, loader, cfg, total_steps
        self.outage = outage
        if get is None:
            import ray

            get = ray.get
        self.get = get
        self.ahead = 1 if tr.mode == "one_step_off" else tr.max_staleness
        self.fifo = tr.mode == "one_step_off" or tr.staleness_policy == "wait"
        self.batch = cfg.data.train_batch_size
        self.next_key = 0
        self.outstanding: list[tuple[int, Any]] = []
        """(key, prompt) submitted and not taken, in submission order."""
        self._resumed_keys: dict[int, int] = {}
        """Continued groups not trained yet -> their sampled tokens from the checkpoint (logged once trained)."""

    # ------------------------------------------------------------------ submission
    def _cap(self, step: int, kept: int) -> int:
        """Groups that may be outstanding: `ahead` batches beyond the current one, and no more
        than the run still trains (the last steps do not run into the next epoch; a dropped or
        filtered group frees its place for the next prompt)."""
        return min(self.batch * (1 + self.ahead), (self.total_steps - step + 1) * self.batch - kept)

    def top_up(self, step: int, kept: int = 0) -> None:
        need = self._cap(step, kept) - len(self.outstanding)
        if need <= 0:
            return
        items = []
        for p in self.loader.take(need):
            items.append((self.next_key, p, None))
            self.outstanding.append((self.next_key, p))
            self.next_key += 1
        self.get(self.worker.stream_submit.remote(items))

    # ------------------------------------------------------------------ one step's groups
    def collect(self, step: int, t: Any, score: Any = None) -> tuple[list[Trajectory], list[str], dict[str, float]]:
        """Groups for step `step` (the engine holds version step-1). `score(trajs, prompts)`
        sets rewards and returns the RewardResults (default: `groups.score_trajectories` with
        the config's reward). Returns (trajectories with group ids 0..G-1, ids of every prompt
        consumed, metrics)."""
        cfg, a = self.cfg, self.cfg.algorithm
        score = score or functools.partial(score_trajectories, reward_cfg=cfg.reward)
        rules = GroupRules.from_config(cfg)
        version = step - 1
        kept: list[list[Trajectory]] = []
        consumed: list[str] = []
        metrics: dict[str, float] = {}
        tally = Tally()
        dropped_stale = 0
        results_all: list[Any] = []
        seen: list[Trajectory] = []
        rounds = 0
        wait_s = 0.0
        resumed_tokens = 0
        max_rounds = 1 + (a.max_filter_rounds if a.filter_groups else 0) + 4 * self.ahead
        while len(kept) < self.batch:
            rounds += 1
            if rounds > max_rounds:
                break
            self.top_up(step, len(kept))
            want = self.batch - len(kept)
            t0 = time.perf_counter()
            with t("gen"):
                if self.fifo:
                    keys = [k for k, _ in self.outstanding[:want]]
                    groups, tool_m = self.get(self.worker.stream_take.remote(keys, 0))
                else:
                    groups, tool_m = self.get(self.worker.stream_take.remote(None, min(want, len(self.outstanding))))
            wait_s += time.perf_counter() - t0
            for k, v in tool_m.items():
                metrics[k] = metrics.get(k, 0.0) + v
            taken = {g.key for g in groups}
            self.outstanding = [(k, p) for k, p in self.outstanding if k not in taken]
            fresh: list[list[Trajectory]] = []
            results: list[Any] = []
            for g in groups:
                consumed.append(g.prompt.id)
                resumed_tokens += self._resumed_keys.pop(g.key, 0)
                if max(tr.staleness(version) for tr in g.trajectories) > self.ahead:
                    dropped_stale += 1
                    continue
                fresh.append(g.trajectories)
                with t("reward"):
                    results += score(g.trajectories, [g.prompt])
            sifted = sift(fresh, results, rules)
            tally.add(sifted.tally)
            results_all += results
            seen += [tr for g in fresh for tr in g]
            kept += sifted.kept
        if not kept:
            raise RuntimeError(f"step {step}: no group to train on after {rounds - 1} takes (dropped for staleness: "
                               f"{dropped_stale}, filtered: {tally.filtered}, failed searches: {tally.dropped})")
        trained, per_source = batch_of(kept)
        staleness = [tr.staleness(version) for tr in trained]
        metrics.update(rollout_metrics(seen, wait_s))
        metrics.update(reward_metrics(results_all, cfg.reward.kind))
        metrics.update(tally.metrics(rules))
        metrics["async/dropped_stale"] = float(dropped_stale)
        metrics["async/trainer_wait_s"] = wait_s
        metrics["async/policy_version"] = float(version)
        metrics["async/staleness_mean"] = sum(staleness) / len(staleness)
        metrics["async/staleness_max"] = float(max(staleness))
        for lag, n in Counter(staleness).items():
            metrics[f"async/staleness/{lag}"] = float(n)
        metrics["async/partial_trajectories"] = float(sum(len({v for v in tr.policy_versions if v >= 0}) > 1
                                                          for tr in trained))
        metrics["async/resumed_sampled_tokens"] = float(resumed_tokens)
        metrics.update(per_source)
        if self.outage is not None:  # the groups generating now wait for a retriever that is down
            self.outage(metrics, t)
        return trained, consumed, metrics

    def before_push(self, t: Any) -> None:
        """one_step_off: the batch generated during the update finishes on the weights it
        started with, then the swap; async swaps at once (between turns: partial rollouts)."""
        with t("drain"):
            if self.cfg.trainer.mode == "one_step_off":
                self.get(self.worker.stream_drain.remote())

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """What a checkpoint keeps (JSON): the next key and the groups not trained, with
        their trajectories in flight."""
        saved = self.get(self.worker.stream_snapshot.remote())
        return {"next_key": self.next_key, "groups": [g.to_dict() for g in saved]}

    def restore(self, state: dict) -> None:
        """Submit the checkpoint's groups again, in their order, continuing what they sampled."""
        from agent_rl.rollout.stream import SavedGroup
        from agent_rl.training.data import Prompt

        self.next_key = int(state["next_key"])
        n = self.cfg.actor_rollout_ref.rollout.n
        groups = [SavedGroup.from_dict(d, lambda p: Prompt(**p), n) for d in state["groups"]]
        self.outstanding = [(g.key, g.prompt) for g in groups]
        self._resumed_keys = {g.key: g.sampled_tokens for g in groups}
        if groups:
            self.get(self.worker.stream_submit.remote([(g.key, g.prompt, g) for g in groups]))
        live = sum(len(g.live) for g in groups)
        done = sum(len(g.done) for g in groups)
        print(f"[train] continuing {len(groups)} groups from the checkpoint: {done} trajectories finished, {live} in "
              f"flight, {sum(self._resumed_keys.values())} sampled tokens kept", flush=True)


def read_rollouts(path: Path, n: int) -> dict:
    """A checkpoint's rollouts.json (`AheadCollector.state`), every group checked against
    rollout.n = `n` and every per-token array against its trajectory's length
    (agent_rl.rollout.stream.check_saved_group), then built as `restore` builds it, and every
    key an integer held by one group, below next_key (the stream keeps one group per key: a
    collision loses one): a bad file is named with the field at fault when it is loaded,
    before anything starts, not when its trajectory ends mid-step or `restore` runs."""
    from agent_rl.rollout.stream import SavedGroup, check_saved_group
    from agent_rl.training.data import Prompt

    try:
        state = json.loads(path.read_text())
    except ValueError as e:  # UnicodeDecodeError is one
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("groups"), list) or "next_key" not in state:
        raise ValueError(f"{path}: expected an object with next_key and a list of groups")
    if not _is_int(state["next_key"]):
        raise ValueError(f"{path}: next_key is not an integer: {state['next_key']!r}")
    keys: dict[int, int] = {}
    for i, group in enumerate(state["groups"]):
        where = f"groups[{i}]"
        try:
            check_saved_group(group, n, where)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if not _is_int(group["key"]):
            raise ValueError(f"{path}: {where}.key is not an integer: {group['key']!r}")
        if group["key"] in keys:
            raise ValueError(f"{path}: {where}.key {group['key']} is also groups[{keys[group['key']]}]'s")
        keys[group["key"]] = i
        if state["next_key"] <= group["key"]:
            raise ValueError(f"{path}: next_key {state['next_key']} is not past {where}.key {group['key']}")
        try:
            Prompt(**group["prompt"])
        except TypeError as e:
            raise ValueError(f"{path}: {where}.prompt is not a prompt ({e})") from None
        try:
            SavedGroup.from_dict(group, lambda p: Prompt(**p), n).sampled_tokens
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: {where} cannot be restored ({type(e).__name__}: {e})") from None
    return state


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
