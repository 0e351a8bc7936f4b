"""The retriever under faults: no hang, errors where they belong, /health answered throughout.

python benchmarks/retriever_faults.py [--seconds S] [--clients C] [--json PATH]

Starts a real server process (uvicorn, the app, the dense index of a corpus written here and
its real encoder) whose backend misbehaves on purpose: a query starting with BOOM raises, one
starting with SHORT returns too few hit lists. For S seconds it is driven at once by:

  normal      C clients sending 1-query requests of real questions (must all get 200)
  boom/short  a client sending a faulty query beside a normal one every 50 ms (500: its own only)
  impatient   clients giving up after 2 ms and reconnecting (their work must leave the queue)
  oversized   512 queries x topk 100 every second (built off the event loop), a body over
              max_body_bytes (413), 600 queries (422)
  slowloris   20 connections sending a body a byte at a time, never finishing
  health      GET /health every 20 ms from a process of its own: latency p50 / p99 / max

and prints one table: requests and status codes by kind, requests that got no answer within
30 s (hangs: must be 0), /health latency, the server's own error counts; then checks that the
server still answers a normal request. Exit code 1 when any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads

HANG_S = 30.0


class Misbehaving:
    """A real backend that fails on purpose: BOOM... raises, SHORT... loses a hit list."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def search(self, queries, topk):
        if any(q.startswith("BOOM") for q in queries):
            raise RuntimeError("injected backend fault")
        hits = self.inner.search(queries, topk)
        return hits[:-1] if any(q.startswith("SHORT") for q in queries) else hits


def serve(args: argparse.Namespace) -> int:
    """The server process: the real app and uvicorn over the misbehaving real backend."""
    import uvicorn

    from data_prep.hardware import passive_threads
    from retriever_server.app import create_app
    from retriever_server.backends import load_backend
    from retriever_server.settings import Settings
    from retriever_server.watchdog import exit_with

    passive_threads()
    settings = Settings(index=[args.index], corpus=args.corpus, cache_size=0, port=args.port)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, backend_factory=lambda s: Misbehaving(load_backend(s))),
                                           host="127.0.0.1", port=args.port, log_level="critical", access_log=False))
    exit_with(args.parent_pid, lambda: setattr(server, "should_exit", True))
    server.run()
    return 0


# ----------------------------------------------------------------------------- load
class Tally:
    def __init__(self):
        self.codes: dict[str, Counter] = {}
        self.hangs: Counter[str] = Counter()
        self.health_ms: list[float] = []

    def add(self, kind: str, code: int | str) -> None:
        self.codes.setdefault(kind, Counter())[str(code)] += 1


async def post(client, url: str, body: dict, timeout: float = HANG_S):
    return await client.post(f"{url}/retrieve", json=body, timeout=timeout)


async def loop_until(stop: float, fn, pause: float = 0.0) -> None:
    while time.monotonic() < stop:
        await fn()
        if pause:
            await asyncio.sleep(pause)


async def drive(url: str, questions: list[str], seconds: float, clients: int, tally: Tally) -> None:
    import httpx

    stop = time.monotonic() + seconds
    rng = np.random.default_rng(0)
    limits = httpx.Limits(max_connections=clients + 16)
    async with httpx.AsyncClient(limits=limits) as c:

        async def call(kind: str, body: dict, timeout: float = HANG_S) -> None:
            try:
                r = await post(c, url, body, timeout)
                tally.add(kind, r.status_code)
            except httpx.TimeoutException:
                tally.hangs[kind] += 1
                tally.add(kind, "no answer")
            except httpx.TransportError as e:
                tally.add(kind, type(e).__name__)

        async def normal() -> None:
            await call("normal", {"queries": [questions[int(rng.integers(len(questions)))]], "topk": 3})

        async def faulty() -> None:
            for q in ("BOOM " + questions[0], "SHORT " + questions[1]):
                await asyncio.gather(call(q.split()[0].lower(), {"queries": [q]}),
                                     call("normal", {"queries": [questions[int(rng.integers(len(questions)))]]}))

        async def impatient() -> None:
            async with httpx.AsyncClient(timeout=0.002) as quick:
                try:
                    r = await post(quick, url, {"queries": [f"impatient {rng.integers(10 ** 9)}"]}, timeout=0.002)
                    tally.add("impatient", r.status_code)
                except httpx.TimeoutException:
                    tally.add("impatient", "gave up")
                except httpx.TransportError as e:
                    tally.add("impatient", type(e).__name__)

        async def oversized() -> None:
            await call("512x100", {"queries": [f"{q} {i}" for i, q in enumerate(questions[:1] * 512)], "topk": 100})
            await call("body>max", {"queries": ["x" * 2000] * 2100})  # ~4.2 MB > max_body_bytes
            await call("600 queries", {"queries": ["q"] * 600})

        async def slowloris() -> None:
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 100000\r\n\r\n".encode())
            try:
                while time.monotonic() < stop:
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.5)
            except (ConnectionError, OSError):
                tally.add("slowloris", "closed by server")
            else:
                tally.add("slowloris", "held")
            writer.close()

        async def health() -> None:
            t = time.perf_counter()
            try:
                r = await c.get(f"{url}/health", timeout=HANG_S)
                tally.add("health", r.status_code)
            except httpx.TimeoutException:
                tally.hangs["health"] += 1
            tally.health_ms.append((time.perf_counter() - t) * 1000)

        await asyncio.gather(
            *(loop_until(stop, normal) for _ in range(clients)),
            loop_until(stop, faulty, 0.05),
            *(loop_until(stop, impatient, 0.01) for _ in range(4)),
            loop_until(stop, oversized, 1.0),
            *(slowloris() for _ in range(20)),
        )


