"""Tools served by an MCP server (the official `mcp` SDK, 2.x), as `agent_rl.rollout.tools.Tool`s.

    async with McpServer(command=["python", "my_server.py"], name="kb") as server:
        tools = await server.tools(include=["lookup"], timeout_s=30)
        result = await tools[0].invoke({"query": "..."})

`McpServer` is one connection: stdio (the client starts `command` as a child process and talks
over its stdin/stdout) or streamable HTTP (`url`, e.g. "http://127.0.0.1:8000/mcp"). The SDK's
context managers hold anyio cancel scopes that must be entered and left by one task, so one
background asyncio task made by `start()` owns the connection for its whole life; tool calls
from any number of tasks of the same loop share its session, and `start()` and `aclose()` may
be awaited from different tasks.

A listed tool enters every prompt (its name, description and inputSchema), so what a server
lists is made safe first: a name must follow MCP's rule (SEP-986: 1-128 of A-Z a-z 0-9 _ - .),
else `tools()` refuses it; in the description and every string of the schema `<` and `>` are
written `&lt;`/`&gt;` (no protocol tag or special token of any tokenizer survives: they are all
written with `<`, see `protocol.special_texts`), each string cut to MAX_DESCRIPTION_CHARS and
a schema of more than MAX_SCHEMA_CHARS refused: a description holding
`</tool_call><|im_start|>system ...` forged a system turn (issue 83).

What a call can give (see `tools.Tool.invoke`):
- the text items of the result joined with "\\n" (other items as "[image]", "[audio]", ...);
- a result with isError=True, or a JSON-RPC "invalid params" error: `ToolInputError` with the
  server's text (the policy's mistake, shown to it);
- a dead connection (the server crashed or went away), a protocol error: `McpCallError`, an
  ordinary tool error. Calls pending when the connection dies fail at once, never hang (they
  may have run: they are not repeated); the next call starts the server again (stdio: a new
  process) and goes on. A restart that fails is tried again only after RECONNECT_BACKOFF_S,
  calls meanwhile fail at once; `aclose()` ends it for good (until `start()`);
- no answer in time: every request has a limit (`initialize`: connect_timeout_s; `tools/list`
  and `tools/call`: the tools' timeout_s), `McpTimeoutError`, a TimeoutError, so `Tool.invoke`
  counts it as a timeout.

A stdio child gets the SDK's small default environment (HOME, LOGNAME, PATH, SHELL, TERM, USER)
plus `env`, not the parent's whole environment; its stdout is read as UTF-8 with bad bytes
replaced by U+FFFD; its stderr is forwarded to ours, prefixed with "[mcp:<name>]" (a line longer
than STDERR_LINE_BYTES in pieces; STDERR_LINES_PER_S at most, then a count of the lines held
back), and its last lines are quoted when the connection fails.

Every answer is bounded in items, not only read: the SDK parses and validates each message on
our event loop, and a tools/call answer of 150 000 text items held it 2.2 s (issue 83). So a
stdio child's stdout passes through a relay process (`RELAY`, mcp_relay.py; the SDK's process handling
untouched: the child is the relay's, in its process group) that parses each message first,
where its cost stalls nothing: a call's answer keeps its first MAX_CONTENT_ITEMS content items
(then a text item counting the rest), a message of more than MAX_MESSAGE_VALUES JSON values
(a tool list: MAX_LIST_VALUES) becomes an error answer to its request, a call's answer over
MAX_LINE_BYTES keeps the head of each text item (a 10 MB line cost the SDK over 1 s on our loop)
and any other message over it is an error answer (dropped if its id is not at either end), a
line is held to 4 x MAX_LINE_BYTES (the rest read in pieces and dropped), a line that is not JSON is
dropped (as the SDK would), and so is a notification (the client reads none; counted:
`dropped_notifications`). The streamable HTTP transport has no relay:
there every answer is decoded by us (`_Inflater`: none, gzip or deflate, HTTP_PIECE_BYTES at a
time, the loop free in between; a few KiB of gzip inflated to megabytes past caps that counted the
wire, issue 100) and counted as it is decoded (`_JsonValues`: JSON values outside strings, per
message); a JSON body of more than MAX_LINE_BYTES, or a message of more than MAX_MESSAGE_VALUES
values (a tools/list or initialize answer: MAX_LIST_VALUES), is cut off where it crosses the bound
and becomes an error answer to its request (`_bounded_http`), as is a server-sent event of more
than MAX_LINE_BYTES (the SDK's `max_sse_event_size`, counted after decoding). HTTP answers are
bounded, not cut to their head as stdio's are.

`mcp` is imported inside the methods, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import re
import shlex
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from agent_rl.rollout.tools import Tool, ToolInputError, left_behind

STOP_GRACE_S = 10.0  # aclose(): time for a clean shutdown (stdio: stdin closed, child reaped) before cancelling
RECONNECT_BACKOFF_S = 5.0  # after a failed restart, calls fail at once for this long (a crash loop costs one try)
STDERR_TAIL_LINES = 20
STDERR_LINE_BYTES = 2000  # a longer stderr line goes out in pieces: a child may write megabytes without a newline
STDERR_LINES_PER_S = 100  # forwarded to our stderr at most; the rest counted (the tail keeps the last ones)
STDERR_READS = 16  # pipe reads of 64 KiB per wake-up: a child writing without pause cannot hold the loop
MAX_TOOL_PAGES = 100
DROPPED_PREFIX = b"[relay] dropped "  # the relay's count of notifications it dropped (mcp_relay.DROPPED)
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""MCP's rule for tool names (SEP-986), https://modelcontextprotocol.io/specification/2025-11-25/server/tools#tool-names"""
MAX_DESCRIPTION_CHARS = 1000  # a listed tool's description, and each string of its schema, cut to this
MAX_SCHEMA_CHARS = 20_000  # a listed tool's inputSchema as JSON, once its strings are cut; more is refused
MAX_SCHEMA_DEPTH = 32
MAX_CONTENT_ITEMS = 100  # content items of a call's answer that reach the SDK; the rest are counted
MAX_MESSAGE_VALUES = 5_000  # JSON values of a message the SDK validates on our loop (~10 us each)
MAX_LIST_VALUES = 100_000  # ... of a tools/list answer, read once before any rollout
MAX_LINE_BYTES = 4 << 20  # a message the SDK would buffer and copy on our loop (10 MB: over 1 s)
HTTP_PIECE_BYTES = 16 << 10  # an HTTP answer is inflated and counted this much at a time, the loop free in between
ACCEPT_ENCODING = "gzip, deflate"  # what an HTTP answer may be encoded in (decoded by `_Inflater`, in bounded steps)
_OUTSIDE = re.compile(rb'["\r\n]')  # where a JSON string or a line ends, outside a string
_IN_STRING = re.compile(rb'[^"\\\r\n]*(?:\\[^\r\n][^"\\\r\n]*)*')  # a JSON string's rest, escapes included

