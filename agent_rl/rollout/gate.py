"""The policy gate: which policy version samples each turn, and weight swaps between turns.

Every `generate` of the rollout goes through one `PolicyGate`. A weight swap (`swap`) closes
the gate, lets the turns being generated finish on the weights they started with, loads the
new weights, bumps `version` and opens the gate again: trajectories waiting at the gate
continue on the new policy (partial rollouts, at turn boundaries). So every sampled token has
exactly one policy version, the one its turn started with, and the engine never sees a weight
load while a request is in flight (vLLM's in-process engine refuses that).

`pause()` closes the gate the same way without loading anything (a checkpoint's snapshot of
the trajectories in flight). The gate also counts the engine's idle time: seconds with no
generation in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any


class PolicyGate:
    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine = engine
        self.version = version
        """Policy version of the engine's weights: the number of swaps (the trainer's step)."""
        self._in_flight = 0
        self._open: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._idle_since: float | None = time.monotonic()
        self.idle_s = 0.0
        """Seconds the engine had nothing to generate (summed; see `take_idle_s`)."""

    def _events(self) -> None:
        if self._open is None:  # made on first use, inside the event loop that uses them
            self._open, self._idle, self._lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
            self._open.set()
            self._idle.set()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    async def generate(self, prompt_ids: list[int], sampling: Any) -> tuple[Any, int]:
        """(the engine's GenerateResult, the policy version that sampled it)."""
        self._events()
        while not self._open.is_set():
            await self._open.wait()
        version = self.version
        if self._in_flight == 0 and self._idle_since is not None:
            self.idle_s += time.monotonic() - self._idle_since
            self._idle_since = None
        self._in_flight += 1
        self._idle.clear()
        try:
            return await self.engine.generate(prompt_ids, sampling), version
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
                self._idle_since = time.monotonic()

    @asynccontextmanager
    async def pause(self):
        """Closed gate, no generation in flight, for the body's duration."""
        self._events()
        async with self._lock:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()

    async def swap(self, load: Callable[[], Awaitable[Any]], version: int | None = None) -> Any:
        """Run `load()` (the engine's weight load) between turns; the version becomes
        `version` (the trainer's step) or the next one."""
        async with self.pause():
            out = await load()
            self.version = self.version + 1 if version is None else version
            return out

    def take_idle_s(self) -> float:
        """Idle seconds since the last call (an idle stretch still running counts up to now)."""
        now = time.monotonic()
        idle = self.idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        if self._idle_since is not None:
            self._idle_since = now
        self.idle_s = 0.0
        return idle
