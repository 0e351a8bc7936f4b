"""Client of the retrieval service (used by the rollout): async, pooled, retrying, failing over.

Speaks Search-R1's API (POST /retrieve) to one or more servers: round-robin across URLs,
exponential backoff on connection errors, timeouts and 5xx (a 4xx is the caller's bug and is
raised at once), and `RetrieverUnavailable` once every attempt failed, which the rollout turns
into an error observation. A 401/403 is `RetrieverAuthError`: no retry, no outage — the
command stops, and `wait_healthy` finds it at start-up. The API key comes from the config,
a key file or env RETRIEVER_API_KEY (`resolve_api_key`). Imports only `data_prep.io` and
`retriever_server.schemas` from this project.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import Any, Sequence

import httpx

from data_prep.io import read_key_file
from retriever_server.schemas import RetrieveRequest, RetrieveResponse, ScoredDocument

log = logging.getLogger(__name__)


class RetrieverUnavailable(RuntimeError):
    """No server answered after all retries (connection errors, timeouts or 5xx)."""


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


def _detail(r: httpx.Response) -> str:
    """An error response's `detail` (FastAPI's error body), else its text."""
    try:
        return str(r.json().get("detail", r.text))
    except (ValueError, AttributeError):
        return r.text


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

    `api_key`: sent as X-API-Key; None: env RETRIEVER_API_KEY when set (as the server reads it)."""

    def __init__(self, urls: str | Sequence[str], *, timeout: float = 30.0, connect_timeout: float = 2.0,
                 max_retries: int = 3, backoff: float = 0.1, max_backoff: float = 2.0,
                 api_key: str | None = None, max_connections: int = 256):
        self.urls = [server_base_url(u) for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("RetrieverClient needs at least one server URL")
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self._rr = itertools.count()
        api_key = api_key if api_key is not None else resolve_api_key()  # env RETRIEVER_API_KEY, as the server
        headers = {"X-API-Key": api_key} if api_key else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout), headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    @classmethod
    def from_config(cls, rcfg: Any, urls: Sequence[str] | None = None, **overrides: Any) -> "RetrieverClient":
        """A client for a `RetrieverConfig` (url, timeout_s, max_retries, api_key, api_key_file);
        `overrides` replace the constructor's arguments (e.g. max_retries=0 for a probe)."""
        kwargs = {"timeout": rcfg.timeout_s, "max_retries": rcfg.max_retries,
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

    async def _post(self, payload: dict) -> dict:
        errors: list[str] = []
        order = self._order()
        for attempt in range(self.max_retries + 1):
            for url in order:  # each attempt tries every server once before backing off
                try:
                    r = await self._client.post(f"{url}/retrieve", json=payload)
                except (httpx.TransportError, httpx.TimeoutException) as e:
                    errors.append(f"{url}: {type(e).__name__}")
                    continue
                if r.status_code >= 500:
                    errors.append(f"{url}: HTTP {r.status_code}")
                    continue
                if r.status_code in (401, 403):
                    raise RetrieverAuthError(r.status_code, _detail(r), url)
                if r.status_code >= 400:
                    raise RetrieverRequestError(r.status_code, _detail(r))
                return r.json()
            if attempt < self.max_retries:
                await asyncio.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise RetrieverUnavailable(f"no retriever answered after {self.max_retries + 1} rounds over "
                                   f"{len(self.urls)} server(s); last errors: {'; '.join(errors[-3:])}")

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[ScoredDocument]]:
        if not queries:
            return []
        payload = RetrieveRequest(queries=list(queries), topk=topk, return_scores=True).model_dump()
        data = await self._post(payload)
        result = RetrieveResponse.model_validate(data).result
        if len(result) != len(queries):
            raise RetrieverUnavailable(f"server answered {len(result)} result lists for {len(queries)} queries")
        return result

    async def wait_healthy(self, timeout: float = 120.0, interval: float = 0.5) -> None:
        """Until at least one server says ok (raises RetrieverUnavailable after `timeout`), then
        one search on each healthy server: a refused key raises RetrieverAuthError here, at
        start-up, rather than in every rollout."""
        await self._wait_healthy(timeout, interval)
        for url in self.urls:
            try:
                r = await self._client.post(f"{url}/retrieve", json={"queries": ["health check"], "topk": 1})
            except (httpx.TransportError, httpx.TimeoutException):
                continue
            if r.status_code in (401, 403):
                raise RetrieverAuthError(r.status_code, _detail(r), url)

    async def _wait_healthy(self, timeout: float, interval: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = ""
        while True:
            for url in self.urls:
                try:
                    r = await self._client.get(f"{url}/health")
                    if r.status_code == 200:
                        return
                    last = f"{url}: {r.status_code} {r.text[:100]}"
                except (httpx.TransportError, httpx.TimeoutException) as e:
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