def poll_health(url: str, seconds: float) -> int:
    """The /health poller's process: one GET every 20 ms, latencies (ms) as JSON on stdout."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    out, stop = [], time.monotonic() + seconds
    while time.monotonic() < stop:
        t = time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=HANG_S)
        try:
            conn.request("GET", "/health")
            status = conn.getresponse().status
        except OSError:
            status = 0
        conn.close()
        out.append([(time.perf_counter() - t) * 1000, status])
        time.sleep(0.02)
    print(json.dumps(out))
    return 0


def corpus_and_questions(d: Path, n_entities: int) -> tuple[Path, Path, list[str]]:
    from benchmarks.retriever import kb_corpus
    from data_prep.indexing import build_index

    corpus, qa = kb_corpus(d, n_entities=n_entities)
    build_index(corpus, d / "flat", kind="flat", progress=False)
    return corpus, d / "flat", [r["question"] for r in qa]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="load duration (default 20)")
    ap.add_argument("--clients", type=int, default=16, help="normal concurrent clients (default 16)")
    ap.add_argument("--entities", type=int, default=300,
                    help="entities of the generated KB whose passages the server's flat index holds (default 300)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--poll-health", metavar="URL", help=argparse.SUPPRESS)
    records.add_args(ap)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args)
    if args.poll_health:
        return poll_health(args.poll_health, args.seconds)

    import subprocess

    import httpx

    from data_prep.hardware import hardware_line
    from retriever_server.launch import free_port, wait_healthy

    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        corpus, index, questions = corpus_and_questions(Path(tmp), args.entities)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(Path(tmp) / "server.log", "wb")
        proc = subprocess.Popen([sys.executable, __file__, "--serve", "--index", str(index), "--corpus", str(corpus),
                                 "--port", str(port), "--parent-pid", str(os.getpid())],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(url, timeout=180, proc=proc)
            tally = Tally()
            poller = subprocess.Popen([sys.executable, __file__, "--poll-health", url, "--seconds", str(args.seconds)],
                                      stdout=subprocess.PIPE, text=True)
            asyncio.run(drive(url, questions, args.seconds, args.clients, tally))
            polled = json.loads(poller.communicate(timeout=HANG_S + 10)[0])
            tally.health_ms = [ms for ms, _ in polled]
            for ms, status in polled:
                tally.add("health", status if ms < HANG_S * 1000 else "no answer")
                tally.hangs["health"] += ms >= HANG_S * 1000
            after = httpx.post(f"{url}/retrieve", json={"queries": [questions[0]]}, timeout=HANG_S)
            health_after = httpx.get(f"{url}/health", timeout=HANG_S)
            server_stats = httpx.get(f"{url}/stats", timeout=HANG_S).json()
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()

    h = np.asarray(tally.health_ms)
    health = {"n": len(h), "p50_ms": round(float(np.percentile(h, 50)), 1),
              "p99_ms": round(float(np.percentile(h, 99)), 1), "max_ms": round(float(h.max()), 1)}
    expected = {"normal": {"200"}, "boom": {"500"}, "short": {"500"}, "512x100": {"200"}, "body>max": {"413"},
                "600 queries": {"422"}, "health": {"200"}, "impatient": {"200", "gave up"}}
    checks = {
        "no request hung": sum(tally.hangs.values()) == 0,
        "each kind got only its expected statuses": all(set(tally.codes.get(k, {})) <= v for k, v in expected.items()),
        "served after the load": after.status_code == 200 and health_after.status_code == 200,
        "impatient clients' work dropped": server_stats["errors"].get("disconnected", 0) > 0,
    }
    print(f"\n{hardware_line()}")
    print(f"retriever under faults: {args.seconds:.0f} s, {args.clients} normal clients, KB corpus of 300 entities\n")
    print(f"| kind | requests | status codes | no answer in {HANG_S:.0f} s |")
    print("|---|---:|---|---:|")
    for kind, codes in tally.codes.items():
        shown = ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))
        print(f"| {kind} | {sum(codes.values())} | {shown} | {tally.hangs.get(kind, 0)} |")
    print(f"\n/health during the load: n={health['n']} p50 {health['p50_ms']} ms, p99 {health['p99_ms']} ms, "
          f"max {health['max_ms']} ms")
    print(f"server's error counts: {dict(sorted(server_stats['errors'].items()))}")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({"codes": {k: dict(v) for k, v in tally.codes.items()},
                                               "hangs": dict(tally.hangs), "health": health,
                                               "server_errors": server_stats["errors"], "checks": checks,
                                               "hardware_line": hardware_line()}, indent=1))
    records.keep(args, "retriever_faults", {"hangs": dict(tally.hangs), "health": health, "checks": checks,
                                             "server_errors": server_stats["errors"], "hardware_line": hardware_line()})
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
