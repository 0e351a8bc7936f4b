"""What makes a test slow, counted where it happens: a Ray session (`ray.init`), a rollout engine
(`RolloutEngine.create`) and a retriever process (`retriever_server.launch.start_server`).

tests/conftest.py marks a test `slow` when it asks for a fixture that starts one of them
(`HEAVY_FIXTURES`), and fails a test that is not marked slow but started one anyway: the mark is
then missing, and `make test-fast` (`-m "not slow"`) would run it. Each entry point is wrapped
when its module is first imported (a meta-path hook), so nothing here imports Ray or vLLM.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections import Counter

RETRIEVER_FIXTURES = frozenset({"retriever_url", "dense_retriever_url", "retriever", "retriever_server", "bm25_server",
                                "two_servers", "keyed_server"})
"""Fixtures that start a retriever process (and nothing heavier)."""
RAY_FIXTURES = frozenset({"grpo_run", "cluster", "sync_setup"})
"""Fixtures that start Ray (a trainer run, a cluster of nodes, a Ray actor group)."""
HEAVY_FIXTURES = RETRIEVER_FIXTURES | RAY_FIXTURES | frozenset({
    "engine", "engine_bf16",  # vLLM engines (tests/agent_rl/conftest.py)
    "tiny_worker", "full_worker", "lora_worker",  # actor workers with their models, in this process
})
"""Fixtures that start an engine, a retriever process or Ray, or load a policy to train (directly
or through another)."""
RAY_SESSION = "a Ray session"
LANE_STARTS = frozenset({RAY_SESSION, "a rollout engine"})
"""What only a test of make test's lanes may start (tests/conftest.py); Ray only in the ray lane."""

STARTS: Counter = Counter()
"""How many of each kind this test process has started."""

ENTRY_POINTS = {"ray": ("init", RAY_SESSION),
                "agent_rl.rollout.engine": ("RolloutEngine.create", "a rollout engine"),
                "retriever_server.launch": ("start_server", "a retriever process")}


def _counted(fn, what: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        STARTS[what] += 1
        return fn(*args, **kwargs)

    return wrapper


def _wrap(module) -> None:
    attr, what = ENTRY_POINTS[module.__name__]
    owner_name, _, name = attr.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    if owner_name:  # a classmethod: wrap the function under it, keep it a classmethod
        raw = owner.__dict__[name]
        setattr(owner, name, classmethod(_counted(raw.__func__, what)))
    else:
        setattr(owner, name, _counted(getattr(owner, name), what))


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in ENTRY_POINTS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Count starts from now on (modules imported already are wrapped at once)."""
    if any(isinstance(f, _Hook) for f in sys.meta_path):
        return
    for name in ENTRY_POINTS:
        if name in sys.modules:
            _wrap(sys.modules[name])
    sys.meta_path.insert(0, _Hook())
