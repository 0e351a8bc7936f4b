"""Issue 100: MCP answers bounded after decoding. Over streamable HTTP against a raw hostile
server (tests/agent_rl/mcp_hostile_server.py http): a gzip answer of a few KiB that inflates to
megabytes and hundreds of thousands of items, the same as a server-sent event; and the counter
and inflater under them, against hand-computed values."""

from __future__ import annotations

import asyncio
import gzip
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from agent_rl.rollout import mcp_tools
from agent_rl.rollout.mcp_tools import McpCallError, McpServer
from agent_rl.rollout.tools import ToolResult
from loop_stall import LoopStall

HOSTILE = Path(__file__).with_name("mcp_hostile_server.py")
TIMEOUT_S = 5.0
SLACK_S = 0.5  # asyncio.wait's own lateness on a busy 2-core host, well under what a stall would add


@pytest.fixture(scope="module")
def hostile_http():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HOSTILE), "http", str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"hostile HTTP server exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "hostile HTTP server did not listen within 30 s"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


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
