"""Nothing an MCP server or the calculator does crashes or holds a rollout batch.

MCP: real hostile servers (tests/agent_rl/mcp_hostile_server.py) that list bad schemas, send
empty, non-text, 10 MB, invalid UTF-8 or non-JSON output, crash, hang, never answer, flood
stderr or answer with errors. Connecting gives tools or one of the module's errors in time; a
call gives a ToolResult within its timeout (+ slack) and the other calls of its batch succeed;
the process is gone after aclose(). Calculator: hostile and generated expressions give a string
or a ToolInputError, at once and in little memory.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.rollout import mcp_tools
from agent_rl.rollout.mcp_tools import McpCallError, McpConnectError, McpServer, McpTimeoutError, _content_text
from agent_rl.rollout.tools import ToolInputError, ToolResult, calculate, calculator_tool

pytestmark = pytest.mark.timed  # a call is bounded in seconds (tests/conftest.py)

HOSTILE = Path(__file__).with_name("mcp_hostile_server.py")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLACK_S = 3.0  # scheduling on 2 busy cores, process start/stop


def _hostile(mode: str, tmp_path: Path, connect_timeout_s: float = 10.0) -> tuple[McpServer, Path]:
    pid_file = tmp_path / f"{mode}.pid"
    return McpServer(command=[sys.executable, str(HOSTILE), mode], env={"MCP_TEST_PID_FILE": str(pid_file)},
                     name=mode, connect_timeout_s=connect_timeout_s), pid_file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _assert_gone(pid_file: Path) -> None:
    if not pid_file.exists():
        return  # it never started
    pid = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(pid):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the MCP server process {pid} outlived aclose()")


# ----------------------------------------------------------------------------- MCP: calls


@pytest.mark.timeout(60)
def test_a_batch_of_hostile_results_each_ends_as_a_tool_result_in_time(tmp_path):
    async def main():
        server, pid_file = _hostile("ok", tmp_path)
        by = {t.name: t for t in await server.tools(timeout_s=2.0)}
        kinds = ["echo", "empty", "image", "resource", "big", "non_json", "never", "stderr", "rpc_error",
                 "is_error", "echo"]
        t0 = time.monotonic()
        results = await asyncio.gather(*(by[k].invoke({"text": f"hi {i}"}) for i, k in enumerate(kinds)))
        assert time.monotonic() - t0 < 2.0 + SLACK_S
        got = dict(zip(kinds[:-1], results[:-1]))
        assert all(isinstance(r, ToolResult) for r in results)
        assert got["echo"] == ToolResult("hi 0") and results[-1] == ToolResult(f"hi {len(kinds) - 1}")
        assert got["empty"] == ToolResult("")
        assert got["image"] == ToolResult("[image]\n[resource file:///b.bin]")
        assert got["resource"] == ToolResult("resource text\n[resource link file:///c.txt]")
        # 10 MB of text: the relay keeps the head (an observation reads far less), marked as cut
        big = got["big"]
        assert big.ok and big.text.endswith("characters]") and "[cut at" in big.text
        assert len(big.text.encode()) < mcp_tools.MAX_LINE_BYTES
        assert got["non_json"] == ToolResult("after the noise")  # the noise line is skipped
        assert got["never"].error == "timeout" and not got["never"].ok
        assert got["stderr"] == ToolResult("stderr done")
        assert got["rpc_error"].error == "error" and not got["rpc_error"].ok
        assert got["is_error"] == ToolResult("the tool refused", ok=True, error="rejected")

        # the server exits mid-call: its pending calls fail at once, the next call restarts it
        pending = asyncio.create_task(by["never"].invoke({}))
        await asyncio.sleep(0.2)
        by["never"].timeout_s = by["crash"].timeout_s = 30
        t0 = time.monotonic()
        crashed = await by["crash"].invoke({})
        assert not crashed.ok and crashed.error == "error"
        assert (await asyncio.wait_for(pending, 10)).error == "error"
        assert time.monotonic() - t0 < SLACK_S
        first_pid = int(pid_file.read_text())
        assert await asyncio.wait_for(by["echo"].invoke({"text": "back"}), 20) == ToolResult("back")
        assert int(pid_file.read_text()) != first_pid
        await server.aclose()
        await _assert_gone(pid_file)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_invalid_utf8_on_stdout_does_not_wedge_the_connection(tmp_path):
    """Regression: one answer with bytes that are not UTF-8 stopped the SDK's stdout reader in
    its drain while the server lived on: that call and every later one timed out, for ever."""
    async def main():
        server, pid_file = _hostile("ok", tmp_path)
        by = {t.name: t for t in await server.tools(timeout_s=2.0)}
        bad = await by["bad_utf8"].invoke({})
        assert bad.ok and bad.text == "\ufffd\ufffd bad"
        t0 = time.monotonic()
        after = await asyncio.gather(*(by["echo"].invoke({"text": str(i)}) for i in range(4)))
        assert after == [ToolResult(str(i)) for i in range(4)]
        assert time.monotonic() - t0 < SLACK_S
        await server.aclose()
        await _assert_gone(pid_file)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_server_flooding_stderr_for_ever_still_answers_and_times_out_in_time(tmp_path):
    async def main():
        server, pid_file = _hostile("stderr-forever", tmp_path)
        by = {t.name: t for t in await server.tools(timeout_s=1.0)}
        t0 = time.monotonic()
        results = await asyncio.gather(by["never"].invoke({}), *(by["echo"].invoke({"text": str(i)}) for i in range(3)))
        assert time.monotonic() - t0 < 1.0 + SLACK_S
        assert results[0].error == "timeout" and results[1:] == [ToolResult(str(i)) for i in range(3)]
        t0 = time.monotonic()
        await server.aclose()
        assert time.monotonic() - t0 < 10
        await _assert_gone(pid_file)

    asyncio.run(main())


# ----------------------------------------------------------------------------- MCP: start and tools/list


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, expected", [
    ("exit", McpConnectError),
    ("hang-init", McpConnectError),
    ("hang-list", McpTimeoutError),
    ("nested-schema", McpTimeoutError),  # the SDK drops the line it cannot parse: no answer
    ("invalid-schema", McpCallError),
    ("huge-schema", McpCallError),  # 10 MB: over the relay's MAX_LINE_BYTES, answered as an error
    ("stderr-flood", None),
    ("stderr-line", None),
])
def test_start_and_tools_list_give_tools_or_a_documented_error_in_time(tmp_path, mode, expected):
    """Regression (invalid-schema): a tools/list answer that is not a valid MCP result escaped
    `tools()` as a raw pydantic ValidationError, not the McpCallError of a protocol error."""
    async def main():
        server, pid_file = _hostile(mode, tmp_path, connect_timeout_s=2.0)
        t0 = time.monotonic()
        try:
            tools = await server.tools(timeout_s=1.0)
        except (McpConnectError, McpCallError) as e:
            assert expected is not None and isinstance(e, expected), repr(e)
            assert mode in str(e) and len(str(e)) < 10_000
        else:
            assert expected is None
            assert [t.name for t in tools][:2] == ["echo", "empty"]
            assert await tools[0].invoke({"text": "ok"}) == ToolResult("ok")
        assert time.monotonic() - t0 < 2.0 + 1.0 + SLACK_S
        await server.aclose()
        await _assert_gone(pid_file)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_tool_name_listed_twice_is_refused_not_shadowed(tmp_path):
    """Regression: with include=["echo"], a server listing two tools named "echo" got the last
    one silently (the model's calls went to a tool it was not described)."""
    async def main():
        server, pid_file = _hostile("dupes", tmp_path)
        with pytest.raises(ValueError, match=r"dupes.*'echo'.*more than once"):
            await server.tools(include=["echo"], timeout_s=2.0)
        with pytest.raises(ValueError, match=r"'echo'"):
            await server.tools(timeout_s=2.0)
        # the others are fine, a tool named like the built-in search too (the manager refuses
        # it against its own search tool)
        empty, search = await server.tools(include=["empty", "search"], timeout_s=2.0)
        assert await empty.invoke({}) == ToolResult("") and search.name == "search"
        await server.aclose()
        await _assert_gone(pid_file)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_huge_stderr_line_is_cut_in_the_tail_and_in_the_error():
    """Regression: a child that wrote 20 MB to stderr with no newline, then exited, got a
    McpConnectError quoting all 20 MB (and the tap joined its buffer once per 64 KB read:
    quadratic time)."""
    async def main():
        cmd = [sys.executable, "-c", "import sys; sys.stderr.write('z' * 20_000_000); sys.stderr.flush(); "
                                     "sys.stderr.write('\\nthe last words\\n'); sys.exit(3)"]
        server = McpServer(command=cmd, name="loud", connect_timeout_s=20)
        t0 = time.monotonic()
        with pytest.raises(McpConnectError) as ei:
            await server.start()
        assert time.monotonic() - t0 < 10
        msg = str(ei.value)
        assert "loud" in msg and "the last words" in msg and "zzz" in msg
        assert len(msg) < 100_000
        await server.aclose()

    asyncio.run(main())


@FUZZ
@given(st.lists(st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=50)),
    st.builds(lambda d: {"type": "image", "data": d, "mimeType": "image/png"}, st.text("AB=", max_size=8)),
    st.builds(lambda d: {"type": "audio", "data": d, "mimeType": "audio/wav"}, st.text("AB=", max_size=8)),
    st.builds(lambda t: {"type": "resource", "resource": {"uri": "file:///x", "text": t}}, st.text(max_size=20)),
    st.just({"type": "resource", "resource": {"uri": "file:///y", "blob": "AAAA"}}),
    st.just({"type": "resource_link", "uri": "file:///z", "name": "z"}),
), max_size=6), st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)))
def test_content_text_reads_any_result(content, structured):
    from mcp.types import CallToolResult

    result = CallToolResult.model_validate({"content": content, "structuredContent": structured})
    text = _content_text(result)
    assert isinstance(text, str)
    if content:
        assert text.count("\n") >= len(content) - 1  # one part per item
        for item in content:
            if item["type"] == "text":
                assert item["text"] in text
    elif structured is not None:
        assert text.startswith("{")


