"""The retriever's index at Wikipedia scale, measured on vectors that cost nothing to make.

python benchmarks/retriever_scale.py [--quick] [--json PATH] [--sizes 100000,1000000] [--dims 384,768]
                                     [--kinds flat,hnsw,ivfpq] [--hnsw-max N] [--big N] [--corpus-lines N]

Encoding wiki-18 (21M passages, e5 768-d) is out of reach of a CPU host, but the index side
is not: this benchmark builds flat, HNSW and IVF-PQ indexes over synthetic unit vectors shaped
like sentence embeddings (a mixture of Gaussian clusters in a 64-d latent space, mapped into
384 / 768 dimensions by a fixed random matrix, plus an isotropic noise floor) and queries drawn
near stored vectors, and measures per index: build seconds, bytes on disk, load seconds and
resident memory after load (in a fresh process), single-query and batched QPS, recall@10
against exact search. IVF-PQ is swept over nprobe. Then: resident and proportional memory (PSS)
of 1 vs 2 processes that memory-map the same index (one copy in the page cache), lookup latency
of the memory-mapped passage store over a generated corpus of up to 21M lines, and each figure
extrapolated to 21M x 768 (marked as such). --quick: 20k vectors, 64-d latent, a smoke test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import records  # noqa: E402
from data_prep.hardware import passive_threads  # noqa: E402  (before faiss loads OpenMP)

passive_threads()
from data_prep.indexing import load_faiss_file  # noqa: E402

WIKI18 = 21_000_000
WIKI18_DIM = 768
TOPK = 10
CHUNK = 65536
LATENT = 64


# ----------------------------------------------------------------------------- synthetic vectors
class Space:
    """Deterministic synthetic embeddings: row i is the same vector whatever else is generated.

    Real sentence embeddings have a low intrinsic dimension and topical clusters; isotropic
    Gaussians would make every index look worse (nothing to compress) and every neighbour
    equally far. So: cluster centres in a LATENT-d space, points spread around them, mapped
    by one random matrix into `dim` dimensions, an isotropic floor added, L2-normalised."""

    def __init__(self, dim: int, seed: int = 0, clusters: int = 1024, spread: float = 0.6, floor: float = 0.8):
        rng = np.random.default_rng([seed, dim])
        self.dim, self.seed, self.spread, self.floor = dim, seed, spread, floor
        self.centres = rng.standard_normal((clusters, LATENT), dtype=np.float32)
        self.proj = (rng.standard_normal((LATENT, dim), dtype=np.float32) / math.sqrt(LATENT)).astype(np.float32)

    def _chunk(self, c: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.dim, c])
        assign = rng.integers(0, len(self.centres), CHUNK)
        z = self.centres[assign] + self.spread * rng.standard_normal((CHUNK, LATENT), dtype=np.float32)
        x = z @ self.proj
        x += self.floor * rng.standard_normal((CHUNK, self.dim), dtype=np.float32)  # ~1/3 of the energy
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def rows(self, lo: int, hi: int):
        """Yield (start, vectors) blocks covering rows lo..hi."""
        for c in range(lo // CHUNK, (hi + CHUNK - 1) // CHUNK):
            a, b = max(lo, c * CHUNK), min(hi, (c + 1) * CHUNK)
            yield a, self._chunk(c)[a - c * CHUNK:b - c * CHUNK]

    def queries(self, n: int, nq: int, noise: float = 0.5, seed: int = 1) -> np.ndarray:
        """nq queries, each a stored vector (rows < n) moved by noise and renormalised."""
        rng = np.random.default_rng([seed, self.dim, n])
        base = np.sort(rng.choice(n, nq, replace=False))
        out = np.empty((nq, self.dim), np.float32)
        for c in np.unique(base // CHUNK):
            sel = np.nonzero(base // CHUNK == c)[0]
            out[sel] = self._chunk(int(c))[base[sel] - c * CHUNK]
        out += (noise / math.sqrt(self.dim)) * rng.standard_normal(out.shape, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def exact_topk(space: Space, n: int, q: np.ndarray, k: int = TOPK) -> np.ndarray:
    """Exact inner-product top-k ids over rows < n, streamed block by block (no n x d in RAM)."""
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_i = np.full((len(q), k), -1, np.int64)
    for lo, x in space.rows(0, n):
        s = q @ x.T
        part = np.argpartition(-s, k - 1, axis=1)[:, :k] if s.shape[1] > k else np.tile(np.arange(s.shape[1]),
                                                                                         (len(q), 1))
        cand_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], 1)
        cand_i = np.concatenate([best_i, part + lo], 1)
        top = np.argsort(-cand_s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """|found top-k ∩ exact top-k| / k, averaged over queries (1.0 = exact search)."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[:k].tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


