"""The retriever under faults (issue 33): a misbehaving backend, busy and departing clients,
oversized answers. The real app and uvicorn on real sockets, with a scripted backend."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from retriever_server.app import create_app
from retriever_server.launch import ServerThread
from retriever_server.settings import Settings
from trickle import Trickle

pytestmark = pytest.mark.timed  # connections are closed within seconds (tests/conftest.py)


class ScriptedBackend:
    """Answers row i for the i-th passage; `boom` in a call raises; each call takes `delay` s,
    and a call with `busy` waits until `gate` is set (the test's requests queue up meanwhile);
    `build_delay` s per response of more than 2,000 passages (a stand-in for building 51,200)."""

    kind, num_passages, workers = "dense", 100, 1

    def __init__(self, delay: float = 0.0, build_delay: float = 0.0):
        self.delay, self.build_delay = delay, build_delay
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()

    def search(self, queries, topk):
        with self.lock:
            self.calls.append(list(queries))
        if "busy" in queries:
            self.gate.wait(10)
        time.sleep(self.delay)
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[(j, 1.0 - j / 100) for j in range(topk)] for _ in queries]

    def result_json(self, hits, with_scores):
        if sum(map(len, hits)) > 2000:
            time.sleep(self.build_delay)
        return json.dumps({"result": [[{"document": {"id": str(r), "contents": f"p{r}"}, "score": s}
                                       for r, s in h] for h in hits]}).encode()

    def describe(self):
        return {"kind": self.kind}


def serve(backend: ScriptedBackend, **settings) -> ServerThread:
    s = Settings(index=["unused"], corpus="unused", **settings)
    return ServerThread(create_app(s, backend_factory=lambda _: backend))


async def post(client: httpx.AsyncClient, url: str, queries: list[str], topk: int = 1) -> httpx.Response:
    return await client.post(f"{url}/retrieve", json={"queries": queries, "topk": topk})


def test_health_says_failed_when_the_search_loop_has_stopped():
    """/health said ok while a dead batcher left every request waiting for ever."""
    with serve(ScriptedBackend()) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        srv.loop.call_soon_threadsafe(srv.server.config.app.state.rs.batcher._task.cancel)
        time.sleep(0.2)
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "failed" and "search loop" in r.json()["detail"]
        q = httpx.post(f"{srv.url}/retrieve", json={"queries": ["q"]}, timeout=5)  # an answer, not a hang
        assert q.status_code >= 500 and "not running" in q.json()["detail"]


def test_a_bad_query_fails_its_own_request_and_the_server_goes_on():
    backend = ScriptedBackend()

    async def run(url):
        async with httpx.AsyncClient(timeout=10) as c:
            first = asyncio.ensure_future(post(c, url, ["busy"]))
            await asyncio.sleep(0.1)
            rest = asyncio.gather(post(c, url, ["a"]), post(c, url, ["boom", "b"]), post(c, url, ["c"]))
            await asyncio.sleep(0.5)  # the three queue up behind "busy", to be batched together
            backend.gate.set()
            rs = await rest
            await first
            return rs, await post(c, url, ["after"])

    with serve(backend) as srv:
        (a, bad, c), after = asyncio.run(run(srv.url))
    assert a.status_code == 200 and c.status_code == 200 and after.status_code == 200
    assert bad.status_code == 500 and "index exploded" in bad.json()["detail"]
    assert ["a", "b", "boom", "c"] in [sorted(c) for c in backend.calls]  # batched together (in arrival order)


def test_a_busy_server_answers_503_with_retry_after():
    backend = ScriptedBackend(delay=1.0)

    async def run(url):
        async with httpx.AsyncClient(timeout=10) as c:
            return await asyncio.gather(*(post(c, url, [f"q{i}"]) for i in range(6)))

    with serve(backend, max_concurrent_requests=2) as srv:
        rs = asyncio.run(run(srv.url))
        stats = httpx.get(f"{srv.url}/stats").json()
        later = httpx.post(f"{srv.url}/retrieve", json={"queries": ["later"]})
    codes = sorted(r.status_code for r in rs)
    assert codes == [200, 200, 503, 503, 503, 503], codes
    busy = [r for r in rs if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "max_concurrent_requests=2" in r.json()["detail"] for r in busy)
    assert stats["errors"]["busy"] == 4 and later.status_code == 200


def test_a_full_queue_answers_503_with_retry_after():
    backend = ScriptedBackend()

    async def run(url):
        async with httpx.AsyncClient(timeout=10) as c:
            first = asyncio.ensure_future(post(c, url, ["busy"]))
            await asyncio.sleep(0.2)  # "busy" is being searched; the queue is empty
            queued = [asyncio.ensure_future(post(c, url, [f"q{i}"])) for i in range(2)]
            await asyncio.sleep(0.3)
            over = await post(c, url, ["over"])
            backend.gate.set()
            return over, await asyncio.gather(first, *queued)

    with serve(backend, max_queued_queries=2) as srv:
        over, served = asyncio.run(run(srv.url))
    assert over.status_code == 503 and over.headers["retry-after"] == "1"
    assert "max_queued=2" in over.json()["detail"]
    assert [r.status_code for r in served] == [200, 200, 200]


def test_the_work_of_a_client_that_left_is_dropped():
    backend = ScriptedBackend()

    async def run(url):
        async with httpx.AsyncClient(timeout=10) as c, httpx.AsyncClient(timeout=0.3) as impatient:
            first = asyncio.ensure_future(post(c, url, ["busy"]))
            await asyncio.sleep(0.2)
            with pytest.raises(httpx.ReadTimeout):
                await post(impatient, url, ["left"])  # gives up while "busy" is searched
            await impatient.aclose()
            stays = asyncio.ensure_future(post(c, url, ["stays"]))
            await asyncio.sleep(0.3)  # the server has seen the disconnect, "stays" is queued
            backend.gate.set()
            await first
            return await stays

    with serve(backend) as srv:
        stays = asyncio.run(run(srv.url))
        stats = httpx.get(f"{srv.url}/stats").json()
    assert stays.status_code == 200
    assert backend.calls == [["busy"], ["stays"]], backend.calls
    assert stats["errors"].get("disconnected") == 1


def test_a_big_answer_is_built_off_the_event_loop():
    """512 queries x topk 100 used to be joined on the event loop: /health waited for it."""
    backend = ScriptedBackend(build_delay=1.0)

    async def run(url):
        async with httpx.AsyncClient(timeout=30) as c:
            big = asyncio.ensure_future(post(c, url, [f"q{i}" for i in range(512)], topk=100))
            await asyncio.sleep(0.3)  # the answer is being built
            t = time.perf_counter()
            health = await c.get(f"{url}/health")
            health_s = time.perf_counter() - t
            return await big, health, health_s

    with serve(backend, cache_size=0) as srv:
        big, health, health_s = asyncio.run(run(srv.url))
    assert big.status_code == 200 and len(big.json()["result"]) == 512 and len(big.json()["result"][0]) == 100
    assert health.status_code == 200 and health_s < 0.4, health_s


def _slow_post(length: int = 1000) -> bytes:
    return (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(length).encode() + b"\r\n\r\n{\"queries\"")


def test_connections_whose_body_does_not_arrive_in_time_are_dropped():
    """Slowloris: 20 connections that sent their headers and then a byte of body now and then
    were held for the whole run, each holding one of max_concurrent_requests (here all of
    them). Past body_timeout_s each is answered 408 and closed, and the server serves again."""
    with serve(ScriptedBackend(), body_timeout_s=1.0, max_concurrent_requests=20) as srv:
        lorises = [Trickle(srv.port, _slow_post()) for _ in range(20)]
        try:
            time.sleep(0.4)
            held = httpx.post(f"{srv.url}/retrieve", json={"queries": ["q"]}, timeout=5)
            deadline = time.monotonic() + 6
            while any(s.closed_after_s is None for s in lorises) and time.monotonic() < deadline:
                time.sleep(0.05)
            after = httpx.post(f"{srv.url}/retrieve", json={"queries": ["q"]}, timeout=5)
            stats = httpx.get(f"{srv.url}/stats").json()
        finally:
            for s in lorises:
                s.close()
    assert held.status_code == 503  # every slot held by a slow body
    closed = [s.closed_after_s for s in lorises]
    assert all(c is not None and c < 3.0 for c in closed), closed
    assert all(s.received.startswith(b"HTTP/1.1 408 ") for s in lorises if s.received), lorises[0].received
    assert sum(s.received.startswith(b"HTTP/1.1 408 ") for s in lorises) >= 18
    assert after.status_code == 200 and stats["errors"]["body_timeout"] == 20


def test_a_slow_body_within_the_deadline_is_answered_and_an_unread_body_closes_the_connection():
    """A body that arrives in pieces within body_timeout_s is a request like any other; a
    response to a request whose body was not read (GET /health with a body trickling in) ends
    the connection, which uvicorn would otherwise keep open for as long as bytes came."""
    import socket

    with serve(ScriptedBackend(), body_timeout_s=2.0) as srv:
        body = json.dumps({"queries": ["slow but steady"]}).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(_slow_post(len(body))[: -len(b"{\"queries\"")])
            for i in range(0, len(body), 8):
                s.sendall(body[i:i + 8])
                time.sleep(0.1)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        loris = Trickle(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{")
        try:
            deadline = time.monotonic() + 6
            while loris.closed_after_s is None and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            loris.close()
    assert loris.received.startswith(b"HTTP/1.1 200 "), loris.received
    assert loris.closed_after_s is not None and loris.closed_after_s < 1.0, loris.closed_after_s


def test_a_body_too_large_is_answered_413_not_a_reset_connection():
    """The server refuses a body past max_body_bytes without reading it; closing the connection
    at once reached a client still sending it as a reset (httpx: ReadError / WriteError) rather
    than the 413 that says what to fix. It reads and drops the rest (bounded) first."""
    body = json.dumps({"queries": ["x" * 2000] * 2100}).encode()  # ~4.2 MB, as benchmarks/retriever_faults.py

    async def post_all(url: str) -> list:
        async with httpx.AsyncClient(timeout=30) as c:
            out = []
            for _ in range(10):
                try:
                    r = await c.post(url, content=body, headers={"content-type": "application/json"})
                    out.append(r)
                except httpx.TransportError as e:
                    out.append(type(e).__name__)
            return out

    with serve(ScriptedBackend(), max_body_bytes=1024 * 1024) as srv:
        answers = asyncio.run(post_all(f"{srv.url}/retrieve"))
        after = httpx.post(f"{srv.url}/retrieve", json={"queries": ["q"]}, timeout=5)
    assert [getattr(a, "status_code", a) for a in answers] == [413] * 10
    assert "max_body_bytes" in answers[0].text
    assert after.status_code == 200