# ----------------------------------------------------------------------------- calculator

HOSTILE_EXPRESSIONS = [
    "9**9**9", "10**10**10", "(1<<10**8)", "1e308*1e308", "-(1)**0.5", "(-1)**0.5", "(-8)**(1/3)",
    "(" * 100_000 + "1" + ")" * 100_000, "(" * 99 + "1" + ")" * 99, "-" * 199 + "1", "1" * 1_000_000,
    "1\x002", "\x00", "", " ", "x", "__import__('os')", "().__class__", "(1).real", "lambda: 1",
    "[i for i in range(10**9)]", "{1: 2}", "1 if 1 else 2", "round(1, 10**9)", "round(1e308, -400)",
    "round(2**4000, -1000)", "round(1e999)", "1/0", "1%0", "1//0", "0**-1", "1.0%0", "2**4096*2**4096",
    "floor(1e308)*floor(1e308)*floor(1e308)*floor(1e308)*floor(1e308)", "3**4096", "9**9**9**9",
    "2.0**(2**4000)", "(2**4000)/(1e-300)", "exp(1000)", "exp(exp(exp(10)))", "sqrt(-1)", "log(0)",
    "log(2**4000, 1)", "min()", "max(1)", "abs()", "sqrt(1, 2)", "1e999-1e999", "floor(1e999)",
    "min(*[1])", "max(x=1)", "1 < 2", "~1", "1 & 2", "True", "'a'*10**9", "b'a'", "1j**2", "...",
    "\ufeff1", "١+١", "0x" + "f" * 190, "1_0" * 60, "9" * 199, "1e" + "9" * 190, ".1" * 90,
]