# ----------------------------------------------------------------------------- building
def ivf_params(n: int, dim: int, pq_div: int) -> dict:
    """nlist ~ 2 sqrt(n) rounded to a power of two (faiss suggests 4-16 sqrt(n); half of the
    low end keeps k-means affordable on 2 cores: its cost is sample x nlist x dim), PQ with
    dim/pq_div bytes per vector (8-bit codes), k-means on >= 32 points per list (>= 64k)."""
    nlist = 2 ** max(4, round(math.log2(2 * math.sqrt(n))))
    nlist = min(nlist, max(16, n // 39))
    return {"nlist": nlist, "pq_m": dim // pq_div, "nbits": 8, "train": min(n, max(65536, 32 * nlist))}


def make_index(kind: str, n: int, dim: int):
    """(empty index, params). ivfpq uses an HNSW coarse quantizer: assigning millions of
    vectors to thousands of lists by brute force would dominate the build on 2 cores."""
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim), {}
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        return index, {"M": 32, "efConstruction": 80}
    pq_div = {"ivfpq": 8, "ivfpq_fine": 4, "ivfpq_refine": 8}[kind]
    p = ivf_params(n, dim, pq_div)
    quantizer = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexIVFPQ(quantizer, dim, p["nlist"], p["pq_m"], p["nbits"], faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = 10
    if kind == "ivfpq_refine":
        # PQ ranks, then the exact vectors re-rank its top k_factor*k: they stay in the file,
        # memory-mapped, and each query reads k_factor*k rows of them
        index = faiss.IndexRefineFlat(index)
        index.k_factor = p["k_factor"] = 4
    return index, p


def build(space: Space, kind: str, n: int, path: Path) -> dict:
    import faiss

    t0 = time.perf_counter()
    index, params = make_index(kind, n, space.dim)
    if not index.is_trained:
        rows = np.sort(np.random.default_rng(0).choice(n, params["train"], replace=False))
        sample = np.concatenate([x[np.isin(np.arange(lo, lo + len(x)), rows)] for lo, x in space.rows(0, n)])
        index.train(sample)
        del sample
    for _, x in space.rows(0, n):
        index.add(x)
    build_s = time.perf_counter() - t0
    faiss.write_index(index, str(path))
    return {"build_s": build_s, "bytes": path.stat().st_size, "params": params}


# ----------------------------------------------------------------------------- probing (own process)
def mem_kb(pid: int | str = "self") -> dict:
    """RSS, PSS and anonymous memory (kB): PSS splits a shared page between the processes that
    map it; `anonymous` is the process's own memory (a mapped file's pages are the page cache's)."""
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        key = line.split(":")[0]
        if key in ("Rss", "Pss", "Anonymous"):
            out[key.lower()] = int(line.split()[1])
    return out


def timed_qps(fn, nq: int, min_s: float) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += nq
        el = time.perf_counter() - t0
        if el >= min_s:
            return n / el


def probe(args: argparse.Namespace) -> int:
    """Load one index (optionally memory-mapped), measure, print one JSON line; with --hold,
    wait for stdin to close so a parent can read /proc/PID/smaps_rollup meanwhile."""
    import faiss

    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))
    q, truth = np.load(args.qfile), np.load(args.truth)
    m0 = mem_kb()
    t0 = time.perf_counter()
    index = load_faiss_file(args.probe, mmap=args.mmap)
    load_s = time.perf_counter() - t0
    m1 = mem_kb()
    base = faiss.downcast_index(index)
    settings = [("-", None)]
    refine = index if isinstance(base, faiss.IndexRefine) else None
    if refine is not None:
        base = faiss.downcast_index(base.base_index)
        # re-ranking depth: k_factor * 10 PQ candidates get their exact score
        settings = [("np,kf", (p, k)) for p in (16, 64) for k in (4, 16, 64) if p <= base.nlist]
    elif hasattr(base, "nprobe"):
        settings = [("nprobe", v) for v in (8, 16, 32, 64, 128) if v <= base.nlist]
    elif hasattr(base, "hnsw"):
        settings = [("efSearch", v) for v in (32, 64, 128, 256)]
    rows = []
    single = q[:args.single]
    for name, v in settings:
        if name == "nprobe":
            base.nprobe = v
        elif name == "efSearch":
            base.hnsw.efSearch = v
        elif name == "np,kf":
            base.nprobe, refine.k_factor = v
            v = f"{v[0]},{v[1]}"
        _, found = index.search(q, TOPK)
        rec = recall_at_k(found, truth)
        bq = timed_qps(lambda: index.search(q, TOPK), len(q), args.min_s)
        sq = timed_qps(lambda: [index.search(single[i:i + 1], TOPK) for i in range(len(single))], len(single),
                       args.min_s)
        rows.append({"setting": f"{name}={v}" if v else "exact", "recall@10": rec, "batch_qps": bq, "single_qps": sq})
        if rec >= 0.999 and name != "-":
            break
    m2 = mem_kb()
    print(json.dumps({"load_s": load_s, "rss_mb_load": (m1["rss"] - m0["rss"]) / 1024,
                      "rss_mb_search": (m2["rss"] - m0["rss"]) / 1024, "rows": rows}), flush=True)
    if args.hold:
        sys.stdin.read()
    return 0


def run_probe(path: Path, qfile: Path, tfile: Path, mmap: bool, single: int, min_s: float,
              hold: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--probe", str(path), "--qfile", str(qfile), "--truth", str(tfile),
           "--single", str(single), "--min-s", str(min_s)] + (["--mmap"] if mmap else []) + (["--hold"] if hold else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)


def probe_once(*a, **kw) -> dict:
    p = run_probe(*a, **kw)
    out, _ = p.communicate("")
    if p.returncode:
        raise RuntimeError(f"probe of {a[0]} failed with code {p.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def shared_memory(path: Path, qfile: Path, tfile: Path, mmap: bool, procs: int) -> dict:
    """RSS and PSS summed over `procs` processes that loaded and searched the same index."""
    ps = [run_probe(path, qfile, tfile, mmap, 8, 0.0, hold=True) for _ in range(procs)]
    try:
        for p in ps:
            json.loads(p.stdout.readline())
        mems = [mem_kb(p.pid) for p in ps]
    finally:
        for p in ps:
            p.stdin.close()
            p.wait()
    return {"processes": procs, "mmap": mmap, "rss_mb_total": sum(m["rss"] for m in mems) / 1024,
            "pss_mb_total": sum(m["pss"] for m in mems) / 1024}


# ----------------------------------------------------------------------------- passage store at scale
def corpus_lookup(work: Path, lines: int, lookups: int = 2000) -> dict:
    """Write a `lines`-line corpus (~300-byte passages) and its offsets, then time random
    PassageStore.get() calls: cold-ish (first touch of each page) and warm (the same rows again)."""
    from data_prep.store import PassageStore

    path, offs = work / "corpus.jsonl", np.empty(lines + 1, np.uint64)
    filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor " * 3
    t0 = time.perf_counter()
    pos = 0
    with open(path, "wb", buffering=1 << 24) as f:
        for lo in range(0, lines, 100_000):
            block = [json.dumps({"id": str(i), "contents": f'"Passage {i}"\n{filler}{i}'}).encode() + b"\n"
                     for i in range(lo, min(lines, lo + 100_000))]
            lens = np.fromiter((len(b) for b in block), np.uint64, len(block))
            offs[lo:lo + len(block)] = pos + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
            pos += int(lens.sum())
            f.write(b"".join(block))
    offs[lines] = pos
    np.save(work / "offsets.npy", offs)
    write_s = time.perf_counter() - t0
    del offs
    m0 = mem_kb()
    t0 = time.perf_counter()
    store = PassageStore(path, work / "offsets.npy")
    open_s = time.perf_counter() - t0
    rows = np.random.default_rng(0).integers(0, lines, lookups)
    out = {"lines": lines, "bytes": pos, "write_s": write_s, "open_s": open_s}
    for phase in ("first", "again"):
        lat = []
        for r in rows:
            t = time.perf_counter()
            doc = store.get(int(r))
            lat.append(time.perf_counter() - t)
            assert doc["id"] == str(r)
        us = np.asarray(lat) * 1e6
        out[phase] = {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))}
    m1 = mem_kb()
    # a mapped file's pages count in RSS as they are touched (the kernel maps whole page-cache
    # folios around each fault); they stay the page cache's, only `anonymous` is the process's
    out["rss_mb"], out["anon_mb"] = (m1["rss"] - m0["rss"]) / 1024, (m1["anonymous"] - m0["anonymous"]) / 1024
    store.close()
    return out