RELAY = Path(__file__).with_name("mcp_relay.py")
"""The relay between a stdio child's stdout and the SDK (see the module docstring and its own),
run as `python -I -S RELAY MAX_ITEMS MAX_VALUES MAX_LIST_VALUES MAX_BYTES -- command...`."""


class McpConnectError(ConnectionError):
    """The MCP server could not be started, reached or initialized."""


class McpCallError(RuntimeError):
    """A tool call failed on the MCP side: lost connection, server crash, protocol error."""


class McpTimeoutError(McpCallError, TimeoutError):
    """The server did not answer a request within its limit (a TimeoutError: a tool timeout)."""


class _StderrTap:
    """A pipe for a stdio child's stderr: lines forwarded to our stderr (STDERR_LINES_PER_S at
    most, then a count of those not shown), the last ones kept."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._buf = b""
        self.dropped_notifications = 0  # as the relay reports them
        self._second, self._shown, self._hidden = time.monotonic(), 0, 0
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._loop = asyncio.get_running_loop()
        try:
            self._loop.add_reader(self.read_fd, self._drain)
        except NotImplementedError:  # a Proactor loop (Windows)
            os.close(self.read_fd)
            os.close(self.write_fd)
            raise

    def close_write_end(self) -> None:
        """Our copy of the write end; closed once the child has it, so its exit reads as EOF."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self, reads: int = STDERR_READS) -> None:
        """Read what the pipe holds, `reads` chunks at most (the loop calls again while more is there)."""
        for _ in range(reads):
            if self.read_fd < 0:
                return
            try:
                data = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._emit(self._buf, final=True)
                self._buf = b""
                self._loop.remove_reader(self.read_fd)
                return
            self._emit(data)

    def _emit(self, data: bytes, final: bool = False) -> None:
        *lines, self._buf = (self._buf + data).split(b"\n")
        if final or len(self._buf) >= STDERR_LINE_BYTES:  # held no longer: the buffer stays small
            lines.append(self._buf)
            self._buf = b""
        for raw in lines:
            if raw.startswith(DROPPED_PREFIX) and raw[len(DROPPED_PREFIX):].split(b" ")[0].isdigit():
                self.dropped_notifications += int(raw[len(DROPPED_PREFIX):].split(b" ")[0])
                continue  # counted in metrics (`McpServer.dropped_notifications`), not shown
            for start in range(0, len(raw), STDERR_LINE_BYTES):
                line = raw[start:start + STDERR_LINE_BYTES].decode("utf-8", "replace").rstrip()
                if line:
                    self.tail.append(line)
                    self._forward(line)

    def _forward(self, line: str | None) -> None:
        """`line` to our stderr within STDERR_LINES_PER_S; None: only the count of lines held back."""
        now = time.monotonic()
        if line is None or now - self._second >= 1.0:
            if self._hidden:
                self._write(f"... {self._hidden} more line(s) not shown (over {STDERR_LINES_PER_S} a second)")
            self._second, self._shown, self._hidden = now, 0, 0
        if line is None:
            return
        if self._shown < STDERR_LINES_PER_S:
            self._shown += 1
            self._write(line)
        else:
            self._hidden += 1

    def _write(self, text: str) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"[mcp:{self.label}] {text}\n")

    def text(self) -> str:
        self._drain(reads=1024)  # whatever the child wrote before it died is in the pipe by now (64 MiB at most)
        return "\n".join(self.tail)

    def close(self) -> None:
        self.close_write_end()
        if self.read_fd >= 0:
            self._drain(reads=1024)
            self._forward(None)  # the count of lines held back since the last one shown
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.read_fd)
            os.close(self.read_fd)
            self.read_fd = -1


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = [e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)] or [exc]
    parts = []
    for e in leaves[:3]:
        text = str(e).strip()
        parts.append(f"{type(e).__name__}: {text}" if text else type(e).__name__)
    return "; ".join(parts)