@pytest.mark.parametrize("expression", HOSTILE_EXPRESSIONS, ids=lambda e: repr(e[:24]))
def test_calculate_gives_a_value_or_refuses_hostile_input_at_once(expression):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out = calculate(expression)
    except ToolInputError as e:
        out = None
        assert str(e)
    finally:
        elapsed, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 1.0 and peak < 8 * 2**20
    if out is not None:
        assert isinstance(out, str) and len(out) < 1300


def test_calculate_values():
    assert calculate("1e308*1e308") == "inf"
    assert calculate("-(1)**0.5") == "-1"
    assert calculate("round(1e308, -400)") == "0"
    assert calculate("(1969 - 1879) * 2") == "180"
    assert len(calculate("2**4095")) == 1233
    for refused in ("9**9**9", "round(1, 10**9)", "1/0", "1%0", "(-1)**0.5", "(" * 100_000 + "1" + ")" * 100_000):
        with pytest.raises(ToolInputError):
            calculate(refused)


ATOMS = st.one_of(st.integers(-10**6, 10**6).map(str), st.sampled_from(
    ["0", "1", "2", "9", "10", "0.5", "1e308", "1e-308", "1e999", "pi", "e", "2**4095", "x", "''", "None", "[]"]))
OPS = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "<<", "&", "<", ","])
FUNCS = st.sampled_from(["", "-", "sqrt", "log", "exp", "abs", "round", "min", "max", "floor", "ceil", "eval", "int"])


