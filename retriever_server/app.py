"""FastAPI app: POST /retrieve (Search-R1's API), GET /health, GET /stats, GET /metrics.

`create_app(settings)` returns an app whose heavy state (index, corpus store, query encoder)
is loaded once in a background task started by `lifespan`, so /health can answer 503
"loading" meanwhile and 200 "ok" after. A load failure (e.g. an index that does not match its
corpus) is logged, shown by /health, and reported to `app.state.on_fatal` (the CLI stops the
server with exit code 2).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter, deque
from contextlib import asynccontextmanager
from typing import Any, Callable

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from retriever_server.batcher import Hits, LRUCache, MicroBatcher, QueueFull
from data_prep.bounded_json import TooManyValues, loads_bounded
from retriever_server.schemas import (ErrorResponse, HealthResponse, RetrieveRequest, RetrieveResponse,
                                      SingleQueryRequest)
from retriever_server.settings import Settings, host_allowed

log = logging.getLogger("retriever_server")
ALLOWED_FIELDS = tuple(dict.fromkeys([*RetrieveRequest.model_fields, *SingleQueryRequest.model_fields]))


RETRY_AFTER_S = 1
"""Retry-After of a 503 for a full server (the client's backoff is of that order)."""
INLINE_BODY_BYTES = 16 * 1024
"""Request bodies up to this size are parsed on the event loop by json's C parser (a few ms at
most: ~5k values); larger ones on a worker thread, by `loads_bounded`. json's C parser holds
the GIL for a whole body: 4 MB of 1.3M `[]` held every other client for 1.2 s."""
EXTRA_VALUES = 16
"""JSON values a large body may hold besides max_queries queries: its few fields, and a few
unknown or repeated ones (refused with their own message)."""
OFF_LOOP_PASSAGES = 2000
"""Responses of more passages are built on a worker thread: 512 queries x topk 100 (51,200
passages) built on the event loop held every other client and /health for its whole build."""


class ApiError(Exception):
    """A client error: status code + a message that says what was wrong (+ response headers)."""

    def __init__(self, status: int, detail: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.kind, self.headers = status, detail, kind, headers or {}


def busy(detail: str) -> ApiError:
    """A 503 telling the client to come back (Retry-After) or try another server."""
    return ApiError(503, f"server busy: {detail}; retry later", "busy", {"retry-after": str(RETRY_AFTER_S)})


async def until_disconnect(receive: Callable) -> None:
    """Returns when the client has gone (after the body was read, uvicorn's `receive` waits
    until the connection closes or the response is sent)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Stats:
    """Counters for /stats and /metrics; touched from the event loop thread only."""

    def __init__(self, window: int = 20000):
        self.started = time.time()
        self.requests = 0
        self.queries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.batches = 0
        self.batch_queries = 0
        self.batch_distinct = 0
        self.batch_requests = 0
        self.max_batch = 0
        self.multi_request_batches = 0
        self.errors: Counter[str] = Counter()
        self.latencies_ms: deque[float] = deque(maxlen=window)

    def on_batch(self, requests: int, queries: int, distinct: int) -> None:
        self.batches += 1
        self.batch_requests += requests
        self.batch_queries += queries
        self.batch_distinct += distinct
        self.max_batch = max(self.max_batch, queries)
        self.multi_request_batches += requests > 1

    def snapshot(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        pct = {f"p{p}": round(float(np.percentile(lat, p)), 3) if len(lat) else None for p in (50, 95, 99)}
        return {
            "uptime_s": round(time.time() - self.started, 1),
            "requests": self.requests, "queries": self.queries,
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses},
            "batches": {"count": self.batches, "queries": self.batch_queries,
                        "distinct_queries": self.batch_distinct, "requests": self.batch_requests,
                        "mean_size": round(self.batch_queries / self.batches, 3) if self.batches else 0.0,
                        "max_size": self.max_batch, "multi_request": self.multi_request_batches},
            "latency_ms": {**pct, "window": len(lat)},
            "errors": dict(self.errors),
        }

    def prometheus(self) -> str:
        s = self.snapshot()
        lines = [
            "# TYPE retriever_requests_total counter", f"retriever_requests_total {s['requests']}",
            "# TYPE retriever_queries_total counter", f"retriever_queries_total {s['queries']}",
            "# TYPE retriever_cache_hits_total counter", f"retriever_cache_hits_total {s['cache']['hits']}",
            "# TYPE retriever_cache_misses_total counter", f"retriever_cache_misses_total {s['cache']['misses']}",
            "# TYPE retriever_batches_total counter", f"retriever_batches_total {s['batches']['count']}",
            "# TYPE retriever_batch_queries_total counter",
            f"retriever_batch_queries_total {s['batches']['queries']}",
            "# TYPE retriever_latency_ms summary",
        ]
        for p in (50, 95, 99):
            v = s["latency_ms"][f"p{p}"]
            lines.append(f'retriever_latency_ms{{quantile="0.{p}"}} {"NaN" if v is None else v}')
        lines.append("# TYPE retriever_errors_total counter")
        for kind, n in sorted(s["errors"].items()):
            lines.append(f'retriever_errors_total{{kind="{kind}"}} {n}')
        return "\n".join(lines) + "\n"


class State:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.backend = None
        self.batcher: MicroBatcher | None = None
        self.error: str | None = None
        self.ready = False
        self.stats = Stats()
        self.cache = LRUCache(settings.cache_size)
        self.load_seconds: float | None = None


# ----------------------------------------------------------------------------- request parsing
def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _validation_message(err: ValidationError | RequestValidationError) -> str:
    msgs = []
    for e in err.errors()[:5]:
        if e["type"] == "extra_forbidden":
            msgs.append(f"unknown field {_loc(e['loc'])!r} (allowed: {', '.join(ALLOWED_FIELDS)})")
        elif e["type"] == "missing":
            msgs.append(f"missing field {_loc(e['loc'])!r}")
        else:
            got = e.get("input")
            shown = json.dumps(got)[:60] if isinstance(got, (str, int, float, bool, type(None))) else type(got).__name__
            msgs.append(f"{_loc(e['loc'])}: {e['msg']} (got {shown})")
    return "; ".join(msgs)


async def read_body(receive: Callable, declared: str | None, limit: int) -> bytes:
    """The request body from ASGI `receive` messages, refused past `limit` bytes (declared in
    Content-Length or counted while reading a chunked body)."""
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, f"bad Content-Length header {declared!r}", "bad_header")
        if int(declared) > limit:
            raise ApiError(413, f"body of {declared} bytes is larger than max_body_bytes={limit}", "body_too_large")
    chunks, size, more = [], 0, True
    while more:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ApiError(499, "client disconnected before sending the whole body", "disconnected")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is larger than max_body_bytes={limit}", "body_too_large")
        chunks.append(chunk)
        more = msg.get("more_body", False)
    return b"".join(chunks)


def load_json(body: bytes, s: Settings) -> Any:
    """The body's JSON; a large one (over INLINE_BODY_BYTES) is read value by value and refused
    past max_queries + EXTRA_VALUES values, before the whole of it is built (a 4 MB body holds
    up to ~2M values: parsing them all cost 0.3-1.2 s of CPU however it was refused after)."""
    try:
        if len(body) <= INLINE_BODY_BYTES:
            return json.loads(body)
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads decodes bytes
        return loads_bounded(text, s.max_queries + EXTRA_VALUES)
    except TooManyValues:
        raise ApiError(422, f"too many queries or fields: the body holds more than {s.max_queries + EXTRA_VALUES} "
                            f"JSON values (max_queries={s.max_queries}, and the fields "
                            f"{', '.join(ALLOWED_FIELDS)})", "too_many_values") from None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"body is not valid JSON: {str(e)[:200]}", "json") from None


def parse_retrieve(headers: dict[str, str], body: bytes, s: Settings) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve request, or an ApiError saying what is wrong."""
    # required, not only checked when sent: a web page may post a body with no Content-Type
    # (fetch of a Blob) without asking the server first (no CORS preflight), but not a JSON one
    ctype = headers.get("content-type")
    media = (ctype or "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"Content-Type must be application/json, got {'none' if ctype is None else repr(ctype)}",
                       "content_type")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # never inflated: a 4 MiB gzip body can hold gigabytes
        raise ApiError(415, f"Content-Encoding {encoding!r} is not accepted: send the JSON body uncompressed",
                       "content_encoding")
    if not body.strip():
        raise ApiError(400, "empty body: expected a JSON object like "
                            '{"queries": ["..."], "topk": 3, "return_scores": true}', "empty_body")
    obj = load_json(body, s)
    if not isinstance(obj, dict):
        raise ApiError(422, f"body must be a JSON object with 'queries' (or 'query'), got a JSON {type(obj).__name__}",
                       "validation")
    # before pydantic, which builds (on the event loop) one error per wrong element: a 4 MiB
    # body of 1.9M ints as queries held /health and every other client for 9 s
    unknown = [k for k in obj if k not in ALLOWED_FIELDS]
    if unknown:
        names = ", ".join(repr(k[:40]) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ApiError(422, f"{len(unknown)} unknown field{'s' if len(unknown) > 1 else ''} {names} "
                            f"(allowed: {', '.join(ALLOWED_FIELDS)})", "validation")
    if "query" in obj and "queries" in obj:
        raise ApiError(422, "send either 'queries' (a list) or 'query' (one string, SkyRL's form), not both",
                       "validation")
    if isinstance(obj.get("queries"), list) and len(obj["queries"]) > s.max_queries:
        raise ApiError(422, f"too many queries: {len(obj['queries'])} > max_queries={s.max_queries}",
                       "too_many_queries")
    try:
        # strict: "3" or 3.0 or true is not a topk, 1 is not a bool
        if "query" in obj:  # SkyRL's single query: answered as a list of one
            one = SingleQueryRequest.model_validate(obj, strict=True)
            req = RetrieveRequest(queries=[one.query], topk=one.topk, return_scores=one.return_scores)
        else:
            req = RetrieveRequest.model_validate(obj, strict=True)
    except ValidationError as e:
        raise ApiError(422, _validation_message(e), "validation") from None
    if not req.queries:
        raise ApiError(422, "queries is empty: send at least one query string", "empty_queries")
    topk = s.topk if req.topk is None else req.topk
    if topk < 1:
        raise ApiError(422, f"topk must be >= 1, got {topk}", "topk")
    if topk > s.max_topk:
        raise ApiError(422, f"topk={topk} exceeds max_topk={s.max_topk}", "topk")
    for i, q in enumerate(req.queries):
        name = "query" if "query" in obj else f"queries[{i}]"
        if len(q) > s.max_query_chars:
            raise ApiError(422, f"{name} has {len(q)} characters, more than max_query_chars="
                                f"{s.max_query_chars}", "query_too_long")
        if not s.allow_empty_queries and not q.strip():
            raise ApiError(422, f"{name} is empty", "empty_query")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(422, f"{name} is not valid Unicode (lone surrogate)", "validation") from None
    return req.queries, topk, req.return_scores


# ----------------------------------------------------------------------------- the app
LINGER_BYTES = 64 * 1024 * 1024
"""At most this much of a too-large body is read (and dropped) so that its client gets the 413."""
LINGER_S = 2.0
"""For at most this long."""


class BodyDeadline:
    """ASGI middleware: a request's body must arrive within `timeout_s` of its headers.

    uvicorn has no such limit: a client that sends its headers and then a byte of body now
    and then (slowloris) held its connection, and a max_concurrent_requests slot, for the
    whole run. Past the deadline the client gets 408 with `connection: close` (uvicorn closes
    the connection after it) and the app reads a disconnect, as if the client had gone.
    A response to a request whose body was not read whole closes the connection too: uvicorn
    would keep reading the rest of that body on a kept-alive connection for as long as bytes
    came (GET /health with a trickling body)."""

    def __init__(self, app: Callable, timeout_s: float, on_timeout: Callable[[], None] | None = None):
        self.app, self.timeout_s, self.on_timeout = app, timeout_s, on_timeout

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_read = late = started = False

        async def timed_receive() -> dict:
            nonlocal body_read, late, started
            if late:
                return {"type": "http.disconnect"}
            if body_read:  # the app waits for the disconnect (search_while_connected): no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    msg = await receive()
            except TimeoutError:
                late = True
                if self.on_timeout is not None:
                    self.on_timeout()
                if not started:
                    started = True
                    detail = json.dumps({"detail": f"the request body did not arrive within body_timeout_s="
                                                   f"{self.timeout_s:g} s"}).encode()
                    await send({"type": "http.response.start", "status": 408,
                                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                            (b"content-length", str(len(detail)).encode())]})
                    await send({"type": "http.response.body", "body": detail})
                return {"type": "http.disconnect"}
            body_read = msg["type"] != "http.request" or not msg.get("more_body", False)
            return msg

        async def closing_send(msg: dict) -> None:
            nonlocal started
            if late:
                return  # answered 408 already: the app's answer to the "disconnect" goes nowhere
            if msg["type"] == "http.response.start":
                started = True
                if msg.get("status") == 413 and not body_read:
                    await linger()
                    if late:
                        return
                if not body_read:
                    msg = {**msg, "headers": [*msg.get("headers", []), (b"connection", b"close")]}
            await send(msg)

        async def linger() -> None:
            """Read and drop the rest of a body refused as too large, up to LINGER_BYTES and
            LINGER_S: a client still sending it reads no answer before it has sent it all, so
            closing at once reached it as a reset connection instead of the 413."""
            dropped, until = 0, asyncio.get_running_loop().time() + LINGER_S
            try:
                async with asyncio.timeout_at(until):
                    while not body_read and not late and dropped <= LINGER_BYTES:
                        m = await timed_receive()
                        if m["type"] != "http.request":
                            return
                        dropped += len(m.get("body", b""))
            except TimeoutError:
                pass

        await self.app(scope, timed_receive, closing_send)


class HostCheck:
    """ASGI middleware: a request whose Host header the server does not answer
    (settings.host_allowed) gets 421 and nothing else runs. On a loopback server with no key,
    a web page could otherwise post to it blind and, by rebinding its own DNS name to
    127.0.0.1, read the answer: the browser then sends the page's name as Host."""

    def __init__(self, app: Callable, settings: Settings, on_refused: Callable[[], None] | None = None):
        self.app, self.settings, self.on_refused = app, settings, on_refused

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if host_allowed(self.settings, host):
            return await self.app(scope, receive, send)
        if self.on_refused is not None:
            self.on_refused()
        detail = json.dumps({"detail": f"Host {host!r} is not one this server answers (bound to "
                                       f"{self.settings.host}): use localhost or the bind address, or add "
                                       f"the name to allowed_hosts"}).encode()
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(detail)).encode())]})
        await send({"type": "http.response.body", "body": detail})