def _shown(text: str) -> str:
    """A server's text as it may enter a prompt: valid UTF-8 (a lone surrogate becomes "?"), `<`
    and `>` written `&lt;`/`&gt;`, at most MAX_DESCRIPTION_CHARS characters."""
    text = text[:MAX_DESCRIPTION_CHARS]
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("<", "&lt;").replace(">", "&gt;")[:MAX_DESCRIPTION_CHARS]


def _shown_schema(value: Any, depth: int = 0) -> Any:
    """`value` (a JSON schema) with every string, keys included, `_shown`."""
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"nested more than {MAX_SCHEMA_DEPTH} deep")
    if isinstance(value, str):
        return _shown(value)
    if isinstance(value, dict):
        return {_shown(str(k)): _shown_schema(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown_schema(v, depth + 1) for v in value]
    return value


def _content_text(result: Any) -> str:
    """The text the model reads from a CallToolResult."""
    parts: list[str] = []
    for item in result.content or []:
        kind = getattr(item, "type", None)
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource":  # an embedded resource: its text if it has one
            res = item.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {getattr(item, 'uri', '')}]")
        else:
            parts.append(f"[{kind or type(item).__name__}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class _JsonValues:
    """Counts the JSON values of each message of an HTTP answer as its decoded bytes arrive, as
    the relay counts them (a value is the first, or follows "[", "," or ":"), but not inside
    strings: a text full of commas is one value. `sse`: the answer is server-sent events, each a
    message of its own (the count starts again after a blank line); else one JSON body, whose
    bytes are counted too. Raises ValueError once a message passes `max_values` (or the body
    `max_bytes`). The scan runs in C (re, bytes.count) with one Python step per string or line
    end, so a piece of HTTP_PIECE_BYTES costs milliseconds whatever it holds."""

    def __init__(self, max_values: int, max_bytes: int, sse: bool = False) -> None:
        self.max_values, self.max_bytes, self.sse = max_values, max_bytes, sse
        self.values = self.size = 0
        self._in_string = self._escape = self._cr = False
        self._line_empty = True

    def feed(self, data: bytes) -> None:
        pos, end = 0, len(data)
        if self._cr and data[:1] == b"\n":  # "\r\n" split between two pieces: one line end
            pos = 1
        self._cr = False
        if not self.sse:
            self.size += end
        self._check()
        while pos < end:
            if self._in_string:
                pos = self._string_end(data, pos)
                continue
            found = _OUTSIDE.search(data, pos)
            stop = end if found is None else found.start()
            if stop > pos:
                segment = data[pos:stop]
                self.values += segment.count(b",") + segment.count(b":") + segment.count(b"[")
                self._line_empty = False
                self._check()
            if found is None:
                return
            if data[stop] == 0x22:  # '"'
                self._in_string, self._line_empty = True, False
            else:
                if self.sse and self._line_empty:  # a blank line: the event is over
                    self.values = 0
                self._line_empty = True
                if data[stop:stop + 2] == b"\r\n":
                    stop += 1
                elif data[stop] == 0x0D and stop == end - 1:
                    self._cr = True
            pos = stop + 1

    def _string_end(self, data: bytes, pos: int) -> int:
        """Where the scan goes on inside a string begun before `pos`."""
        if self._escape:  # a backslash ended the last piece: this byte is the one it escapes
            self._escape = False
            if data[pos] not in (0x0A, 0x0D):
                return pos + 1
        stop = _IN_STRING.match(data, pos).end()
        if stop == len(data):
            return stop
        if data[stop] == 0x22:  # the closing quote
            self._in_string = False
            return stop + 1
        if data[stop] == 0x5C:  # a backslash, the piece's last byte
            self._escape = True
            return stop + 1
        self._in_string = False  # a raw line end: no JSON string holds one
        return stop

    def _check(self) -> None:
        if self.size > self.max_bytes:
            raise ValueError(f"an answer of more than {self.max_bytes} bytes: not read further")
        if self.values > self.max_values:
            raise ValueError(f"an answer of more than {self.max_values} JSON values: not read further")


class _Inflater:
    """An HTTP answer's body decoded from its Content-Encoding (none, gzip or deflate) in pieces
    of HTTP_PIECE_BYTES at most: a few KiB of gzip can inflate to megabytes, which httpx would
    decode at once and our caps would never have counted (issue 100)."""

    def __init__(self, content_encoding: str) -> None:
        codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip().lower() not in ("", "identity")]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise ValueError(f"an answer in Content-Encoding {content_encoding!r}; the client reads {ACCEPT_ENCODING}")
        self.coding = codings[0] if codings else None
        # gzip: its header; deflate: zlib's header (wbits | 32 takes either), else raw (some servers)
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 32) if self.coding else None
        self._started = False

    def pieces(self, data: bytes):
        """The decoded bytes of `data`, the next part of the body, piece by piece."""
        if self._zlib is None:
            for start in range(0, len(data), HTTP_PIECE_BYTES):
                yield data[start:start + HTTP_PIECE_BYTES]
            return
        while data and not self._zlib.eof:
            try:
                out = self._zlib.decompress(data, HTTP_PIECE_BYTES)
            except zlib.error as e:
                if self._started or self.coding != "deflate":
                    raise ValueError(f"an answer whose {self.coding} encoding is broken: {e}") from None
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate
                continue
            self._started = True
            data = self._zlib.unconsumed_tail
            if out:
                yield out
            if not data and len(out) == HTTP_PIECE_BYTES:  # output may be waiting in zlib
                data = b""
                while len(out) == HTTP_PIECE_BYTES and not self._zlib.eof:
                    out = self._zlib.decompress(b"", HTTP_PIECE_BYTES)
                    if out:
                        yield out