# ----------------------------------------------------------------------------- extrapolation
def extrapolate(r: dict) -> dict:
    """One measured row scaled to 21M x 768, by how each figure grows (said in `how`):
    bytes, memory and build time with n*d; flat QPS with 1/(n*d) (a full scan); IVF QPS with
    1/(sqrt(n)*d) (nlist ~ sqrt(n): each probe scans n/nlist codes of d/8 or d/4 bytes);
    HNSW QPS with 1/(log(n)*d). Recall is carried over as measured at the largest n. The
    memory-mapped refine vectors of ivfpq_refine are resident only where queries touched them,
    which depends on the traffic, not on n: that figure is left out (nan)."""
    f = (WIKI18 * WIKI18_DIM) / (r["n"] * r["dim"])
    q = {"flat": 1 / f, "hnsw": math.log(r["n"]) / math.log(WIKI18) * r["dim"] / WIKI18_DIM}.get(
        r["kind"], math.sqrt(r["n"] / WIKI18) * r["dim"] / WIKI18_DIM)
    out = {**r, "n": WIKI18, "dim": WIKI18_DIM, "source": f"extrapolated from {r['n']:,} x {r['dim']}"}
    for k in ("build_s", "disk_mb", "rss_mb", "rss_mb_searched"):
        out[k] = r[k] * f
    if r["kind"] == "ivfpq_refine":  # mapped refine vectors: resident = the rows queries touched, not n
        out["rss_mb_searched"] = float("nan")
    out["load_s"] = r["load_s"] * f if not r.get("mmap") else r["load_s"]
    for k in ("batch_qps", "single_qps"):
        out[k] = r[k] * q
    return out


