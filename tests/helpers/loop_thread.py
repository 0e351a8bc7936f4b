"""An asyncio loop running in a background thread, for tests that keep engines, servers or
clients alive across tests (no pytest-asyncio): `lt(coro)` runs a coroutine on it and waits.
Shared through pytest's `pythonpath`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def __call__(self, coro: Coroutine, timeout: float = 300.0) -> Any:
        """Run `coro` on the session loop; a hang fails the test after `timeout` seconds."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