@functools.cache
def _bounded_http() -> type:
    """The HTTP transport class that bounds every answer after decoding, made on first use (httpx2
    comes with the SDK: not imported with this module)."""
    import httpx2

    class BoundedBody(httpx2.AsyncByteStream):
        """A response body decoded by `_Inflater`, its messages counted by `_JsonValues`, the
        event loop given a turn between pieces; over a bound it raises httpx2.StreamError (an
        event stream: httpx2.SSEError), which the SDK answers to the request as an error."""

        def __init__(self, inner, encoding: str, counter: _JsonValues) -> None:
            self.inner, self.encoding, self.counter = inner, encoding, counter

        async def __aiter__(self):
            error = httpx2.SSEError if self.counter.sse else httpx2.StreamError
            try:
                inflater = _Inflater(self.encoding)
                async for chunk in self.inner:
                    for piece in inflater.pieces(chunk):
                        self.counter.feed(piece)
                        yield piece
                        await asyncio.sleep(0)  # a chunk may inflate to megabytes: others run in between
            except ValueError as e:
                raise error(str(e)) from None

        async def aclose(self) -> None:
            await self.inner.aclose()

    class BoundedHttp(httpx2.AsyncBaseTransport):
        """An HTTP transport whose responses are `BoundedBody`s, with no Content-Encoding left
        for httpx to decode. A tools/list or initialize answer may hold `max_list_values`
        values, any other message `max_values`."""

        def __init__(self, inner, max_bytes: int, max_values: int, max_list_values: int) -> None:
            self.inner, self.max_bytes = inner, max_bytes
            self.max_values, self.max_list_values = max_values, max_list_values

        def _limit(self, request) -> int:
            try:
                method = json.loads(request.content).get("method")
            except Exception:  # noqa: BLE001 - a GET, a DELETE, a batch: not a listing
                method = None
            return self.max_list_values if method in ("tools/list", "initialize") else self.max_values

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            sse = response.headers.get("content-type", "").lower().startswith("text/event-stream")
            encoding = response.headers.pop("content-encoding", "")
            response.headers.pop("content-length", None)
            counter = _JsonValues(self._limit(request), self.max_bytes, sse=sse)
            response.stream = BoundedBody(response.stream, encoding, counter)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return BoundedHttp


