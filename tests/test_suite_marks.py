"""The `slow` mark follows what a test starts (tests/helpers/heavy.py): the entry points of a Ray
session, a rollout engine and a retriever process are counted wherever they are imported from."""

from __future__ import annotations

import types

import heavy


def test_entry_points_are_wrapped_when_imported():
    from agent_rl.rollout.engine import RolloutEngine
    from retriever_server import launch

    assert hasattr(launch.start_server, "__wrapped__")
    assert hasattr(RolloutEngine.__dict__["create"].__func__, "__wrapped__")


def test_a_wrapped_start_is_counted_and_still_runs():
    fake = types.ModuleType("retriever_server.launch")
    fake.start_server = lambda *args: ("started", args)
    before = heavy.STARTS["a retriever process"]
    heavy._wrap(fake)
    assert fake.start_server(1) == ("started", (1,))
    assert heavy.STARTS["a retriever process"] == before + 1
    heavy.STARTS["a retriever process"] = before  # this test's own start is not a real one


def test_heavy_fixtures_make_a_test_slow(request):
    """This test asks for none: it is not slow; the fixtures listed exist somewhere in tests/."""
    assert request.node.get_closest_marker("slow") is None
    from pathlib import Path

    text = "\n".join(p.read_text() for p in Path(__file__).parent.rglob("*.py"))
    missing = [f for f in heavy.HEAVY_FIXTURES if f"def {f}(" not in text]
    assert not missing, f"HEAVY_FIXTURES names fixtures that no longer exist: {missing}"
