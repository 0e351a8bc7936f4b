"""Retriever benchmark: HTTP throughput under concurrent load vs the same work in-process.

python benchmarks/retriever.py [--quick] [--json PATH] [--corpus C --index DIR] [--qa QA.jsonl] [--kb]
                               [--neighbour [N]] [--client raw|httpx] [--encoder-backend B --encoder-precision P]

Starts the server as a separate process (cache off, so every query is encoded and searched),
drives it with C concurrent clients sending 1-query requests (C = 1, 16, 64, 256) and with
128-query requests, and prints one table: QPS, latency p50/p95/p99, mean batch size the server
formed, and ratio_to_limit = server QPS / the server's own encoder + the same index called
in-process with the same batch size and the same parallelism (the server's search workers, each
with its encoder threads, as /stats reports them) on quiet cores (1.0 = HTTP and batching cost
nothing). --stand-in-encoder serves a cheap stand-in encoder (hashed bag of words, in both the
server and the limit), so the ratio shows the HTTP path's cost where the real encoder is slow.
encoder_speedup is reported apart: the server's encoder vs plain fp32 (torch), in-process,
batch 64, with the recall@3 change it causes (answer string in the top 3, same index).
--neighbour runs busy-loop processes on every core while the load runs (the retriever beside
a trainer and a vLLM engine); the goal there is QPS at C=64 >= 0.9 x C=16 and p99 <= 2 x p50.
Real data (NQ questions over wiki_35k) when ../shared/data is present; --kb the generated
knowledge base; --quick a small corpus written here and short runs (a smoke test)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import offline_env  # noqa: E402

offline_env()  # before transformers loads
from data_prep.hardware import passive_threads  # noqa: E402

passive_threads()  # as the server does: the in-process limit must not spin beside the neighbour

SHARED = ROOT.parent / "shared" / "data"
WIKI = SHARED / "corpus" / "wiki_35k.jsonl"
NQ = SHARED / "qa" / "nq" / "test.jsonl"


# ----------------------------------------------------------------------------- data
def quick_corpus(d: Path, n: int = 400) -> tuple[Path, list[dict]]:
    rng = np.random.default_rng(0)
    words = ("river castle festival bird mountain ship painter novel bridge garden market temple engine forest "
             "island choir harbor mill library canal").split()
    rows, qa = [], []
    for i in range(n):
        a, b = rng.choice(words, 2, replace=False)
        year = int(rng.integers(1200, 2000))
        rows.append({"id": str(i), "contents": f'"The {a} of place {i}"\nThe {a} of place {i} is next to a {b} '
                                               f"and was built in {year}."})
        qa.append({"question": f"When was the {a} of place {i} built?", "golden_answers": [str(year)]})
    path = d / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, qa


def kb_corpus(d: Path, n_entities: int = 2000) -> tuple[Path, list[dict]]:
    """The generated knowledge base (seed 0) and its test questions: the corpus the demo serves."""
    import pandas as pd

    from data_prep.synthetic import generate_kb

    generate_kb(d / "kb", seed=0, n_entities=n_entities)
    test = pd.read_parquet(d / "kb" / "test.parquet")
    qa = [{"question": q, "golden_answers": list(a)} for q, a in zip(test["question"], test["golden_answers"])]
    return d / "kb" / "corpus.jsonl", qa


def read_qa(path: Path, n: int) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
            if len(out) >= n:
                break
    return out


def _norm(s: str) -> str:
    s = "".join(c for c in s.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def recall_at_3(searcher, qa: list[dict]) -> float:
    rows, _ = searcher.search_rows([r["question"] for r in qa], 3)
    hit = 0
    for r, rr in zip(qa, rows):
        texts = [_norm(searcher.store.get(int(i))["contents"]) for i in rr if i >= 0]
        hit += any(_norm(a) in t for a in r["golden_answers"] for t in texts)
    return hit / max(len(qa), 1)


# ----------------------------------------------------------------------------- load generator
class RawClient:
    """Minimal keep-alive HTTP/1.1 client on asyncio streams: a load generator should cost the
    (shared) CPU as little as possible, so this avoids a full HTTP client per request."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        return status, await self.reader.readexactly(length)

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()