class McpServer:
    """One MCP server connection: stdio (a command the client starts as a child process) or
    streamable HTTP (a URL)."""

    def __init__(self, *, command: list[str] | None = None, url: str | None = None,
                 env: dict[str, str] | None = None, name: str = "mcp", connect_timeout_s: float = 30.0) -> None:
        if (command is None) == (url is None):
            raise ValueError("McpServer needs exactly one of command= (stdio) or url= (streamable HTTP)")
        if command is not None and (isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)):
            raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
        if url is not None and env:
            raise ValueError("env= applies to a stdio server (command=) only")
        self.command = list(command) if command is not None else None
        self.url = url
        self.env = dict(env) if env else None
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self._task: asyncio.Task | None = None
        self._session: Any = None  # mcp.ClientSession while connected
        self._stop: asyncio.Event | None = None
        self._gone: asyncio.Future | None = None  # resolved (with the reason) when the connection ends
        self._scope: Any = None  # the anyio CancelScope around the connection
        self._lock: asyncio.Lock | None = None
        self._stderr: _StderrTap | None = None
        self._closed = True  # not started, or aclose()d: a call does not reconnect
        self._retry_at = 0.0  # loop time before which a failed restart is not tried again
        self._restart_error = ""
        self._restarting: asyncio.Task | None = None
        self._dropped = 0  # notifications the relays of past connections dropped

    @property
    def dropped_notifications(self) -> int:
        """Notifications from the server dropped unread (stdio: by the relay; the client uses
        none, and a flood of them cost the event loop for each), since this object was made."""
        return self._dropped + (self._stderr.dropped_notifications if self._stderr is not None else 0)

    # ------------------------------------------------------------------ description
    @property
    def target(self) -> str:
        return f"command: {shlex.join(self.command)}" if self.command is not None else f"url: {self.url}"

    def __repr__(self) -> str:
        return f"McpServer({self.name!r}, {self.target}, connected={self.connected})"

    @property
    def connected(self) -> bool:
        return self._session is not None and self._gone is not None and not self._gone.done()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Connect and initialize (a no-op when connected; reconnects after a lost connection).
        Raises McpConnectError naming the command/url and why, at the latest after
        connect_timeout_s."""
        async with self._locked():
            self._closed = False
            self._retry_at = 0.0
            if not self.connected:
                await self._connect()

    def _locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _connect(self) -> None:
        """`start()`'s work, under the lock."""
        await self._shutdown()  # the remains of a lost connection
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        self._stop = asyncio.Event()
        self._gone = loop.create_future()
        self._task = loop.create_task(self._hold(ready, self._stop, self._gone), name=f"mcp:{self.name}")
        try:
            done, _ = await asyncio.wait({ready}, timeout=self.connect_timeout_s)
        except BaseException:  # start() itself cancelled: leave nothing behind
            await self._shutdown(grace_s=0.0)
            if ready.done():
                ready.exception()  # retrieved: no "never retrieved" warning
            raise
        if not done:
            tail = self._stderr_text()
            await self._shutdown(grace_s=0.0)
            if ready.done():
                ready.exception()
            raise McpConnectError(
                f"MCP server {self.name!r} ({self.target}) did not connect within "
                f"{self.connect_timeout_s:g} s" + (f"; its stderr:\n{tail}" if tail else ""))
        if ready.exception() is not None:
            await self._shutdown(grace_s=0.0)
            raise ready.exception()

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event, gone: asyncio.Future) -> None:
        """The background task: open the transport and session, initialize, then hold them
        until `stop` (or a lost connection); every SDK context is entered and left here."""
        reason = "closed"
        try:
            import anyio
            import mcp

            with anyio.CancelScope() as scope:
                self._scope = scope
                async with contextlib.AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._transport())
                    session = await stack.enter_async_context(mcp.ClientSession(
                        read, write, client_info=mcp.types.Implementation(name="agent_rl", version="1")))
                    await session.initialize()
                    self._session = session
                    ready.set_result(None)
                    await stop.wait()
            if not ready.done():
                reason = "cancelled while connecting"
        except Exception as e:  # noqa: BLE001 - reported through `ready` / `gone`
            reason = _describe(e)
            if not ready.done() and "Connection closed" in reason:
                reason = f"the server closed the connection before initializing ({reason}; did it exit?)"
        finally:
            self._session = None
            self._scope = None
            if not ready.done():
                tail = self._stderr_text()
                ready.set_exception(McpConnectError(
                    f"cannot connect to MCP server {self.name!r} ({self.target}): {reason}"
                    + (f"; its stderr:\n{tail}" if tail else "")))
            if not gone.done():
                gone.set_result(reason)
            if self._stderr is not None:
                self._stderr.close()
                self._dropped += self._stderr.dropped_notifications
                self._stderr = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager:
        return self._stdio_transport() if self.url is None else self._http_transport()

    @contextlib.asynccontextmanager
    async def _http_transport(self):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        # the SDK's own client settings (create_mcp_http_client: 30 s, a 300 s read for long
        # streams), its transport wrapped so that no JSON answer outgrows what stdio's relay admits
        transport = _bounded_http()(httpx2.AsyncHTTPTransport(), MAX_LINE_BYTES, MAX_MESSAGE_VALUES, MAX_LIST_VALUES)
        client = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0), transport=transport,
                                    headers={"Accept-Encoding": ACCEPT_ENCODING})
        async with client, streamable_http_client(self.url, http_client=client,
                                                  max_sse_event_size=MAX_LINE_BYTES) as streams:
            yield streams

    @contextlib.asynccontextmanager
    async def _stdio_transport(self):
        from mcp import StdioServerParameters, stdio_client

        # "replace": with the SDK's "strict", one bad byte on stdout stops its reader while the
        # server lives on, and every later call times out (tests/agent_rl/test_mcp_calculator_fuzz.py)
        limits = (MAX_CONTENT_ITEMS, MAX_MESSAGE_VALUES, MAX_LIST_VALUES, MAX_LINE_BYTES)
        relay = ["-I", "-S", str(RELAY), *map(str, limits), "--"]
        params = StdioServerParameters(command=sys.executable, args=[*relay, *self.command], env=self.env,
                                       encoding_error_handler="replace")
        try:
            self._stderr = _StderrTap(self.name)
            errlog: Any = self._stderr.write_fd
        except NotImplementedError:  # no add_reader (Windows Proactor loop): plain inherited stderr
            self._stderr = None
            errlog = sys.stderr
        try:
            async with stdio_client(params, errlog=errlog) as streams:
                if self._stderr is not None:
                    self._stderr.close_write_end()
                yield streams
        finally:
            if self._stderr is not None:
                self._stderr.close_write_end()

    def _stderr_text(self) -> str:
        return self._stderr.text() if self._stderr is not None else ""

    async def _shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the background task: a clean exit first (stdio: close stdin, reap the child;
        HTTP: end the session), cancelled after `grace_s`."""
        task = self._task
        if task is None:
            return
        if self._stop is not None:
            self._stop.set()
        if not task.done():
            if grace_s > 0:
                await asyncio.wait({task}, timeout=grace_s)
            if not task.done():
                if self._scope is not None:
                    self._scope.cancel()
                else:
                    task.cancel()
                await asyncio.wait({task})
        with contextlib.suppress(BaseException):
            task.result()
        self._task = None

    async def aclose(self) -> None:
        """Close the connection (a stdio child is terminated); idempotent. Later calls fail
        at once (no reconnection) until `start()`."""
        async with self._locked():
            self._closed = True
            await self._shutdown()

    def _session_closed(self) -> bool:
        """The session's connection ended while no call was pending (e.g. the stdio child
        exited between calls): the SDK's dispatcher says so (a private flag, read defensively)."""
        return bool(getattr(getattr(self._session, "_dispatcher", None), "_closed", False))

    async def _reconnect(self) -> None:
        """Before a request: a connection that died is made again (stdio: the server process is
        started anew), never sooner than RECONNECT_BACKOFF_S after a failed restart. Callers
        share one restart, run as its own task: a call cancelled by its tool timeout does not
        cancel it (bounded by connect_timeout_s), or a timeout shorter than the server's start
        would restart it on every call and never connect."""
        if self.connected and not self._session_closed():
            return
        if self._restarting is None or self._restarting.done():
            self._restarting = asyncio.get_running_loop().create_task(self._restart(), name=f"mcp-restart:{self.name}")
            self._restarting.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        await asyncio.shield(self._restarting)

    async def _restart(self) -> None:
        async with self._locked():
            if self._closed:
                raise McpCallError(f"MCP server {self.name!r} is not connected (closed or not started)")
            if self.connected and self._session_closed():
                self._lost(self._gone, "connection closed")
            if self.connected:
                return
            loop = asyncio.get_running_loop()
            if loop.time() < self._retry_at:
                raise McpCallError(f"MCP server {self.name!r} is down; restarting it failed: {self._restart_error}")
            try:
                await self._connect()
            except McpConnectError as e:
                self._retry_at, self._restart_error = loop.time() + RECONNECT_BACKOFF_S, str(e)
                raise McpCallError(f"MCP server {self.name!r} is down; restarting it failed: {e}") from None

    async def __aenter__(self) -> "McpServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ tools
    async def tools(self, include: list[str] | None = None, timeout_s: float = 120.0,
                    max_concurrency: int = 64) -> list[Tool]:
        """The server's tools as `Tool`s (name, description, inputSchema as parameters), in the
        server's order, or in `include`'s order for only those names (an unknown name in
        include raises ValueError listing the server's tools; so does a chosen name the server
        lists twice, as a call could not tell them apart). Starts the connection if needed.
        `timeout_s` limits each tools/list request and each later call of the tools."""
        if not self.connected:
            await self.start()
        listed = await self._list_tools(timeout_s)
        by_name = {t.name: t for t in listed}
        counts = collections.Counter(t.name for t in listed)
        if include is not None:
            unknown = [n for n in include if n not in by_name]
            if unknown:
                raise ValueError(f"MCP server {self.name!r} has no tool(s) {unknown}; "
                                 f"its tools: {sorted(by_name)}")
            listed = [by_name[n] for n in dict.fromkeys(include)]
        twice = sorted({t.name for t in listed if counts[t.name] > 1})
        if twice:
            raise ValueError(f"MCP server {self.name!r} lists tool(s) {twice} more than once")
        unnamed = [t.name[:80] for t in listed if not TOOL_NAME.fullmatch(t.name)]
        if unnamed:
            raise ValueError(f"MCP server {self.name!r} lists tool name(s) {unnamed} outside MCP's rule (SEP-986: "
                             f"1-128 of A-Z a-z 0-9 _ - .); a name enters the prompt as it is"
                             + ("; choose the other tools with `include`" if include is None else ""))
        return [self._tool(t, timeout_s, max_concurrency) for t in listed]

    async def _list_tools(self, timeout_s: float) -> list[Any]:
        import mcp

        out: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            params = mcp.types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._request("tools/list", lambda s: s.list_tools(params=params), timeout_s)
            out.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return out

    def _tool(self, listed: Any, timeout_s: float, max_concurrency: int) -> Tool:
        """A listed tool as a `Tool`; its function is one tools/call, limited by the tool's
        timeout (read at call time) also when called directly, not through `Tool.invoke`."""
        tool_name = listed.name

        async def call(**arguments: Any) -> str:
            result = await self._request(f"tools/call {tool_name}", lambda s: s.call_tool(tool_name, arguments),
                                         tool.timeout_s)
            text = _content_text(result)
            if result.is_error:
                raise ToolInputError(text or f"tool {tool_name} reported an error")
            return text

        call.__name__ = f"mcp_{tool_name}"
        try:
            parameters = _shown_schema(dict(listed.input_schema or {"type": "object"}))
        except (ValueError, RecursionError) as e:
            raise ValueError(f"MCP server {self.name!r}: tool {tool_name!r}'s inputSchema is {e}") from None
        size = len(json.dumps(parameters, ensure_ascii=False))
        if size > MAX_SCHEMA_CHARS:
            raise ValueError(f"MCP server {self.name!r}: tool {tool_name!r}'s inputSchema is {size} characters of "
                             f"JSON; at most {MAX_SCHEMA_CHARS} enter a prompt")
        tool = Tool(name=tool_name, description=_shown(listed.description or ""), parameters=parameters, fn=call,
                    timeout_s=timeout_s, max_concurrency=max_concurrency)
        return tool

    async def _request(self, what: str, send, timeout_s: float):
        """`send(session)` on the live session (reconnected first if it died), failing at once
        when the connection ends and after `timeout_s` without an answer."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, INVALID_PARAMS

        await self._reconnect()
        session, gone = self._session, self._gone
        if session is None or gone is None or gone.done():
            why = gone.result() if gone is not None and gone.done() else "not started"
            raise McpCallError(f"MCP server {self.name!r} is not connected ({why})")
        call = asyncio.ensure_future(send(session))
        try:
            await asyncio.wait({call, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()  # the SDK sends the server a courtesy cancel
                call.add_done_callback(left_behind)
        if not call.done():
            if gone.done():
                raise McpCallError(f"connection to MCP server {self.name!r} lost: {gone.result()}")
            raise McpTimeoutError(f"MCP server {self.name!r} did not answer {what} within {timeout_s:g} s")
        try:
            return call.result()
        except MCPError as e:
            if e.code == INVALID_PARAMS:
                raise ToolInputError(e.message) from None
            if e.code == CONNECTION_CLOSED:
                # stdio: the child's stdout ended. HTTP: this one request's stream may have ended
                # (the SDK synthesizes the error) while the session lives on; it is only lost when
                # the session's dispatcher closed (a private flag, read defensively).
                if self.command is not None or getattr(getattr(session, "_dispatcher", None), "_closed", False):
                    self._lost(gone, "connection closed")
                    raise McpCallError(f"connection to MCP server {self.name!r} lost: {e.message}") from None
                raise McpCallError(f"MCP server {self.name!r}'s answer to {what} ended early: {e.message}") from None
            raise McpCallError(f"MCP server {self.name!r} error {e.code}: {e.message}") from None
        except Exception as e:  # noqa: BLE001 - an answer the SDK cannot read, e.g. a tool list with a bad inputSchema
            raise McpCallError(f"MCP server {self.name!r} answered {what} unreadably: {_describe(e)}") from None

    def _lost(self, gone: asyncio.Future, reason: str) -> None:
        """The connection died under a call: fail the others now, let the holder clean up."""
        if gone is not self._gone:  # an older connection's call; a new one is up
            return
        if not gone.done():
            gone.set_result(reason)
        if self._stop is not None:
            self._stop.set()