# ----------------------------------------------------------------------------- main
def row_of(kind: str, n: int, dim: int, built: dict, probed: dict, setting: dict) -> dict:
    return {"kind": kind, "n": n, "dim": dim, "params": built["params"], "setting": setting["setting"],
            "build_s": built["build_s"], "disk_mb": built["bytes"] / 2 ** 20, "load_s": probed["load_s"],
            "rss_mb": probed["rss_mb_load"], "rss_mb_searched": probed["rss_mb_search"], "single_qps": setting["single_qps"], "batch_qps": setting["batch_qps"],
            "recall@10": setting["recall@10"], "source": "measured"}


def best_setting(probed: dict, target: float = 0.9) -> dict:
    """The fastest setting that reaches `target` recall, else the most accurate one."""
    ok = [s for s in probed["rows"] if s["recall@10"] >= target]
    return ok[0] if ok else max(probed["rows"], key=lambda s: s["recall@10"])


def measure(space: Space, kind: str, n: int, work: Path, nq: int, single: int, min_s: float,
            keep: bool = False) -> tuple[list[dict], Path]:
    qfile, tfile = work / f"q_{n}_{space.dim}.npy", work / f"t_{n}_{space.dim}.npy"
    if not tfile.is_file():
        q = space.queries(n, nq)
        np.save(qfile, q)
        np.save(tfile, exact_topk(space, n, q))
    path = work / f"{kind}_{n}_{space.dim}.faiss"
    built = build(space, kind, n, path)
    probed = probe_once(path, qfile, tfile, kind == "ivfpq_refine", single, min_s)
    rows = [row_of(kind, n, space.dim, built, probed, s) for s in probed["rows"]]
    for r in rows:
        r["best"] = r["setting"] == best_setting(probed)["setting"]
    print(f"  {kind:<12} n={n:<9,} d={space.dim}: build {built['build_s']:.1f}s, {built['bytes'] / 2 ** 20:.0f} MB, "
          f"load {probed['load_s']:.2f}s, RSS +{probed['rss_mb_load']:.0f} MB; "
          + "; ".join(f"{s['setting']} R@10 {s['recall@10']:.3f} {s['batch_qps']:.0f}/{s['single_qps']:.0f} q/s"
                      for s in probed["rows"]), flush=True)
    if not keep:
        path.unlink()
    return rows, path