class HttpxClient:
    """httpx.AsyncClient, one per simulated client (one connection each): a full HTTP client,
    heavier than RawClient, whose CPU competes with the server's on the same host."""

    def __init__(self, host: str, port: int):
        import httpx

        self.base = f"http://{host}:{port}"
        self.client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1))

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = await self.client.post(self.base + path, content=body, headers={"Content-Type": "application/json"})
        return r.status_code, r.content

    async def aclose(self) -> None:
        await self.client.aclose()


CLIENTS = {"raw": RawClient, "httpx": HttpxClient}
BUSY_LOOP = "while True:\n    pass\n"


@contextmanager
def neighbour(processes: int):
    """`processes` busy-loop processes at normal priority, each in its own session (its own
    scheduler autogroup, like a trainer or a vLLM engine started from another shell): the cores
    the retriever shares with them are never idle while the load runs."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(processes)]
    try:
        time.sleep(0.5)  # let them reach the run queue
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


async def drive(url: str, queries: list[str], concurrency: int, per_request: int, duration: float,
                topk: int = 3, client: str = "raw") -> dict:
    """C closed-loop clients for `duration` seconds. Clients are made and connected (one untimed
    request each) before the clock starts: the figures are the steady state, not start-up."""
    host, port = url.split("//")[1].split(":")
    lat: list[float] = []
    done_q, errors = 0, 0
    counter = iter(range(10 ** 9))
    # built before the clock starts: an httpx.AsyncClient builds an SSL context (~70 ms of CPU
    # on a busy 2-core host); 64 of them inside the timed window made C=64 look half as fast as
    # C=16, and the first requests alone made a 5 s p99 (issue #15)
    clients = [CLIENTS[client](host, int(port)) for _ in range(concurrency)]

    def body() -> bytes:
        i = next(counter)
        qs = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
        return json.dumps({"queries": qs, "topk": topk, "return_scores": True}).encode()

    async def worker(c, stop_at: float):
        nonlocal done_q, errors
        while time.perf_counter() < stop_at:
            b = body()
            t = time.perf_counter()
            status, data = await c.post("/retrieve", b)
            if status == 200:
                lat.append(time.perf_counter() - t)
                done_q += per_request
            else:
                errors += 1

    try:
        await asyncio.gather(*(c.post("/retrieve", body()) for c in clients))  # connect, untimed
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c, t0 + duration) for c in clients))
        wall = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.aclose()
    ms = np.asarray(lat) * 1000.0
    pct = {f"p{p}_ms": float(np.percentile(ms, p)) if len(ms) else float("nan") for p in (50, 95, 99)}
    return {"qps": done_q / wall, "requests": len(lat), "errors": errors, **pct}


def stand_in_encoder(d: Path) -> Path:
    """A cheap encoder in a local model dir: one BERT layer of width 32 with random weights (seed 0)
    and MiniLM's tokenizer. Its vectors are meaningless; it makes encoding cost little, so a
    benchmark served with it measures the HTTP path and the batcher, not the model."""
    import torch
    from transformers import BertConfig, BertModel

    from data_prep.encoder import resolve_model_path

    if (d / "config.json").is_file():
        return d
    src = resolve_model_path("minilm")
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=512)).save_pretrained(d)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "sentence_bert_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, d / name)
    return d


def stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/stats", timeout=30).json()


def run_level(url: str, queries: list[str], concurrency: int, per_request: int, duration: float,
              client: str) -> dict:
    """One load level: the driver's figures plus the mean batch the server formed meanwhile."""
    s0 = stats(url)["batches"]
    r = asyncio.run(drive(url, queries, concurrency, per_request, duration, client=client))
    s1 = stats(url)["batches"]
    nb = s1["count"] - s0["count"]
    mean_batch = (s1["queries"] - s0["queries"]) / nb if nb else float("nan")
    print(f"  C={concurrency:<4} q/req={per_request:<4} {r['qps']:8.1f} q/s  p50 {r['p50_ms']:8.1f} ms  "
          f"p99 {r['p99_ms']:8.1f} ms  batch {mean_batch:6.1f}", flush=True)
    return {"concurrency": concurrency, "queries_per_request": per_request, **r, "mean_batch": mean_batch}


