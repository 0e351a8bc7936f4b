"""Rollouts that run ahead of the trainer (`trainer.mode` one_step_off | async), worker side.

The driver submits prompts (`submit`), each with a key in submission order; every prompt's
group of n trajectories starts at once (bounded by `rollout.max_concurrent_trajectories`) and
keeps generating while the trainer updates. The driver takes finished groups (`take`): named
ones in key order (FIFO), or the first `count` to finish. Weight swaps go through the
manager's `PolicyGate`, so trajectories in flight continue on the new weights at their next
turn (partial rollouts) and every sampled token keeps the version that sampled it.

`snapshot()` is what a checkpoint holds of the rollouts: every group submitted and not taken,
with its finished trajectories, the state of each trajectory in flight at the start of its
current turn (token ids, masks, log-probs, versions, tool counters) and the members not
started yet. `submit(..., saved=)` continues such a group after a restart: finished members are
kept, members in flight resume at the turn they were in, the rest start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_rl.rollout.tools import ToolStats, tool_metrics
from agent_rl.types import Trajectory


@dataclass
class SavedGroup:
    """A group submitted and not taken, as a checkpoint keeps it (picklable)."""

    key: int
    prompt: Any
    done: list[Trajectory] = field(default_factory=list)
    live: list[Any] = field(default_factory=list)
    """States (`manager._State`) of members in flight, at the start of their current turn."""
    pending: int = 0
    """Members not started yet."""

    @property
    def sampled_tokens(self) -> int:
        """Sampled tokens already in it (not regenerated when it is continued)."""
        return sum(sum(t.loss_mask) for t in self.done) + sum(sum(s.loss_mask) for s in self.live)

    def to_dict(self) -> dict:
        """Plain JSON data (a checkpoint's rollouts.json)."""
        return {"key": self.key, "prompt": asdict(self.prompt), "done": [asdict(t) for t in self.done],
                "live": [asdict(s) for s in self.live], "pending": self.pending}

    @classmethod
    def from_dict(cls, d: dict, prompt_from: Callable[[dict], Any], n: int) -> SavedGroup:
        """The group `to_dict` wrote, checked first (`check_saved_group`) against rollout.n = `n`."""
        from agent_rl.rollout.manager import _State

        check_saved_group(d, n)

        def state(s: dict) -> _State:
            return _State(**{**s, "segments": [tuple(x) for x in s["segments"]]})

        return cls(int(d["key"]), prompt_from(d["prompt"]), [Trajectory(**t) for t in d["done"]],
                   [state(s) for s in d["live"]], int(d["pending"]))


PER_TOKEN = {"done": ("response_ids", ("loss_mask", "rollout_logprobs", "policy_versions")),
             "live": ("response_ids", ("loss_mask", "logprobs", "versions"))}
"""The arrays of a saved trajectory (done) or trajectory state (live) that hold one entry per
response token (a done trajectory's policy_versions may be empty: not recorded)."""


def check_saved_group(d: dict, n: int, where: str = "group") -> None:
    """Raise ValueError naming the field (`<where>.live[0].loss_mask has 1 entries,
    response_ids has 2`) when a saved group (`SavedGroup.to_dict`) does not hold n members or the per-token
    arrays of one of them disagree: a damaged or edited rollouts.json otherwise failed only
    when its trajectory ended, mid-step, and a group of another n hung `take()`."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} is not an object")
    for key in ("key", "prompt", "done", "live", "pending"):
        if key not in d:
            raise ValueError(f"{where} has no {key}")
    if not isinstance(d["done"], list) or not isinstance(d["live"], list) or not isinstance(d["pending"], int):
        raise ValueError(f"{where}: done and live must be lists, pending a number")
    members = len(d["done"]) + len(d["live"]) + d["pending"]
    if members != n or d["pending"] < 0:
        raise ValueError(f"{where} holds {members} members ({len(d['done'])} done, {len(d['live'])} in flight, "
                         f"{d['pending']} pending), rollout.n is {n}")
    for part, (ref, arrays) in PER_TOKEN.items():
        for i, item in enumerate(d[part]):
            at = f"{where}.{part}[{i}]"
            for name in (ref, *arrays):
                if not isinstance(item, dict) or name not in item:
                    raise ValueError(f"{at} has no {name}")
                if not isinstance(item[name], list):
                    raise ValueError(f"{at}.{name} is not a list")
            length = len(item[ref])
            for name in arrays:
                got = len(item[name])
                if got != length and not (name == "policy_versions" and got == 0):
                    raise ValueError(f"{at}.{name} has {got} entries, {ref} has {length}")


@dataclass
class FinishedGroup:
    key: int
    prompt: Any
    trajectories: list[Trajectory]


class _Group:
    def __init__(self, key: int, prompt: Any, n: int) -> None:
        self.key, self.prompt, self.n = key, prompt, n
        self.done: dict[int, Trajectory] = {}
        self.live: dict[int, Any] = {}
        self.error: BaseException | None = None
        self.task: asyncio.Task | None = None

    @property
    def finished(self) -> bool:
        return self.error is not None or len(self.done) == self.n

    def saved(self) -> SavedGroup:
        return SavedGroup(self.key, self.prompt, [self.done[i] for i in sorted(self.done)],
                          [self.live[i] for i in sorted(self.live)], self.n - len(self.done) - len(self.live))


class RolloutStream:
    """Groups of `n` trajectories per submitted prompt, generated ahead of the trainer."""

    def __init__(self, manager: Any, n: int) -> None:
        self.manager, self.n = manager, n
        self.groups: dict[int, _Group] = {}
        self.finish_order: list[int] = []
        self._changed: asyncio.Condition | None = None
        self._sem: asyncio.Semaphore | None = None
        self._stats_before: dict[str, ToolStats] = manager.tool_stats()

    def _sync(self) -> tuple[asyncio.Condition, asyncio.Semaphore]:
        if self._changed is None:
            self._changed = asyncio.Condition()
            self._sem = asyncio.Semaphore(self.manager.rcfg.max_concurrent_trajectories)
        return self._changed, self._sem

    async def submit(self, key: int, prompt: Any, saved: SavedGroup | None = None) -> None:
        if key in self.groups:
            raise ValueError(f"rollout group {key} was submitted twice")
        await self.manager.start_tools()
        g = _Group(key, prompt, self.n)
        self.groups[key] = g
        g.task = asyncio.create_task(self._run(g, saved))

    async def _run(self, g: _Group, saved: SavedGroup | None) -> None:
        changed, sem = self._sync()
        m = self.manager
        max_turns = m.max_turns
        sampling = m.sampling(greedy=False)
        states: list[Any] = [None] * self.n
        if saved is not None:
            for i, tr in enumerate(saved.done):
                g.done[i] = tr
            for j, st in enumerate(saved.live):
                states[len(saved.done) + j] = st
        try:
            (prompt_ids,), _ = await m._build_prompts([g.prompt], "agent")

            async def one(i: int) -> None:
                async with sem:
                    def keep(st: Any) -> None:
                        g.live[i] = st

                    tr = await m.run_trajectory(prompt_ids, sampling, max_turns, meta=g.prompt,
                                                state=states[i], on_turn=keep)
                g.live.pop(i, None)
                g.done[i] = tr

            async with asyncio.TaskGroup() as tg:
                for i in range(self.n):
                    if i not in g.done:
                        tg.create_task(one(i))
        except BaseException as e:  # the engine died, the retriever refused the key: the driver hears it in take()
            g.error = e.exceptions[0] if isinstance(e, BaseExceptionGroup) else e
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            async with changed:
                self.finish_order.append(g.key)
                changed.notify_all()

    async def take(self, keys: list[int] | None = None, count: int = 0) -> tuple[list[FinishedGroup], dict[str, float]]:
        """Finished groups: those of `keys` (in that order), else the first `count` to finish;
        and the tool metrics since the last take with the engine's idle seconds."""
        changed, _ = self._sync()
        missing = [k for k in keys or () if k not in self.groups]
        if missing:
            raise KeyError(f"rollout groups {missing} were never submitted (or were taken already)")
        async with changed:
            if keys:
                await changed.wait_for(lambda: all(self.groups[k].finished for k in keys))
                chosen = list(keys)
            else:
                await changed.wait_for(lambda: sum(k in self.groups for k in self.finish_order) >= count)
                chosen = [k for k in self.finish_order if k in self.groups][:count]
        out = []
        for k in chosen:
            g = self.groups.pop(k)
            self.finish_order.remove(k)
            if g.error is not None:
                raise g.error
            out.append(FinishedGroup(k, g.prompt, [g.done[i] for i in range(self.n)]))
        after = self.manager.tool_stats()
        metrics = tool_metrics({k: v.minus(self._stats_before.get(k, ToolStats())) for k, v in after.items()})
        self._stats_before = after
        metrics["async/engine_idle_s"] = self.manager.gate.take_idle_s()
        return out, metrics

    async def drain(self) -> None:
        """Until every submitted group has finished (one_step_off: before the weight swap)."""
        changed, _ = self._sync()
        async with changed:
            await changed.wait_for(lambda: all(g.finished for g in self.groups.values()))

    async def snapshot(self) -> list[SavedGroup]:
        """Every group not taken, as a checkpoint keeps it (generation paused meanwhile, so
        no turn is half-sampled)."""
        async with self.manager.gate.pause():
            return [self.groups[k].saved() for k in sorted(self.groups)]

    async def aclose(self) -> None:
        for g in self.groups.values():
            if g.task is not None:
                g.task.cancel()
        for g in self.groups.values():
            if g.task is not None:
                try:
                    await g.task
                except BaseException:
                    pass
        self.groups.clear()
