"""Client of the retrieval service (used by the rollout): async, pooled, retrying, failing over.

Speaks Search-R1's API (POST /retrieve) to one or more servers: round-robin across URLs,
exponential backoff on connection errors, timeouts, 5xx, 408/429 and answers it cannot use
(not JSON, the wrong shape, more than topk passages for a query, a redirect, a body over
`max_response_bytes`; a 4xx is the caller's bug and is raised at once), and
`RetrieverUnavailable` once every attempt failed, which the rollout turns into an error
observation. Each attempt has `timeout` in all, reading the answer included: httpx's read
timeout is per chunk, and a server dripping its body would hold a search forever. The answer is
parsed in a worker thread, in Python steps and up to a bounded number of JSON values
(`loads_bounded`), so no answer holds the rollout's event loop: 8 MiB of tiny passages held it
for 2.2 s when json and pydantic read it there (issue 83). A 401/403 is
`RetrieverAuthError`: no retry, no outage — the command stops, and `wait_healthy` finds it at
start-up; so is a proxy's 407 (`RetrieverProxyError`). The API key comes from the config,
a key file or env RETRIEVER_API_KEY (`resolve_api_key`). A proxy is used only when given
(`proxy`, retriever.proxy): env HTTP_PROXY/ALL_PROXY are not read. Imports only `data_prep.io`,
`data_prep.bounded_json` and `retriever_server.schemas` from this project.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import itertools
import json
import logging
import math
import os
import re
import ssl
from typing import Any, Callable, Sequence

import httpx

from data_prep.io import read_key_file
from data_prep.bounded_json import TooManyValues, loads_bounded
from retriever_server.schemas import RetrieveRequest, RetrieveResponse, ScoredDocument

log = logging.getLogger(__name__)


class RetrieverUnavailable(RuntimeError):
    """No server answered usably after all retries (connection errors, timeouts, 5xx, 408/429,
    redirects, malformed or oversized answers)."""


class ResponseTooLarge(RuntimeError):
    """A response body longer than the client's `max_response_bytes` (one failed attempt)."""


class MalformedResponse(RuntimeError):
    """A 200 whose body is not a usable answer (one failed attempt)."""


class RetrieverRequestError(ValueError):
    """The server rejected the request (4xx); retrying would not help."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"retriever rejected the request ({status}): {detail}")
        self.status, self.detail = status, detail


class RetrieverAuthError(RetrieverRequestError):
    """401/403: the API key is missing or wrong. Retrying cannot help; the run must stop."""

    def __init__(self, status: int, detail: str, url: str):
        super().__init__(status, detail)
        self.args = (f"retriever at {url} refused the API key ({status}: {detail}); set retriever.api_key_file "
                     f"or env {API_KEY_ENV} to the server's key",)


class RetrieverProxyError(RetrieverAuthError):
    """407: the proxy the client was told to use (`proxy`, retriever.proxy) wants credentials.
    Not the retriever's fault and not an outage: like a refused key, the run must stop."""

    def __init__(self, detail: str, url: str, proxy: str):
        RetrieverRequestError.__init__(self, 407, detail)
        self.args = (f"the proxy {proxy} refused to pass the request to the retriever at {url} (407: {detail}); "
                     f"give its credentials in retriever.proxy (http://user:password@host:port) or unset it",)