def holds(rows: list[dict]) -> dict:
    """Issue #15's goal for a busy host: QPS at C=64 >= 0.9 x QPS at C=16, p99 <= 2 x p50 at C=64."""
    by_c = {r["concurrency"]: r for r in rows if r["queries_per_request"] == 1}
    if 16 not in by_c or 64 not in by_c:
        return {}
    return {"c64_over_c16": by_c[64]["qps"] / by_c[16]["qps"],
            "p99_over_p50_c64": by_c[64]["p99_ms"] / by_c[64]["p50_ms"]}


# ----------------------------------------------------------------------------- in-process limit
def inprocess_qps(encoder, index, queries: list[str], batch: int, min_seconds: float, workers: int = 1) -> float:
    """Queries/s of encode + FAISS search called directly, `batch` queries per call, from
    `workers` threads at once (the server's search workers)."""
    import threading

    batch = max(1, batch)
    done = [0] * workers
    t0 = time.perf_counter()

    def work(w: int) -> None:
        i = w * 7919
        while True:
            qs = [queries[(i + j) % len(queries)] for j in range(batch)]
            index.search(encoder.encode_queries(qs), 3)  # the encoder's own sub-batching, as in the server
            done[w] += batch
            i += batch
            if time.perf_counter() - t0 >= min_seconds and done[w] >= 2 * batch:
                return

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def rss_mb(pid: int) -> float:
    from data_prep.hardware import proc_status_kib

    return proc_status_kib("VmRSS", pid) / 1024.0


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    from data_prep.hardware import hardware_info, hardware_line

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small corpus, short runs (smoke test)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--corpus", help="corpus jsonl (default: wiki_35k when present)")
    ap.add_argument("--index", help="existing dense index dir for --corpus (default: build / reuse one)")
    ap.add_argument("--qa", help="QA jsonl for queries and recall (default: NQ test)")
    ap.add_argument("--duration", type=float, help="seconds per load level (default 10, quick 1.5)")
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--num-queries", type=int, default=2000)
    ap.add_argument("--kb", action="store_true", help="serve the generated knowledge base (the demo's corpus)")
    ap.add_argument("--neighbour", type=int, nargs="?", const=os.cpu_count(), default=0, metavar="N",
                    help="run N busy-loop processes (default: one per core) while the load runs: the retriever "
                         "shares its cores, as beside a trainer and a vLLM engine")
    ap.add_argument("--client", choices=tuple(CLIENTS), default="raw",
                    help="load generator: raw (light keep-alive sockets) or httpx (a full async client)")
    ap.add_argument("--encoder-backend", choices=("torch", "onnx"), help="the server's encoder (default: its default)")
    ap.add_argument("--encoder-precision", choices=("auto", "fp32", "bf16", "int8"))
    ap.add_argument("--stand-in-encoder", action="store_true",
                    help="a cheap stand-in encoder (1 layer of width 32, random weights, MiniLM's tokenizer) in "
                         "the index, the server and the limit: the ratio then shows the HTTP path's own cost")
    ap.add_argument("--server-args", default="", help="extra server flags, e.g. '--search-workers 1 --max-wait-ms 2'")
    records.add_args(ap)
    args = ap.parse_args(argv)

    from data_prep.encoder import Encoder
    from data_prep.indexing import build_index, load_faiss, load_searcher, read_meta
    from retriever_server.batcher import MIN_CHUNK
    from retriever_server.launch import start_server, stop_server, wait_healthy

    duration = args.duration or (1.5 if args.quick else 10.0)
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.quick:
        levels = [c for c in levels if c <= 64]
    tmp = Path(tempfile.mkdtemp(prefix="bench-retriever-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the generated corpus and its index
    if args.corpus:
        corpus, qa = Path(args.corpus), read_qa(Path(args.qa or NQ), args.num_queries)
    elif args.kb:
        corpus, qa = kb_corpus(tmp)
    elif args.quick or not WIKI.is_file():
        corpus, qa = quick_corpus(tmp)
    else:
        corpus, qa = WIKI, read_qa(Path(args.qa or NQ), args.num_queries)
    spec = stand_in_encoder(tmp / "stand-in") if args.stand_in_encoder else None
    index = Path(args.index) if args.index else (
        tmp / "flat" if args.quick or args.kb or spec else ROOT / "artifacts" / "wiki35k_flat")
    if not (index / "meta.json").is_file():
        print(f"building a flat index of {corpus} into {index} ...", flush=True)
        build_index(corpus, index, kind="flat", encoder=spec, progress=not args.quick)
    meta = read_meta(index)
    queries = [r["question"] for r in qa]
    print(f"corpus {corpus} ({meta['num_passages']} passages), index {meta['kind']}, {len(queries)} queries",
          flush=True)

    # --- the encoder's speed-up and recall: the server's encoder vs plain fp32 (torch), in-process,
    # one call at a time (a question apart from the HTTP path's cost, issue #15)
    enc_args = {"backend": args.encoder_backend, "precision": args.encoder_precision}
    fast = Encoder(spec, **enc_args)
    faiss_index = load_faiss(index)
    min_s = 0.5 if args.quick else 3.0
    fast64 = inprocess_qps(fast, faiss_index, queries, 64, min_s)
    speed: dict = {}
    if spec is None:
        plain = Encoder(backend="torch", precision="fp32")
        speed["torch_fp32_qps_b64"] = inprocess_qps(plain, faiss_index, queries, 64, min_s)
        # same runtime, fp32: separates the int8 gain from the runtime gain (and from torch's OpenMP
        # threads, which collapse when the cores are oversubscribed by other processes)
        ort_fp32 = Encoder(backend="onnx", precision="fp32")
        speed["onnx_fp32_qps_b64"] = inprocess_qps(ort_fp32, faiss_index, queries, 64, min_s)
        del ort_fp32
        nrec = 100 if args.quick else min(len(qa), 1000)
        s_fast = load_searcher(index, corpus, encoder=fast)
        s_plain = load_searcher(index, corpus, encoder=plain)
        speed.update({"encoder_speedup": fast64 / speed["torch_fp32_qps_b64"], "recall_questions": nrec,
                      "recall@3": recall_at_3(s_fast, qa[:nrec]), "recall@3_fp32": recall_at_3(s_plain, qa[:nrec])})
        speed["recall@3_change"] = speed["recall@3"] - speed["recall@3_fp32"]
        s_fast.store.close()
        s_plain.store.close()
        del s_fast, s_plain, plain

    # --- the server, a separate process, cache off
    t0 = time.perf_counter()
    server_args = ["--cache-size", "0", "--log-level", "warning"]
    server_args += [a for k, v in enc_args.items() if v for a in (f"--encoder-{k}", v)] + args.server_args.split()
    proc, url = start_server(index, corpus, extra_args=server_args)
    rows = []
    try:
        wait_healthy(url, timeout=600, proc=proc)
        startup_s = time.perf_counter() - t0
        served = stats(url)["backend"]
        workers, threads = served["search_workers"], served["encoder_threads"]
        rss0 = rss_mb(proc.pid)
        asyncio.run(drive(url, queries, 4, 1, 0.5))  # warm-up
        scenarios = [(c, 1) for c in levels] + [(1, 128)]
        with neighbour(args.neighbour) if args.neighbour else nullcontext():
            for c, per in scenarios:
                rows.append(run_level(url, queries, c, per, duration, args.client))
        rss1 = rss_mb(proc.pid)
    finally:
        stop_server(proc)
    # the limit: the server's encoder and index in-process with the server's parallelism (its search
    # workers, each with its encoder threads), measured on quiet cores after the neighbour has stopped
    limit_enc = Encoder(spec, **enc_args, num_threads=threads)
    limit_cache: dict[tuple[int, int], float] = {}
    for r in rows:
        b = max(1, int(round(r["mean_batch"]))) if r["mean_batch"] == r["mean_batch"] else r["queries_per_request"]
        # as many workers as the load can keep busy: C requests in flight, a large one cut in chunks
        w = min(workers, r["concurrency"] * max(1, r["queries_per_request"] // MIN_CHUNK))
        if (b, w) not in limit_cache:
            limit_cache[b, w] = inprocess_qps(limit_enc, faiss_index, queries, b, min_s, workers=w)
        r["limit_qps"] = limit_cache[b, w]
        r["ratio_to_limit"] = r["qps"] / r["limit_qps"]

    # --- one table
    hw = hardware_line(encoder=f"{fast.backend}-{fast.precision}")
    print()
    print(hw)
    print(f"retriever benchmark: {meta['num_passages']} passages, {meta['kind']} index, encoder "
          f"{fast.name}{' (stand-in)' if spec else ''} {fast.backend}-{fast.precision}; server: {workers} search "
          f"worker(s) x {threads} encoder thread(s); limit = the same encoder + index in-process, same batch "
          f"size and parallelism, quiet cores; server cache off; client {args.client}; neighbour "
          f"{args.neighbour or 'none'}{' busy processes' if args.neighbour else ''}")
    hdr = f"{'C':>5} {'q/req':>5} {'QPS':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'batch':>6} " \
          f"{'limit QPS':>9} {'ratio':>6} {'errors':>6}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['concurrency']:>5} {r['queries_per_request']:>5} {r['qps']:>8.1f} {r['p50_ms']:>8.1f} "
              f"{r['p95_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['mean_batch']:>6.1f} {r['limit_qps']:>9.1f} "
              f"{r['ratio_to_limit']:>6.2f} {r['errors']:>6}")
    held = holds(rows)
    if held:
        print(f"C=64 vs C=16: QPS x{held['c64_over_c16']:.2f} (goal >= 0.9), C=64 p99/p50 "
              f"{held['p99_over_p50_c64']:.2f} (goal <= 2)")
    if speed:
        print(f"encoder_speedup vs torch-fp32 (batch 64, in-process): {speed['encoder_speedup']:.2f}x "
              f"({fast64:.0f} vs {speed['torch_fp32_qps_b64']:.0f} q/s; onnx-fp32 {speed['onnx_fp32_qps_b64']:.0f} "
              f"q/s); recall@3 on {speed['recall_questions']} questions: {100 * speed['recall@3']:.1f} vs fp32 "
              f"{100 * speed['recall@3_fp32']:.1f} ({100 * speed['recall@3_change']:+.1f} points)")
    print(f"server start-up {startup_s:.1f}s, RSS {rss0:.0f} MB idle / {rss1:.0f} MB after load")

    key = next((r for r in rows if r["concurrency"] == 64 and r["queries_per_request"] == 1), rows[0])
    out = {
        "qps": key["qps"], "p99_ms": key["p99_ms"], "limit_qps": key["limit_qps"],
        "ratio_to_limit": key["ratio_to_limit"], "concurrency": key["concurrency"],
        "encoder": f"{fast.backend}-{fast.precision}", "stand_in_encoder": bool(spec),
        "search_workers": workers, "encoder_threads": threads, "encoder_qps_b64": fast64, **speed,
        "num_passages": meta["num_passages"], "corpus": str(corpus),
        "startup_s": startup_s, "server_rss_mb": rss0, "server_rss_mb_after": rss1, "quick": args.quick,
        "client": args.client, "neighbour": args.neighbour, **held,
        "rows": rows, "hardware": hardware_info(encoder=f"{fast.backend}-{fast.precision}"), "hardware_line": hw,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    records.keep(args, "retriever", out)
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
