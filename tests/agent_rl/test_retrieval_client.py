"""Retrieval client: Search-R1 formatting, and against two real server processes: round-robin,
failover when one is stopped, RetrieverUnavailable (quickly) when both are, 4xx not retried."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from agent_rl.rollout.observation import format_passages
from agent_rl.rollout.retrieval_client import (
    ApiKeyFileError,
    RetrieverAuthError,
    RetrieverClient,
    RetrieverRequestError,
    RetrieverUnavailable,
    SyncRetrieverClient,
)
from retriever_server.schemas import Document, ScoredDocument

pytestmark = pytest.mark.timed  # its retries are bounded in seconds (tests/conftest.py)

PASSAGES = [
    ("Kestrel Bridge", "Kestrel Bridge spans the river Aun and was opened in 1903 by the mayor of Lindow."),
    ("Ambergris Opera", "The Ambergris Opera was composed by Felicity Marsh in 1888 and tells of a whaling town."),
    ("Tollund Clock", "The Tollund clock tower chimes thirteen times at midnight because of a broken gear."),
] + [(f"Filler {i}", f"Filler passage number {i} about ordinary things like bread, rain and buses.")
     for i in range(37)]


def test_format_passages_matches_search_r1():
    docs = [ScoredDocument(document=Document(id="1", contents='"Kestrel Bridge"\nLine one.\nLine two.'), score=0.5),
            {"document": {"id": "2", "contents": "No title line"}, "score": 0.1}]
    # Search-R1 _passages2string: title = first line as is (quotes kept), text = the rest joined by \n
    assert format_passages(docs) == ('Doc 1(Title: "Kestrel Bridge") Line one.\nLine two.\n'
                                     "Doc 2(Title: No title line) \n")
    assert format_passages([]) == ""


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    from data_prep.indexing import build_index
    from retriever_server.launch import start_server, stop_server, wait_healthy

    d = tmp_path_factory.mktemp("client")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{b}'}) + "\n"
                              for i, (t, b) in enumerate(PASSAGES)))
    build_index(corpus, d / "bm25", kind="bm25", progress=False)  # the client is the subject, not the encoder
    procs = [start_server(d / "bm25", corpus, extra_args=["--log-level", "warning"]) for _ in range(2)]
    try:
        for proc, url in procs:
            wait_healthy(url, timeout=180, proc=proc)
        yield procs
    finally:
        for proc, _ in procs:
            stop_server(proc)


@pytest.mark.slow
def test_round_robin_failover_and_unavailable(two_servers):
    from retriever_server.launch import stop_server

    (p1, u1), (p2, u2) = two_servers

    async def run():
        async with RetrieverClient([u1, u2], timeout=10, max_retries=2, backoff=0.05) as c:
            await c.wait_healthy(timeout=10)
            res = await c.search(["Who composed the Ambergris Opera?", "Why does the Tollund clock chime 13 times?"], 2)
            assert [r[0].document.id for r in res] == ["1", "2"] and all(len(r) == 2 for r in res)
            assert isinstance(res[0][0], ScoredDocument) and res[0][0].score > res[0][1].score
            assert "Felicity Marsh" in format_passages(res[0])
            for _ in range(4):
                await c.search(["Kestrel Bridge"], 1)
            served = [httpx.get(f"{u}/stats").json()["requests"] for u in (u1, u2)]
            assert min(served) >= 2, served  # round-robin spread the calls

            with pytest.raises(RetrieverRequestError) as e:  # 4xx: the caller's bug, raised at once
                await c.search(["q"], 10 ** 6)
            assert e.value.status == 422 and "max_topk" in e.value.detail

            stop_server(p1)
            for _ in range(3):  # every call still answered, by the survivor
                res = await c.search(["Kestrel Bridge river"], 1)
                assert res[0][0].document.id == "0"

            stop_server(p2)
            t0 = time.monotonic()
            with pytest.raises(RetrieverUnavailable, match="no retriever answered after 3 rounds"):
                await c.search(["Kestrel Bridge"], 1)
            assert time.monotonic() - t0 < 5.0  # bounded retries, short backoff
            with pytest.raises(RetrieverUnavailable):
                await c.wait_healthy(timeout=0.5)

    asyncio.run(run())


@pytest.fixture(scope="module")
def keyed_server(two_servers, tmp_path_factory):
    """A real server requiring an API key read from a file (never on its command line)."""
    from retriever_server.launch import start_server, stop_server, wait_healthy

    d = tmp_path_factory.mktemp("keyed")
    key = d / "retriever.key"
    key.write_text("s3cret-key\n")
    (d / "wrong.key").write_text("not-it\n")
    args = two_servers[0][0].args
    corpus, index = args[args.index("--corpus") + 1], args[args.index("--index") + 1]
    proc, url = start_server(index, corpus, extra_args=["--api-key-file", str(key), "--log-level", "warning"])
    try:
        wait_healthy(url, timeout=180, proc=proc)
        assert "s3cret" not in " ".join(proc.args)
        yield url, d
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_the_api_key_end_to_end(keyed_server, monkeypatch):
    """Issue 33: the training config had no field for the key and no caller sent one, so a keyed
    server made every search a 401, taken for an outage. Now the key comes from
    retriever.api_key_file (or env RETRIEVER_API_KEY), and a refused key stops at start-up."""
    from agent_rl.config import TrainConfig

    url, d = keyed_server
    cfg = TrainConfig().retriever
    cfg.url = [f"{url}/retrieve"]

    async def search_with(rcfg):
        async with RetrieverClient.from_config(rcfg, max_retries=0) as c:
            await c.wait_healthy(timeout=10)
            return await c.search(["Who composed the Ambergris Opera?"], 1)

    monkeypatch.delenv("RETRIEVER_API_KEY", raising=False)
    cfg.api_key_file = str(d / "retriever.key")
    assert asyncio.run(search_with(cfg))[0][0].document.id == "1"
    for key_file in (None, str(d / "wrong.key")):  # no key, the wrong key: refused at wait_healthy, at once
        cfg.api_key_file = key_file
        t0 = time.monotonic()
        with pytest.raises(RetrieverAuthError, match="refused the API key .401"):
            asyncio.run(search_with(cfg))
        assert time.monotonic() - t0 < 5
    monkeypatch.setenv("RETRIEVER_API_KEY", "s3cret-key")  # the env variable, as the server reads it
    cfg.api_key_file = None
    assert asyncio.run(search_with(cfg))[0][0].document.id == "1"
    cfg.api_key_file = str(d / "missing.key")
    with pytest.raises(ApiKeyFileError, match="missing.key"):
        RetrieverClient.from_config(cfg)


@pytest.mark.slow
def test_training_with_a_refused_key_stops_before_ray_in_one_line(keyed_server, tmp_path, monkeypatch, capsys):
    from agent_rl.training.cli import main

    url, d = keyed_server
    monkeypatch.delenv("RETRIEVER_API_KEY", raising=False)
    (tmp_path / "model").mkdir()
    (tmp_path / "qa.parquet").write_bytes(b"")  # the paths exist: the key is what is refused
    paths = [f"actor_rollout_ref.model.path={tmp_path / 'model'}", f"data.train_files=[{tmp_path / 'qa.parquet'}]",
             f"data.val_files=[{tmp_path / 'qa.parquet'}]"]
    t0 = time.monotonic()
    rc = main([f"trainer.default_local_dir={tmp_path}", *paths, f"retriever.url=[{url}/retrieve]",
               f"retriever.api_key_file={d / 'wrong.key'}", "trainer.retriever_health_timeout_s=5"])
    err = capsys.readouterr().err
    assert rc == 2 and time.monotonic() - t0 < 30
    (line,) = [x for x in err.splitlines() if "error" in x.lower()]  # the [hardware] line comes first
    assert line.startswith("agent-rl-train: error: retriever at") and "refused the API key (401" in line
    assert "Traceback" not in err


@pytest.mark.slow
def test_sync_client_against_dead_port_is_bounded():
    from retriever_server.launch import free_port

    with SyncRetrieverClient([f"http://127.0.0.1:{free_port()}"], max_retries=1, backoff=0.01) as c:
        t0 = time.monotonic()
        with pytest.raises(RetrieverUnavailable):
            c.search(["anything"], 3)
        assert time.monotonic() - t0 < 3.0
        assert c.search([], 3) == []


def test_bad_urls_refused():
    with pytest.raises(ValueError, match="http"):
        RetrieverClient(["localhost:8000"])
    with pytest.raises(ValueError, match="at least one"):
        RetrieverClient([])


class _Recorder:
    """A local HTTP server on a thread that answers every request with `status` and `body` and
    records (request line, headers) of each: a canned retriever, or a proxy (a proxy gets the
    absolute URL in its request line)."""

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None):
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                seen.append((self.requestline, dict(self.headers)))
                self.send_response(status)
                for k, v in {"content-type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


ANSWER = json.dumps({"result": [[{"document": {"id": "7", "contents": '"T"\nbody'}, "score": 0.5}]]}).encode()


@pytest.fixture
def retriever_and_proxy():
    """(a canned retriever on loopback, a proxy that answers 502 to everything)."""
    retriever, proxy = _Recorder(200, ANSWER), _Recorder(502, b"<html>Bad Gateway</html>",
                                                         {"content-type": "text/html"})
    yield retriever, proxy
    retriever.close()
    proxy.close()


def test_env_proxies_never_see_a_retrievers_queries_or_key(retriever_and_proxy, monkeypatch):
    """HTTP_PROXY / ALL_PROXY set in the environment (for downloads, or by a cluster) sent a
    loopback retriever's queries and X-API-Key to the proxy, whose 502 then counted as a
    retriever outage (RetrieverUnavailable). Now the client goes straight to the retriever."""
    from retriever_server.launch import wait_healthy

    retriever, proxy = retriever_and_proxy
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    async def run():
        async with RetrieverClient(retriever.url, api_key="s3cret", max_retries=0) as c:
            await c.wait_healthy(timeout=5)
            return await c.search(["who?"], 1)

    result = asyncio.run(run())
    wait_healthy(retriever.url, timeout=5)  # the launcher's probe of a local server too
    assert result[0][0].document.id == "7"
    assert proxy.seen == []
    posts = [h for line, h in retriever.seen if line.startswith("POST /retrieve ")]
    assert posts and all(h.get("X-API-Key") == "s3cret" for h in posts)


def test_an_explicit_proxy_is_used_and_its_407_stops_the_run_not_an_outage(retriever_and_proxy):
    """retriever.proxy is the one way through a proxy, and it is used (the proxy sees the
    request, key included: the user asked for it). A proxy asking for credentials (407) is
    RetrieverProxyError, a RetrieverAuthError (the rollout's fatal error, the CLIs' one-line
    stop) raised at the first answer, without retries or waiting, naming the proxy without its
    password; a proxy's 502 is a failed attempt that says it came through the proxy."""
    from agent_rl.config import TrainConfig
    from agent_rl.rollout.retrieval_client import RetrieverProxyError

    retriever, bad_gateway = retriever_and_proxy
    wants_login = _Recorder(407, b"login first", {"proxy-authenticate": 'Basic realm="p"', "content-type": "text/plain"})
    try:
        cfg = TrainConfig().retriever
        cfg.url = [f"{retriever.url}/retrieve"]
        cfg.proxy = wants_login.url.replace("http://", "http://user:pw123@")

        async def search(rcfg, **kw):
            async with RetrieverClient.from_config(rcfg, **kw) as c:
                return await c.search(["who?"], 1)

        t0 = time.monotonic()
        with pytest.raises(RetrieverProxyError) as e:
            asyncio.run(search(cfg, max_retries=3, backoff=1.0))
        assert time.monotonic() - t0 < 1.0 and isinstance(e.value, RetrieverAuthError)
        assert "407" in str(e.value) and wants_login.url in str(e.value) and "pw123" not in str(e.value)
        assert len(wants_login.seen) == 1 and wants_login.seen[0][0].startswith(f"POST {retriever.url}/retrieve ")

        async def healthy(rcfg):
            async with RetrieverClient.from_config(rcfg) as c:
                await c.wait_healthy(timeout=30)

        t0 = time.monotonic()
        with pytest.raises(RetrieverProxyError):
            asyncio.run(healthy(cfg))
        assert time.monotonic() - t0 < 1.0

        cfg.proxy = bad_gateway.url
        with pytest.raises(RetrieverUnavailable, match=f"HTTP 502 .through proxy {bad_gateway.url}"):
            asyncio.run(search(cfg, max_retries=0))
        assert retriever.seen == []  # every request above went to the proxies
    finally:
        wants_login.close()
