"""The `slow` mark follows what a test starts (tests/helpers/heavy.py): the entry points of a Ray
session, a rollout engine and a retriever process are counted wherever they are imported from."""

from __future__ import annotations

import types

import pytest

import heavy

pytest_plugins = ["pytester"]

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


def test_the_slow_and_timed_tests_form_two_lanes_that_run_first(request):
    """Under xdist (`make test`: `-n 2 --dist loadgroup`) the tests that start Ray (the `ray` mark
    or a Ray fixture) form the `ray` lane; the others slow by hand or by an engine fixture, and the
    `timed` ones, the `serial` lane; both are moved to the front, in their order except that the
    modules none of whose tests need the prepared model come first (whole modules); a test slow
    only by a retriever fixture is slow but in neither; without xdist nothing is grouped or moved."""
    from pathlib import Path

    here = Path(__file__).with_name("conftest.py")
    conftest = next(p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(here))

    class Item:
        def __init__(self, name, fixtures=(), marks=(), module="test_m"):
            self.name, self.fixturenames, self.marks = name, list(fixtures), [getattr(pytest.mark, m).mark for m in marks]
            self.nodeid = f"tests/{module}.py::{name}"
            self.stash = pytest.Stash()

        def get_closest_marker(self, name):
            return next((m for m in self.marks if m.name == name), None)

        def add_marker(self, mark):
            self.marks.append(mark.mark)

    class Config:
        def __init__(self, xdist):
            self.pluginmanager = types.SimpleNamespace(hasplugin=lambda name: xdist and name == "xdist")

    def collect(xdist):
        items = [Item("a"), Item("b", fixtures=["engine", "retriever_url"]), Item("r", fixtures=["retriever_url"]),
                 Item("g", marks=["ray"]), Item("c", marks=["timed"]), Item("d"), Item("e", marks=["slow"]),
                 Item("h", fixtures=["grpo_run", "retriever_url"]), Item("f", fixtures=["bm25_server"], marks=["slow"])]
        conftest.pytest_collection_modifyitems(Config(xdist), items)
        return items

    items = collect(xdist=True)
    assert [i.name for i in items] == ["b", "g", "c", "e", "h", "f", "a", "r", "d"]
    groups = {i.name: [m.args for m in i.marks if m.name == "xdist_group"] for i in items}
    assert groups == {"b": [("serial",)], "g": [("ray",)], "c": [("serial",)], "e": [("serial",)], "h": [("ray",)],
                      "f": [("serial",)], "a": [], "r": [], "d": []}
    slow = {i.name for i in items if i.get_closest_marker("slow")}
    assert slow == {"b", "r", "g", "e", "h", "f"}  # slow by its fixtures or the ray mark, in a lane or not
    assert {i.name: i.stash[conftest.LANE] for i in items} == {
        "a": None, "b": "serial", "r": None, "g": "ray", "c": "serial", "d": None, "e": "serial", "h": "ray",
        "f": "serial"}
    items = collect(xdist=False)
    assert [i.name for i in items] == ["a", "b", "r", "g", "c", "d", "e", "h", "f"]
    assert not any(m.name == "xdist_group" for i in items for m in i.marks)

    # a lane module with a test that needs the model (by any fixture above it: model_dir in the
    # closure) goes after the lane modules that need none; its other tests stay beside it
    items = [Item("m1", fixtures=["tiny_policy", "model_dir"], marks=["slow"], module="test_model"),
             Item("o", module="test_model"), Item("m2", marks=["slow"], module="test_model"),
             Item("n1", marks=["slow"], module="test_free"), Item("n2", marks=["ray"], module="test_free")]
    conftest.pytest_collection_modifyitems(Config(True), items)
    assert [i.name for i in items] == ["n1", "n2", "m1", "m2", "o"]


def _under_xdist(request) -> str:
    import os

    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not run by an xdist worker (make test runs two)")
    return request.node.nodeid


@pytest.mark.timed  # a test of the lanes themselves: in one under xdist
def test_under_xdist_this_timed_test_is_scheduled_in_the_serial_lane(request):
    """xdist schedules `--dist loadgroup` by a suffix it adds to the node id from the
    xdist_group mark in its own collection hook: the mark must be there before that hook runs
    (conftest's is tryfirst), or the slow tests spread over both workers."""
    assert _under_xdist(request).endswith("@serial"), request.node.nodeid


@pytest.mark.ray  # starts nothing: it checks where the mark puts a test
def test_under_xdist_a_ray_test_is_scheduled_in_the_ray_lane(request):
    assert _under_xdist(request).endswith("@ray"), request.node.nodeid


def test_a_ray_session_started_outside_the_ray_lane_fails_the_test(pytester, monkeypatch):
    """The check behind the lanes (conftest's `_slow_mark_is_kept`), in a pytest of its own: a test
    in the serial lane that starts Ray fails and says to mark it `ray`; the same test marked `ray`
    passes. The start is counted as heavy.py counts `ray.init`, without starting Ray."""
    import os
    from pathlib import Path

    here = Path(__file__).parent
    pytester.makeconftest((here / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow\n    ray\n    timed\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here / "helpers"), str(here.parent)]))
    pytester.makepyfile(test_starts="""
        import heavy
        import pytest

        def start():
            heavy.STARTS[heavy.RAY_SESSION] += 1

        @pytest.mark.slow
        def test_in_the_serial_lane():
            start()

        @pytest.mark.ray
        def test_in_the_ray_lane():
            start()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)  # the check fails the serial one at teardown
    result.stdout.fnmatch_lines(["ERROR test_starts.py::test_in_the_serial_lane - Failed: started a Ray session*"])
    result.stdout.fnmatch_lines(["*started a Ray session outside make test's ray lane: mark it `ray`*"])