def print_table(rows: list[dict]) -> None:
    hdr = (f"{'kind':<12} {'n':>11} {'dim':>4} {'setting':<11} {'build s':>8} {'disk MB':>9} {'load s':>7} "
           f"{'RSS MB':>9} {'searched':>9} {'1-q QPS':>8} {'batch QPS':>9} {'R@10':>6}  source")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['kind']:<12} {r['n']:>11,} {r['dim']:>4} {r['setting']:<11} {r['build_s']:>8.1f} "
              f"{r['disk_mb']:>9.0f} {r['load_s']:>7.2f} {r['rss_mb']:>9.0f} {r['rss_mb_searched']:>9.0f} "
              f"{r['single_qps']:>8.1f} "
              f"{r['batch_qps']:>9.1f} {r['recall@10']:>6.3f}  {r['source']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20k vectors, all kinds, short timings (a smoke test)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--sizes", default="100000,1000000", help="vectors per index (comma-separated)")
    ap.add_argument("--dims", default="384,768")
    ap.add_argument("--kinds", default="flat,hnsw,ivfpq,ivfpq_fine,ivfpq_refine",
                    help="flat, hnsw (M=32), ivfpq (dim/8 bytes per vector), ivfpq_fine (dim/4 bytes), "
                         "ivfpq_refine (ivfpq, then the top 40 re-ranked by exact vectors memory-mapped from disk)")
    ap.add_argument("--hnsw-max", type=int, default=1_000_000, help="largest n built as HNSW (slow to build)")
    ap.add_argument("--big", type=int, default=0, help="also IVF-PQ (both kinds) at this n, 384-d (e.g. 5000000)")
    ap.add_argument("--big-kinds", default="ivfpq,ivfpq_refine", help="kinds built at --big")
    ap.add_argument("--corpus-lines", type=int, default=0,
                    help="passage-store lookups over a generated corpus of this many lines (21000000 = wiki-18; "
                         "~330 bytes a line, checked against free disk)")
    ap.add_argument("--no-shared", action="store_true", help="skip the 1 vs 2 processes memory test")
    ap.add_argument("--queries", type=int, default=500, help="queries with exact top-10 per size")
    ap.add_argument("--workdir", help="where index files go (default: a temp dir, removed at the end)")
    # internal: one index probed in a fresh process (clean resident memory)
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--qfile", help=argparse.SUPPRESS)
    ap.add_argument("--truth", help=argparse.SUPPRESS)
    ap.add_argument("--single", type=int, default=50, help=argparse.SUPPRESS)
    ap.add_argument("--min-s", type=float, default=2.0, help=argparse.SUPPRESS)
    ap.add_argument("--mmap", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    records.add_args(ap)
    args = ap.parse_args(argv)
    if args.probe:
        return probe(args)

    from data_prep.hardware import hardware_info, hardware_line

    hw = hardware_line()
    print(hw, flush=True)
    if args.quick:
        sizes, dims, nq, single, min_s = [10000], [128], 200, 20, 0.2
        args.kinds = "flat,hnsw,ivfpq,ivfpq_refine" if args.kinds == ap.get_default("kinds") else args.kinds
    else:
        sizes, dims, nq, single, min_s = ([int(s) for s in args.sizes.split(",")],
                                          [int(d) for d in args.dims.split(",")], args.queries, 50, 2.0)
    kinds = args.kinds.split(",")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t_all = time.perf_counter()
    # the shared-memory figures load the largest size's flat and IVF-PQ indexes: kept from their measurement
    n_sh, d_sh = max(sizes), max(dims)
    shared_kinds = [k for k in ("flat", "ivfpq") if k in kinds and not args.no_shared]
    kept: dict[str, Path] = {}
    try:
        for dim in dims:
            space = Space(dim)
            for n in sizes:
                for kind in kinds:
                    if kind == "hnsw" and n > args.hnsw_max:
                        continue
                    keep = (n, dim) == (n_sh, d_sh) and kind in shared_kinds
                    measured, path = measure(space, kind, n, work, nq, single, min_s, keep=keep)
                    rows += measured
                    if keep:
                        kept[kind] = path
        if args.big:
            space = Space(384)
            for kind in args.big_kinds.split(","):
                rows += measure(space, kind, args.big, work, nq, single, min_s)[0]
        # --- one copy shared through the page cache: 1 vs 2 processes, copied vs memory-mapped
        shared = []
        for kind, path in kept.items():
            qfile, tfile = work / f"q_{n_sh}_{d_sh}.npy", work / f"t_{n_sh}_{d_sh}.npy"
            for mmap in (False, True):
                for procs in (1, 2):
                    s = {"kind": kind, "n": n_sh, "dim": d_sh,
                         **shared_memory(path, qfile, tfile, mmap, procs)}
                    shared.append(s)
                    print(f"  shared {kind} {'mmap' if mmap else 'copy'} x{procs}: RSS {s['rss_mb_total']:.0f} MB, "
                          f"PSS {s['pss_mb_total']:.0f} MB", flush=True)
            path.unlink()
        lookup = None
        if args.corpus_lines or args.quick:
            lines = args.corpus_lines or 20_000
            free = shutil.disk_usage(work).free
            if lines * 340 > free // 3:
                lines = int(free // 3 // 340)
                print(f"  corpus: only {lines:,} lines fit in a third of the free disk", flush=True)
            cdir = work / "corpus"
            cdir.mkdir(exist_ok=True)
            lookup = corpus_lookup(cdir, lines)
            shutil.rmtree(cdir)
            print(f"  corpus {lookup['lines']:,} lines ({lookup['bytes'] / 2 ** 30:.2f} GiB): open "
                  f"{lookup['open_s'] * 1000:.1f} ms, get() p50/p99 {lookup['first']['p50_us']:.0f}/"
                  f"{lookup['first']['p99_us']:.0f} us first touch, {lookup['again']['p50_us']:.0f}/"
                  f"{lookup['again']['p99_us']:.0f} us again, RSS +{lookup['rss_mb']:.0f} MB "
                  f"(anonymous +{lookup['anon_mb']:.0f} MB)", flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    # --- extrapolate each kind's best setting at its largest measured n (768-d where measured)
    extra = []
    for kind in kinds:
        best = [r for r in rows if r["kind"] == kind and r["best"]]
        if best:
            top = max(best, key=lambda r: (r["n"] * r["dim"], r["dim"]))
            extra.append(extrapolate(top))
    print()
    print(hw)
    print(f"retriever at scale: synthetic clustered unit vectors, {nq} queries near stored vectors, top-{TOPK}, "
          f"recall@10 vs exact search; RSS = resident memory added by loading (fresh process), then after "
          f"all searches (memory-mapped files count the pages touched); "
          f"QPS single-query and batched ({nq} per call); total {time.perf_counter() - t_all:.0f}s")
    print_table(rows + extra)
    if shared:
        print("\nmemory of processes serving one index (loaded, searched, measured together):")
        for s in shared:
            print(f"  {s['kind']:<6} {s['n']:,} x {s['dim']} {'memory-mapped' if s['mmap'] else 'copied':<13} "
                  f"{s['processes']} process(es): RSS {s['rss_mb_total']:7.0f} MB  PSS {s['pss_mb_total']:7.0f} MB")
    if lookup:
        print(f"\npassage store: {lookup['lines']:,} lines, {lookup['bytes'] / 2 ** 30:.2f} GiB, open "
              f"{lookup['open_s'] * 1000:.1f} ms; get() p50 {lookup['first']['p50_us']:.0f} us, p99 "
              f"{lookup['first']['p99_us']:.0f} us (first touch), p50 {lookup['again']['p50_us']:.0f} us again; "
              f"RSS +{lookup['rss_mb']:.0f} MB (mapped file pages; anonymous +{lookup['anon_mb']:.0f} MB)")
    out = {"hardware": hardware_info(), "hardware_line": hw, "quick": args.quick, "rows": rows,
           "extrapolated": extra, "shared_memory": shared, "corpus_lookup": lookup}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    records.keep(args, "retriever_scale", out)
    ok = all(r["recall@10"] >= 0.999 for r in rows if r["kind"] == "flat")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
