"""Limits on a request's line and headers, kept by uvicorn's protocol before the app runs.

uvicorn has no limit on how long a client may take to send its headers (its keep-alive timeout
runs only between requests and stops at the first byte), and httptools, its parser when
installed, keeps every header line it is sent: a client trickling a header byte a second held
its connection for good, and one streaming `a: b` lines grew the server by ~150 MB per million.
Both are refused here, before the app and its API key check see the request:
`header_timeout_s` (408 and closed) and `max_header_bytes` / `max_headers` (431 and closed).
"""

from __future__ import annotations

import asyncio
import http
import json
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # uvicorn's choice too (http="auto"): httptools when installed, else h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - an install without uvicorn[standard]
    HttpToolsProtocol = None


class HeadersRefused(Exception):
    """Raised inside httptools' on_header to stop the parser once the request is refused."""


class HeaderLimits:
    """Mixin for a uvicorn HTTP protocol: a request's line and headers must arrive within
    `header_timeout_s` of the connection (or of the first byte of its next request) and hold at
    most `max_header_bytes` bytes and `max_headers` lines. Set by `protocol_class`."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 16384
    max_headers: int = 100
    on_refused: Callable[[str], None] | None = None

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = self._head_lines = 0
        self._refused = False
        self._start_head()  # a connection that sends nothing is held no longer than a slow one

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)  # type: ignore[misc]

    def _start_head(self) -> None:
        if self._head_timer is None and not self._refused:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_bytes = self._head_lines = 0

    def _answering(self) -> bool:
        """Whether a response is being made on this connection (the late or refused head is a
        pipelined one behind it: nothing may be written into that response)."""
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _head_late(self) -> None:
        self._head_timer = None
        if self._answering():  # close when that response is sent, not in the middle of it
            self.cycle.keep_alive = False
            return
        self._refuse(408, "header_timeout", f"the request line and headers did not arrive within "
                                            f"header_timeout_s={self.header_timeout_s:g} s")

    def _refuse(self, status: int, kind: str, detail: str) -> None:
        """Answer `status` with a JSON detail and close the connection; later bytes are not parsed."""
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        self._end_head()
        if self.on_refused is not None:
            self.on_refused(kind)
        body = json.dumps({"detail": detail}).encode()
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        if not self._answering():
            self.transport.write(head + body)
        self.transport.close()

    def _too_large(self) -> None:
        self._refuse(431, "headers_too_large", f"request line and headers larger than max_header_bytes="
                                               f"{self.max_header_bytes}")

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # uvicorn's 400 for the parser error our refusal raised: already answered
            super().send_400_response(msg)  # type: ignore[misc]

    def _head_open(self) -> bool:
        """Whether the parser is waiting for (the rest of) a request line and headers."""
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._head_open():
            return super().data_received(data)  # type: ignore[misc]
        self._start_head()
        # at most the head's remaining room is parsed while a head is open: a body sent in the
        # same packet must not count as header bytes, nor a flood be parsed whole first
        room = self.max_header_bytes - self._head_bytes + 1
        first, rest = data[:room], data[room:]
        cycle = self.cycle  # both parsers start a new request cycle when a head is complete
        super().data_received(first)  # type: ignore[misc]
        if self._refused or self.transport.is_closing():
            return
        if self.cycle is not cycle or not self._head_open():
            self._end_head()  # (the start of a pipelined head in `first` goes uncounted)
            if self._head_open():
                self._start_head()
        else:
            self._head_bytes += len(first)
            if self._head_bytes > self.max_header_bytes:
                return self._too_large()
        if rest:
            self.data_received(rest)


if HttpToolsProtocol is not None:
    class GuardedHttpTools(HeaderLimits, HttpToolsProtocol):
        """httptools with header limits: its callbacks say where a head starts and ends, and
        count the lines as they are parsed."""

        _in_head = True  # from the connection until the first head is complete

        def _head_open(self) -> bool:
            return self._in_head

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._start_head()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_lines += 1
            if self._head_lines > self.max_headers:
                self._refuse(431, "headers_too_large", f"more than max_headers={self.max_headers} header lines")
                raise HeadersRefused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._end_head()
            super().on_headers_complete()
else:  # pragma: no cover
    GuardedHttpTools = None


class GuardedH11(HeaderLimits, H11Protocol):
    """h11 with header limits: a head is open while h11 waits for a request (their_state IDLE);
    h11 keeps no header line apart from the head's bytes, so max_headers is not counted."""

    def _head_open(self) -> bool:
        return self.conn.their_state is h11.IDLE


def protocol_class(header_timeout_s: float, max_header_bytes: int, max_headers: int,
                   on_refused: Callable[[str], None] | None = None) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with these header limits."""
    base = GuardedHttpTools or GuardedH11
    return type(f"Limited{base.__name__}", (base,), {
        "header_timeout_s": header_timeout_s, "max_header_bytes": max_header_bytes, "max_headers": max_headers,
        "on_refused": staticmethod(on_refused) if on_refused is not None else None})


def server_config(app: Any, host: str, port: int, **kwargs: Any):
    """uvicorn.Config for a retriever app (create_app's): its settings' header limits, counted
    in its /stats errors by kind (header_timeout, headers_too_large)."""
    import uvicorn

    state = app.state.rs
    s = state.settings

    def refused(kind: str) -> None:
        state.stats.errors[kind] += 1

    http_class = protocol_class(s.header_timeout_s, s.max_header_bytes, s.max_headers, refused)
    # h11's own limit one byte above ours: the head is refused by HeaderLimits (431 naming it)
    return uvicorn.Config(app, host=host, port=port, http=http_class, ws="none",
                          h11_max_incomplete_event_size=s.max_header_bytes + 1, **kwargs)
