"""Issue 100: MCP answers bounded after decoding. Over streamable HTTP against a raw hostile
server (tests/agent_rl/mcp_hostile_server.py http): a gzip answer of a few KiB that inflates to
megabytes and hundreds of thousands of items, the same as a server-sent event; and the counter
and inflater under them, against hand-computed values."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import sys
import time
import zlib
from pathlib import Path

import pytest

from agent_rl.rollout import mcp_tools
from agent_rl.rollout.mcp_tools import McpCallError, McpServer
from agent_rl.rollout.tools import ToolResult
from listening import free_port, listening
from loop_stall import LoopStall

pytestmark = pytest.mark.timed  # its stalls and timeouts are measured (tests/conftest.py)

HOSTILE = Path(__file__).with_name("mcp_hostile_server.py")
TIMEOUT_S = 5.0
SLACK_S = 0.5  # asyncio.wait's own lateness on a busy 2-core host, well under what a stall would add


@pytest.fixture(scope="module")
def hostile_http():
    port = free_port()
    with listening([sys.executable, str(HOSTILE), "http", str(port)], port, "hostile HTTP server", 30):
        yield f"http://127.0.0.1:{port}/mcp"


async def _least_stall(tool, arguments: dict) -> tuple[BaseException | str, float, float]:
    """What the tool's call raised (or returned), its time and the loop's longest stall: the
    least of three tries (a busy host can hold any process for 0.1 s now and then). The call is
    `tool.fn`, bounded by the tool's timeout as `invoke` is, whose error names the cause."""
    for _ in range(3):
        async with LoopStall() as stall:
            t0 = time.perf_counter()
            try:
                outcome = await tool.fn(**arguments)
            except Exception as e:  # noqa: BLE001 - the outcome under test
                outcome = e
            took = time.perf_counter() - t0
        if stall.longest_s < 0.1:
            break
    return outcome, took, stall.longest_s


def _check_capped(url: str, name: str, why: str) -> None:
    async def main():
        async with McpServer(url=url, name="hostile") as server:
            by = {t.name: t for t in await server.tools(timeout_s=TIMEOUT_S)}
            outcome, took, stall = await _least_stall(by[name], {})
            print(f"{name}: {took:.3f} s, longest loop stall {stall:.3f} s: {str(outcome)[:200]}")
            assert stall < 0.1 and took < TIMEOUT_S + SLACK_S
            assert isinstance(outcome, McpCallError) and why in str(outcome), repr(outcome)[:300]
            assert await by["echo"].invoke({"text": "still here"}) == ToolResult("still here")

    asyncio.run(main())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, why", [
    ("zip_many", f"more than {mcp_tools.MAX_MESSAGE_VALUES} JSON values"),
    ("zip_big", f"more than {mcp_tools.MAX_LINE_BYTES} bytes"),
])
def test_a_gzip_answer_is_capped_after_decoding_within_its_timeout(hostile_http, name, why):
    """Case 1: the caps counted the bytes on the wire, so 300 000 items (9 MB) or 64 MiB of
    text sent as a few KiB of gzip passed them, and the SDK decoded and validated the whole
    answer on our loop, seconds past the call's timeout. Now an answer is counted as it is
    decoded, in pieces, and cut off at the first bound it crosses."""
    _check_capped(hostile_http, name, why)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["sse_many", "sse_zip_many"])
def test_an_event_stream_answer_is_bounded_in_items(hostile_http, name):
    """Case 2: a server-sent event was bounded in bytes only (max_sse_event_size): 150 000 items
    in 4 MB passed and held the loop while the SDK validated them. Now each event's JSON values
    are counted too, after decoding."""
    _check_capped(hostile_http, name, f"more than {mcp_tools.MAX_MESSAGE_VALUES} JSON values")


def _count(pieces: list[bytes], sse: bool = False) -> int:
    counter = mcp_tools._JsonValues(10**9, 10**9, sse=sse)
    for piece in pieces:
        counter.feed(piece)
    return counter.values