RETRY_STATUS = (408, 429)
"""4xx that say "try again" (the server's body timeout, a rate limiter): retried as a 5xx is."""
MAX_RESPONSE_BYTES = 64 << 20
"""Default `max_response_bytes`: far above any search answer (kilobytes per query), below what
would exhaust a rollout worker's memory."""
MAX_DETAIL_CHARS = 1000
"""An error's detail is cut to this: an HTML error page can be megabytes, and the detail goes
into the exception, the tool's log line and (a refused query) the policy's observation."""
DECODE_PIECE_BYTES = 1 << 20
MAX_DETAIL_JSON_BYTES = 64 << 10
"""An error body longer than this is not read as JSON (`_detail`)."""
VALUES_PER_PASSAGE = 256
"""JSON values one passage of an answer may hold (its document's extra fields included; a
passage is 5: the item, its document, id, contents and score): with topk, what bounds the work
of reading an answer, whatever its bytes."""


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def _decoded(body: bytes | bytearray) -> str:
    """`_text(body)` a MiB at a time: in a worker thread, the event loop's thread can take the
    GIL between pieces (64 MiB in one call would hold it for a tenth of a second or more)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    view = memoryview(body)
    parts = [decoder.decode(view[i:i + DECODE_PIECE_BYTES]) for i in range(0, len(view), DECODE_PIECE_BYTES)]
    return "".join([*parts, decoder.decode(b"", final=True)])


def _detail(body: bytes) -> str:
    """An error response's `detail` (FastAPI's error body), else its text; at most
    MAX_DETAIL_CHARS. Only a body of at most MAX_DETAIL_JSON_BYTES is read as JSON (on the event
    loop: FastAPI's are a few hundred bytes), a longer one is cut as text."""
    text = _text(body[:MAX_DETAIL_JSON_BYTES + 1])
    try:
        data = json.loads(text) if len(body) <= MAX_DETAIL_JSON_BYTES else None
    except (ValueError, RecursionError):
        data = None
    return str(data.get("detail", text) if isinstance(data, dict) else text)[:MAX_DETAIL_CHARS]


def _results(body: bytes | bytearray, n: int, topk: int) -> list[list[ScoredDocument]]:
    """The `n` result lists of a /retrieve answer, at most `topk` passages each; ValueError
    saying what is wrong with it. Bytes that are not UTF-8 become U+FFFD and a score that is not
    finite None: the passages stay readable. Its work is bounded by n and topk, not by the
    body's bytes (`loads_bounded`); the event loop runs it in a thread."""
    limit = 16 + n * (1 + topk * VALUES_PER_PASSAGE)
    try:
        data = loads_bounded(_decoded(body), limit)
    except TooManyValues:
        raise ValueError(f"more than {limit} JSON values, the most {n} result list(s) of at most topk={topk} "
                         f"passages may hold") from None
    lists = data.get("result") if isinstance(data, dict) else None
    if isinstance(lists, list):  # counted before pydantic reads them, which it does holding the GIL
        if len(lists) != n:
            raise ValueError(f"{len(lists)} result lists for {n} queries")
        for i, docs in enumerate(lists):
            if isinstance(docs, list) and len(docs) > topk:
                raise ValueError(f"{len(docs)} passages for query {i}, more than topk={topk}")
    result = RetrieveResponse.model_validate(data).result  # pydantic's ValidationError is a ValueError
    for docs in result:
        for d in docs:
            if d.score is not None and not math.isfinite(d.score):
                d.score = None
    return result


class ApiKeyFileError(ValueError):
    """retriever.api_key_file cannot be read or is empty."""


API_KEY_ENV = "RETRIEVER_API_KEY"


def resolve_api_key(api_key: str | None = None, api_key_file: str | None = None) -> str | None:
    """The key to send: `api_key`, else the first line of `api_key_file`, else env
    RETRIEVER_API_KEY, else None (a server without a key)."""
    if api_key:
        return api_key
    if api_key_file:
        try:
            return read_key_file(api_key_file, "retriever.api_key_file")
        except ValueError as e:
            raise ApiKeyFileError(str(e)) from None
    return os.environ.get(API_KEY_ENV) or None


def server_base_url(url: str) -> str:
    """A server's base URL from either form in use: `http://h:p` or Search-R1's
    `http://h:p/retrieve` (what `retriever.url` holds in Search-R1 run scripts)."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"retriever URL must start with http:// or https://, got {url!r}")
    return u.removesuffix("/retrieve")


class RetrieverClient:
    """`await search(queries, topk)` -> one list of ScoredDocument per query, in order.

    `timeout`: one attempt's limit, connecting and reading included; `max_response_bytes`: a
    longer body is a failed attempt, read no further. `api_key`: sent as X-API-Key; None: env
    RETRIEVER_API_KEY when set (as the server reads it). `proxy`: the one HTTP proxy used, and
    only when given: env HTTP_PROXY/ALL_PROXY (set for downloads, or by a cluster) sent a
    loopback retriever's queries and key to the proxy, whose 502 was taken for an outage."""

    def __init__(self, urls: str | Sequence[str], *, timeout: float = 30.0, connect_timeout: float = 2.0,
                 max_retries: int = 3, backoff: float = 0.1, max_backoff: float = 2.0,
                 api_key: str | None = None, max_connections: int = 256,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, proxy: str | None = None):
        self.urls = [server_base_url(u) for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("RetrieverClient needs at least one server URL")
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self.timeout, self.max_response_bytes = timeout, max_response_bytes
        self._rr = itertools.count()
        api_key = api_key if api_key is not None else resolve_api_key()  # env RETRIEVER_API_KEY, as the server
        headers = {"X-API-Key": api_key} if api_key else {}
        self.proxy = proxy
        self._proxy_shown = re.sub(r"//[^@/]*@", "//", proxy) if proxy else "in front of the server"  # no password
        # trust_env=False: no proxy, netrc or certificate setting is taken from the environment
        # (SSL_CERT_FILE, the one a private CA needs, is read here as httpx would)
        cafile = os.environ.get("SSL_CERT_FILE")
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout), headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            trust_env=False, proxy=proxy, verify=ssl.create_default_context(cafile=cafile) if cafile else True)

    @classmethod
    def from_config(cls, rcfg: Any, urls: Sequence[str] | None = None, **overrides: Any) -> "RetrieverClient":
        """A client for a `RetrieverConfig` (url, timeout_s, max_retries, api_key, api_key_file, proxy);
        `overrides` replace the constructor's arguments (e.g. max_retries=0 for a probe)."""
        kwargs = {"timeout": rcfg.timeout_s, "max_retries": rcfg.max_retries, "proxy": getattr(rcfg, "proxy", None),
                  "api_key": resolve_api_key(getattr(rcfg, "api_key", None), getattr(rcfg, "api_key_file", None))}
        return cls(list(urls if urls is not None else rcfg.url), **{**kwargs, **overrides})

    async def __aenter__(self) -> "RetrieverClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    def _order(self) -> list[str]:
        """This call's URL order: round-robin start, the others as failover."""
        start = next(self._rr) % len(self.urls)
        return self.urls[start:] + self.urls[:start]

    async def _fetch(self, method: str, url: str, timeout: float | None = None,
                     read: Callable[[bytes], Any] | None = None, **kwargs: Any) -> tuple[int, Any]:
        """(status, body) of one request, within `timeout` (default: the client's) in all and at
        most `max_response_bytes` of body (ResponseTooLarge); raises httpx.HTTPError or
        TimeoutError when the exchange fails. `read`: a 200's body is `read(body)` instead, run
        in a thread within the same timeout (its ValueError is raised as MalformedResponse)."""

        async def exchange() -> tuple[int, Any]:
            async with self._client.stream(method, url, **kwargs) as r:
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > self.max_response_bytes:
                        raise ResponseTooLarge(f"more than {self.max_response_bytes} bytes")
            if read is not None and r.status_code == 200:
                try:
                    return 200, await asyncio.to_thread(read, body)  # not copied: only the thread reads it
                except ValueError as e:  # pydantic's ValidationError is one too
                    raise MalformedResponse(" ".join(str(e).split())[:200]) from None
            return r.status_code, bytes(body)

        return await asyncio.wait_for(exchange(), self.timeout if timeout is None else timeout)

    async def _post(self, payload: dict, n: int, topk: int) -> list[list[ScoredDocument]]:
        errors: list[str] = []
        order = self._order()
        read = functools.partial(_results, n=n, topk=topk)  # in a thread, within the attempt's timeout
        for attempt in range(self.max_retries + 1):
            for url in order:  # each attempt tries every server once before backing off
                try:
                    status, body = await self._fetch("POST", f"{url}/retrieve", read=read, json=payload)
                except (httpx.HTTPError, TimeoutError, ResponseTooLarge) as e:
                    errors.append(f"{url}: {type(e).__name__}")
                    continue
                except MalformedResponse as e:
                    errors.append(f"{url}: malformed response ({e})")
                    continue
                if status == 407:
                    raise RetrieverProxyError(_detail(body), url, self._proxy_shown)
                if status >= 500 or status in RETRY_STATUS:
                    via = f" (through proxy {self._proxy_shown})" if self.proxy else ""
                    errors.append(f"{url}: HTTP {status}{via}")
                    continue
                if status in (401, 403):
                    raise RetrieverAuthError(status, _detail(body), url)
                if status >= 400:
                    raise RetrieverRequestError(status, _detail(body))
                if status != 200:  # a redirect is not followed: the URL is wrong, or a proxy answered
                    errors.append(f"{url}: HTTP {status}")
                    continue
                return body  # read by `_results`
            if attempt < self.max_retries:
                await asyncio.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise RetrieverUnavailable(f"no retriever answered after {self.max_retries + 1} rounds over "
                                   f"{len(self.urls)} server(s); last errors: {'; '.join(errors[-3:])}")

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[ScoredDocument]]:
        if not queries:
            return []
        payload = RetrieveRequest(queries=list(queries), topk=topk, return_scores=True).model_dump()
        return await self._post(payload, len(queries), topk)

    async def wait_healthy(self, timeout: float = 120.0, interval: float = 0.5) -> None:
        """Until at least one server says ok (raises RetrieverUnavailable after `timeout`), then
        one search on each healthy server: a refused key raises RetrieverAuthError here, at
        start-up, rather than in every rollout."""
        await self._wait_healthy(timeout, interval)
        for url in self.urls:
            try:
                status, body = await self._fetch("POST", f"{url}/retrieve",
                                                 json={"queries": ["health check"], "topk": 1})
            except (httpx.HTTPError, TimeoutError, ResponseTooLarge):
                continue
            if status == 407:
                raise RetrieverProxyError(_detail(body), url, self._proxy_shown)
            if status in (401, 403):
                raise RetrieverAuthError(status, _detail(body), url)

    async def _wait_healthy(self, timeout: float, interval: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = ""
        while True:
            for url in self.urls:
                try:  # a probe ends by the deadline (at least `interval`: a server gets one real chance)
                    status, body = await self._fetch("GET", f"{url}/health",
                                                     timeout=min(self.timeout, max(interval, deadline - loop.time())))
                    if status == 200:
                        return
                    if status == 407:  # the proxy's answer, not the server's health: waiting cannot help
                        raise RetrieverProxyError(_detail(body), url, self._proxy_shown)
                    last = f"{url}: {status} {_text(body[:100])}"
                except (httpx.HTTPError, TimeoutError, ResponseTooLarge) as e:
                    last = f"{url}: {type(e).__name__}"
            if loop.time() >= deadline:
                raise RetrieverUnavailable(f"no healthy retriever after {timeout:.0f}s ({last})")
            await asyncio.sleep(interval)


class SyncRetrieverClient:
    """Blocking wrapper (scripts, evaluation): runs the async client on a private event loop."""

    def __init__(self, urls: str | Sequence[str], **kwargs):
        self._loop = asyncio.new_event_loop()
        self._client = self._loop.run_until_complete(self._make(urls, kwargs))

    @staticmethod
    async def _make(urls, kwargs) -> RetrieverClient:
        return RetrieverClient(urls, **kwargs)

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[ScoredDocument]]:
        return self._loop.run_until_complete(self._client.search(queries, topk))

    def wait_healthy(self, timeout: float = 120.0) -> None:
        self._loop.run_until_complete(self._client.wait_healthy(timeout))

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

    def __enter__(self) -> "SyncRetrieverClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
