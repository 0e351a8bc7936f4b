"""The event loop's longest stall while a block runs (issue 83: no tool answer may hold the loop
more than 0.1 s, or every other trajectory of the batch waits with it).

    async with LoopStall() as stall:
        await tool.invoke(...)
    assert stall.longest_s < 0.1

A ticker task asks to wake every `tick_s`; `longest_s` is the largest delay of a wake-up past
its time, i.e. the longest stretch in which the loop ran nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class LoopStall:
    def __init__(self, tick_s: float = 0.005) -> None:
        self.tick_s = tick_s
        self.longest_s = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.perf_counter()
            self.longest_s = max(self.longest_s, now - last - self.tick_s)
            last = now

    async def __aenter__(self) -> "LoopStall":
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)  # the ticker has started
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(self.tick_s * 2)  # a stall at the very end is seen too
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