def _bytewise(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


def test_values_are_counted_outside_strings_whatever_the_pieces():
    # ":" after "a", "[", "," twice, "," after "]", ":" after the key with \", ":" after "c": 7
    body = b'{"a": [1, 2, "x,y:[\\"]"], "b\\"": {"c": 3}}'
    assert _count([body]) == 7
    assert _count(_bytewise(body)) == 7  # a string, or an escape, split between pieces
    assert _count([b'{"text": "' + b"," * 100_000 + b'"}']) == 1  # commas in a text are one value
    # a raw line end closes a string (no JSON string holds one): what follows is counted
    assert _count([b'"open\n[1,2]']) == 2


def test_each_event_is_counted_on_its_own():
    # per event: "event:" and "data:" count one each, then the data's own ":", "[", ","
    stream = b'event: message\r\ndata: {"a": [1,2]}\r\n\r\nevent: message\ndata: [1]'
    assert _count([stream], sse=True) == 3  # the first event (5) is over at its blank line
    assert _count(_bytewise(stream), sse=True) == 3  # "\r\n" split between pieces is one line end
    assert _count([stream]) == 8  # one JSON body: no events (5 + "event:", "data:", "[")


def test_a_message_over_its_bounds_raises():
    counter = mcp_tools._JsonValues(max_values=3, max_bytes=100)
    counter.feed(b"[1,2,3]")  # "[", ",", ",": 3, the bound itself
    with pytest.raises(ValueError, match="more than 3 JSON values"):
        counter.feed(b"[")
    with pytest.raises(ValueError, match="more than 100 bytes"):
        mcp_tools._JsonValues(max_values=10, max_bytes=100).feed(b'"' + b"z" * 100 + b'"')


def test_the_inflater_decodes_in_bounded_pieces():
    text = b"x" * 1_000_000
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for coding, encoded in [("gzip", gzip.compress(text)), ("deflate", zlib.compress(text)),
                            ("deflate", raw_deflate.compress(text) + raw_deflate.flush()), ("identity", text)]:
        pieces = list(mcp_tools._Inflater(coding).pieces(encoded))
        assert b"".join(pieces) == text, coding
        assert max(map(len, pieces)) <= mcp_tools.HTTP_PIECE_BYTES, coding
    with pytest.raises(ValueError, match="'br'"):
        mcp_tools._Inflater("br")
    with pytest.raises(ValueError, match="gzip encoding is broken"):
        list(mcp_tools._Inflater("gzip").pieces(b"not gzip at all"))


def _vm_hwm_mib(pid: int) -> float:
    """The peak resident memory of process `pid` (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from Linux /proc")
def test_the_stdio_relay_bounds_a_line_before_it_holds_it(tmp_path):
    """Case 3: the relay read each line whole, so a server writing 96 MiB with no newline grew
    it by the line, then again to parse it. Now it holds HELD_LINES * MAX_LINE_BYTES (16 MiB) of
    a line at most, reads the rest in pieces and drops it; the head's id gets an error answer."""
    pid_file = tmp_path / "pid"
    held = 4 * mcp_tools.MAX_LINE_BYTES  # mcp_relay.HELD_LINES of them

    async def main():
        async with McpServer(command=[sys.executable, str(HOSTILE), "ok"], env={"MCP_TEST_PID_FILE": str(pid_file)},
                             name="long") as server:
            long_line, echo = await server.tools(include=["long_line", "echo"], timeout_s=20)
            try:
                outcome = await long_line.fn()
            except McpCallError as e:
                outcome = e
            peak = _vm_hwm_mib(_parent(int(pid_file.read_text())))
            print(f"relay peak memory {peak:.0f} MiB; {str(outcome)[:200]}")
            # the line held (16 MiB), once more while readline builds it, and the interpreter
            # (~10 MiB); the old relay held the 96 MiB line as bytes, text and a parsed str
            assert peak < 2 * held / 2**20 + 30
            assert isinstance(outcome, McpCallError) and f"a line of more than {held} bytes" in str(outcome)
            assert await echo.invoke({"text": "still here"}) == ToolResult("still here")

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_a_flood_of_notifications_neither_takes_our_core_nor_delays_calls():
    """Case 4: each notification a server sent was parsed and validated by the SDK on our event
    loop, though the client reads none: a server writing them without pause kept the loop busy
    and calls waited behind them. Now the relay drops them (counted: dropped_notifications)."""
    async def main():
        async with McpServer(command=[sys.executable, str(HOSTILE), "notify-forever"], name="chatty") as server:
            (echo,) = await server.tools(include=["echo"], timeout_s=10)
            await asyncio.sleep(1.0)  # the flood is on
            cpu0, t0 = time.process_time(), time.perf_counter()
            async with LoopStall() as stall:
                for i in range(20):
                    assert await echo.invoke({"text": str(i)}) == ToolResult(str(i))
                await asyncio.sleep(1.0)
            cpu, took = time.process_time() - cpu0, time.perf_counter() - t0
            print(f"20 calls and 1 s under the flood: {took:.2f} s, our CPU {cpu:.2f} s, "
                  f"longest stall {stall.longest_s:.3f} s, dropped {getattr(server, 'dropped_notifications', None)}")
            # our process: the calls and the loop's idle ticks, a small part of a core (the
            # relay and the server are processes of their own); the old client spent all of it
            assert cpu < 0.5 * took and took < 1.0 + 20 * 0.1
            assert server.dropped_notifications > 1000  # the relay reports once a second

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_dropped_notifications_reach_the_rollout_metrics(tok):
    """Case 4's count in metrics: `mcp/<server>/dropped_notifications`, per step, counted since
    the step before (the relay reports once a second, also between steps)."""
    from rollout_fakes import FakeRetriever, Q, ScriptedEngine, make_cfg

    from agent_rl.rollout.manager import RolloutManager

    cfg = make_cfg(max_turns=1, protocol="hermes", chat_template=True)
    ToolConfig = type(cfg.actor_rollout_ref.rollout.tools[0])
    cfg.actor_rollout_ref.rollout.tools = [ToolConfig(
        name="chatty", mcp_command=[sys.executable, str(HOSTILE), "notify-forever"], include=["echo"], timeout_s=10)]
    mgr = RolloutManager(ScriptedEngine(tok, ["<answer> x </answer>"] * 2), FakeRetriever(), cfg, tokenizer=tok)

    async def go():
        try:
            _, first = await mgr.rollout([Q("where?")], n=1)
            await asyncio.sleep(2.5)  # two reports of the relay between the steps
            _, second = await mgr.rollout([Q("where?")], n=1)
            return first, second, mgr._mcp_servers[0].dropped_notifications
        finally:
            await mgr.aclose()

    first, second, total = asyncio.run(go())
    assert second["mcp/chatty/dropped_notifications"] > 1000
    assert first["mcp/chatty/dropped_notifications"] + second["mcp/chatty/dropped_notifications"] == total


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the relay adopts orphans with Linux's prctl")
def test_a_helper_that_leaves_the_process_group_does_not_outlive_shutdown(tmp_path):
    """Case 5: the SDK's shutdown signals the server's process group only, so a helper that
    called setsid, ignores SIGTERM and holds the server's stdout lived on after aclose(). Now the
    relay is the subreaper of everything the server starts and kills what is left as it ends."""
    pid_file = tmp_path / "helper"

    async def main():
        server = McpServer(command=[sys.executable, str(HOSTILE), "helper"],
                           env={"MCP_TEST_HELPER_PID_FILE": str(pid_file)}, name="helper")
        (echo,) = await server.tools(include=["echo"], timeout_s=10)
        assert await echo.invoke({"text": "hi"}) == ToolResult("hi")
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text():
                break
            await asyncio.sleep(0.05)
        helper = int(pid_file.read_text())
        assert _alive(helper) and os.getsid(helper) != os.getsid(0)
        t0 = time.monotonic()
        await server.aclose()
        print(f"aclose: {time.monotonic() - t0:.2f} s")
        for _ in range(50):  # the relay's SIGKILL lands at once; a busy host may take a moment
            if not _alive(helper):
                break
            await asyncio.sleep(0.1)
        alive = _alive(helper)
        if alive:
            os.kill(helper, signal.SIGKILL)
        assert not alive, "the helper outlived the tool's shutdown"

    asyncio.run(main())