class RetrieveRoute:
    """ASGI middleware: POST /retrieve goes to `handler(scope, receive) -> (status, body,
    headers)`, every other request to the app."""

    def __init__(self, app: Callable, handler: Callable):
        self.app, self.handler = app, handler

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != "/retrieve" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        status, body, headers = await self.handler(scope, receive)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                *((k.encode(), v.encode()) for k, v in headers.items())]})
        await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings, on_fatal: Callable[[str], None] | None = None,
               backend_factory: Callable[[Settings], Any] | None = None) -> FastAPI:
    """backend_factory: defaults to backends.load_backend (tests of pure app logic may pass another)."""
    state = State(settings)

    async def load() -> None:
        t0 = time.time()
        try:
            factory = backend_factory
            if factory is None:
                from retriever_server.backends import load_backend as factory
            state.backend = await asyncio.to_thread(factory, settings)
        except Exception as e:  # any load failure: refuse to serve, say why
            state.error = f"{type(e).__name__}: {e}" if not isinstance(e, (ValueError, OSError)) else str(e)
            log.error("refusing to start: %s", state.error)
            if on_fatal is not None:
                on_fatal(state.error)
            return
        state.batcher = MicroBatcher(state.backend.search, settings.max_batch_size, settings.max_wait_ms,
                                     on_batch=state.stats.on_batch, workers=state.backend.workers,
                                     max_queued=settings.max_queued_queries)
        state.batcher.start()
        state.load_seconds = round(time.time() - t0, 2)
        state.ready = True
        log.info("ready in %.1fs: %s", state.load_seconds, state.backend.describe())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(load())
        yield
        task.cancel()
        if state.batcher is not None:
            await state.batcher.stop()

    expected_key = settings.api_key.encode() if settings.api_key else None

    def key_ok(sent: str | None) -> bool:
        """No key configured, or the one sent equals it (compared in constant time)."""
        return expected_key is None or (sent is not None and hmac.compare_digest(sent.encode(), expected_key))

    app = FastAPI(title="agent-rl retriever", lifespan=lifespan,
                  description="Search-R1-compatible retrieval: POST /retrieve")
    app.state.rs = state

    def check_key(request: Request) -> None:
        if not key_ok(request.headers.get("x-api-key")):
            raise ApiError(401, "missing or wrong X-API-Key header", "auth")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        state.stats.errors[exc.kind] += 1
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        state.stats.errors["validation"] += 1
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        state.stats.errors[f"http_{exc.status_code}"] += 1
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        state.stats.errors["internal"] += 1
        log.exception("internal error on %s", request.url.path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": ErrorResponse}})
    async def health():
        if state.ready and not state.batcher.alive:  # nothing would answer a search: say so
            return JSONResponse({"status": "failed", "detail": "the search loop has stopped; restart the server"},
                                status_code=503)
        if state.ready:
            return HealthResponse(status="ok", index_kind=state.backend.kind,
                                  num_passages=state.backend.num_passages)
        if state.error:
            return JSONResponse({"status": "failed", "detail": state.error}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    inflight = [0]  # /retrieve requests being answered (the event loop's thread only)

    async def retrieve(scope: dict, receive: Callable) -> tuple[int, bytes, dict[str, str]]:
        """POST /retrieve on raw ASGI: (status, JSON body, headers). Errors are answered here too."""
        if inflight[0] >= settings.max_concurrent_requests:  # before reading the body: costs nothing
            return refuse(busy(f"{inflight[0]} requests in progress "
                               f"(max_concurrent_requests={settings.max_concurrent_requests})"))
        inflight[0] += 1
        try:
            return await answer(scope, receive)
        finally:
            inflight[0] -= 1

    async def answer(scope: dict, receive: Callable) -> tuple[int, bytes, dict[str, str]]:
        t0 = time.perf_counter()
        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if not key_ok(headers.get("x-api-key")):
                raise ApiError(401, "missing or wrong X-API-Key header", "auth")
            body = await read_body(receive, headers.get("content-length"), settings.max_body_bytes)
            if len(body) > INLINE_BODY_BYTES:  # read value by value on a thread: the event loop goes on
                queries, topk, with_scores = await asyncio.to_thread(parse_retrieve, headers, body, settings)
            else:
                queries, topk, with_scores = parse_retrieve(headers, body, settings)
            if not state.ready:
                raise ApiError(503, state.error or "index is still loading; retry when GET /health says ok",
                               "not_ready", {"retry-after": str(RETRY_AFTER_S)})
            hits: list[Hits | None] = [state.cache.get((q, topk)) for q in queries]
            missing = list(dict.fromkeys(q for q, h in zip(queries, hits) if h is None))
            state.stats.cache_hits += len(queries) - len([h for h in hits if h is None])
            state.stats.cache_misses += len([h for h in hits if h is None])
            if missing:
                found = dict(zip(missing, await search_while_connected(missing, topk, receive)))
                for q, h in found.items():
                    state.cache.put((q, topk), h)
                hits = [found[q] if h is None else h for q, h in zip(queries, hits)]
            # joined from cached passage JSON (Backend.result_json): validating and encoding the
            # response through a response_model cost more than the rest of the HTTP path
            if len(queries) * topk > OFF_LOOP_PASSAGES:
                out = await asyncio.to_thread(state.backend.result_json, hits, with_scores)
            else:
                out = state.backend.result_json(hits, with_scores)
        except ApiError as e:
            return refuse(e)
        except Exception as e:  # answered as a 500 that names the error; the server keeps serving
            state.stats.errors["internal"] += 1
            log.exception("internal error on /retrieve")
            return 500, json.dumps({"detail": f"internal error: {type(e).__name__}: {e}"}).encode(), {}
        state.stats.requests += 1
        state.stats.queries += len(queries)
        state.stats.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        return 200, out, {}

    def refuse(e: ApiError) -> tuple[int, bytes, dict[str, str]]:
        state.stats.errors[e.kind] += 1
        return e.status, json.dumps({"detail": e.detail}).encode(), e.headers

    async def search_while_connected(queries: list[str], topk: int, receive: Callable) -> list[Hits]:
        """The batcher's answer; a client that disconnects first takes its queries out of the
        queue (a retry of it would otherwise be searched twice)."""
        search = asyncio.ensure_future(state.batcher.submit(queries, topk))
        gone = asyncio.ensure_future(until_disconnect(receive))
        try:
            await asyncio.wait((search, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not search.done():
            search.cancel()
            raise ApiError(499, "client disconnected before its answer", "disconnected")
        try:
            return search.result()
        except QueueFull as e:
            raise busy(str(e)) from None

    # POST /retrieve is answered by a raw ASGI middleware (RetrieveRoute): FastAPI's and Starlette's
    # per-request layers (exception middleware, exit stacks, routing, dependency solving, cookie
    # parsing) cost more CPU on the event loop than the handler itself, and that CPU is taken from
    # the encoder's cores. The FastAPI route below documents the API in /docs and /openapi.json;
    # it answers the same way should a request ever reach it.
    app.add_middleware(RetrieveRoute, handler=retrieve)

    def body_timeout() -> None:
        state.stats.errors["body_timeout"] += 1

    def host_refused() -> None:
        state.stats.errors["host"] += 1

    # inside BodyDeadline: a refused request's unread body closes its connection there
    app.add_middleware(HostCheck, settings=settings, on_refused=host_refused)
    # outermost (added last): every request's body, /retrieve's and the others', is under the deadline
    app.add_middleware(BodyDeadline, timeout_s=settings.body_timeout_s, on_timeout=body_timeout)

    @app.post("/retrieve", response_model=RetrieveResponse, response_model_exclude_unset=True,
              responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse},
                         415: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
                         503: {"model": ErrorResponse}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"anyOf": [RetrieveRequest.model_json_schema(),
                                       SingleQueryRequest.model_json_schema()]}}}}})
    async def retrieve_documented(request: Request):
        status, body, headers = await retrieve(request.scope, request.receive)
        return Response(body, status_code=status, media_type="application/json", headers=headers)

    @app.get("/stats")
    async def stats(request: Request):
        check_key(request)
        snap = state.stats.snapshot()
        snap.update({"ready": state.ready, "load_seconds": state.load_seconds, "cache_entries": len(state.cache),
                     "backend": state.backend.describe() if state.backend else None,
                     "limits": {k: getattr(settings, k) for k in (
                         "topk", "max_topk", "max_queries", "max_query_chars", "max_body_bytes",
                         "max_batch_size", "max_wait_ms", "cache_size", "max_queued_queries",
                         "max_concurrent_requests", "body_timeout_s", "header_timeout_s",
                         "max_header_bytes", "max_headers")},
                     "queued_queries": state.batcher.queued if state.batcher else 0,
                     "search_loop_alive": bool(state.batcher and state.batcher.alive)})
        return snap

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request):
        check_key(request)
        return PlainTextResponse(state.stats.prometheus(), media_type="text/plain; version=0.0.4")

    return app