def _expr(children):
    return st.one_of(
        st.builds(lambda a, op, b: f"{a} {op} {b}", children, OPS, children),
        st.builds(lambda f, args: f"{f}({', '.join(args)})", FUNCS, st.lists(children, max_size=3)),
    )


EXPRESSIONS = st.recursive(ATOMS, _expr, max_leaves=12)


@FUZZ
@given(st.one_of(EXPRESSIONS, st.text(max_size=80)))
def test_calculate_never_raises_anything_else_nor_takes_long(expression):
    t0 = time.perf_counter()
    try:
        out = calculate(expression)
    except ToolInputError:
        out = None
    assert time.perf_counter() - t0 < 1.0
    assert out is None or (isinstance(out, str) and len(out) < 1300)


SMALL = st.recursive(st.integers(-99, 99).map(lambda i: f"({i})"),
                     lambda c: st.builds(lambda a, op, b: f"({a} {op} {b})", c, st.sampled_from("+-*"), c),
                     max_leaves=10)


@FUZZ
@given(SMALL)
def test_calculate_agrees_with_python_on_small_integer_arithmetic(expression):
    assert calculate(expression) == str(eval(expression))  # noqa: S307 - built from digits and + - * only


@pytest.mark.timeout(60)
def test_calculator_tool_always_answers_a_batch_in_time():
    async def main():
        tool = calculator_tool(timeout_s=2.0)
        calls = [{"expression": e} for e in HOSTILE_EXPRESSIONS] + [
            {"expression": "6*7"}, {}, {"expression": 42}, {"expression": None}, {"expr": "1"},
            {"expression": "1", "x": 2}, [], "1+1", None]
        t0 = time.monotonic()
        results = await asyncio.gather(*(tool.invoke(c) for c in calls))
        assert time.monotonic() - t0 < 2.0 + SLACK_S
        assert all(isinstance(r, ToolResult) and isinstance(r.text, str) and r.ok for r in results)
        assert results[len(HOSTILE_EXPRESSIONS)] == ToolResult("42")
        assert all(r.error in (None, "rejected") for r in results[:len(HOSTILE_EXPRESSIONS)])
        assert all(r.error == "bad_args" for r in results[len(HOSTILE_EXPRESSIONS) + 1:])
        assert tool.stats.errors == 0 and tool.stats.calls == len(calls)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_server_flooding_stderr_neither_holds_the_loop_nor_floods_our_stderr(tmp_path, capsys):
    """Regression: every line of a child writing stderr without pause went to our stderr (474,467
    lines of 10 KB in this test's 3 s; ~170 MB a second, held in memory by pytest's capture). Now
    at most STDERR_LINES_PER_S lines a second are forwarded, then a count of those held back.
    Guard: the event loop is never held for long by the tap (a wake-up reads 16 chunks at most)."""
    from agent_rl.rollout.mcp_tools import STDERR_LINE_BYTES, STDERR_LINES_PER_S

    async def main():
        server, pid_file = _hostile("stderr-forever", tmp_path)
        await server.tools(timeout_s=1.0)
        gaps, t = [], time.monotonic()
        while time.monotonic() - t < 2.5:  # ticks of 10 ms: how long the loop was held between them
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - t0)
        await server.aclose()
        await _assert_gone(pid_file)
        return max(gaps)

    held = asyncio.run(main())
    err = capsys.readouterr().err
    assert held < 0.5, f"the event loop was held {held:.2f} s at once"
    shown = [line for line in err.splitlines() if line.startswith("[mcp:stderr-forever] spam")]
    assert 0 < len(shown) <= 5 * STDERR_LINES_PER_S  # about 3 s of flood: 3 windows, and the start
    assert "more line(s) not shown" in err and len(err) < 5 * STDERR_LINES_PER_S * (STDERR_LINE_BYTES + 30) + 10_000
