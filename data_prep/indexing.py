"""Index building (`agent-rl-prep index`) and loading: dense FAISS (flat / HNSW / IVF-PQ) or BM25.

Layout of an index directory (written under a temporary name, fsynced and renamed when complete;
an existing --out is replaced only when it is an index, i.e. holds meta.json, or is empty):
  meta.json     kind, metric, dim, passage count, corpus sha256, encoder identity, build time
  offsets.npy   byte offset of each passage line in the corpus (data_prep.store.PassageStore)
  index.faiss   dense kinds: inner product over L2-normalised vectors (= cosine)
  bm25/         kind bm25: bm25s' own save format plus its tokenizer vocabulary
Passage embeddings are checkpointed in shards under `.<out>.partial/` while encoding, so an
interrupted build resumes where it stopped (shards are tied to the corpus hash and encoder).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from data_prep.atomic import check_replaceable, replace_dir
from data_prep.encoder import Encoder, EncoderIdentity, describe_encoder
from data_prep.io import Report
from data_prep.store import OFFSETS_FILE, PassageStore, scan_corpus, sha256_file

log = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivfpq", "bm25")
DENSE_KINDS = ("flat", "hnsw", "ivfpq")
META_FILE = "meta.json"
FAISS_FILE = "index.faiss"
BM25_DIR = "bm25"
FORMAT_VERSION = 1
BM25_STOPWORDS = "en"


class IndexMismatch(ValueError):
    """The index on disk does not belong to the corpus or encoder it is served with."""


# ============================================================================ building
def build_index(corpus: str | os.PathLike, out: str | os.PathLike, kind: str = "flat",
                encoder: Encoder | str | None = None, batch_size: int = 256, *,
                shard_size: int = 16384, progress: bool = True, report: Report | None = None,
                **params: Any) -> dict:
    """Build an index of `kind` over `corpus` into directory `out`; returns the metadata written.

    A corpus line that is not a passage (not UTF-8, not JSON, no contents or id) is counted
    and reported in `report` (``file:line: reason``) and left out of the index; the build
    goes on. The same corpus always leaves out the same lines, so an interrupted build
    resumes from its embedding shards.

    params: hnsw_m (32), ef_construction (200), nlist (~4*sqrt(n)), pq_m (dim/8), pq_nbits (8),
    pooling / backend / precision (when `encoder` is a spec, not an Encoder), keep_embeddings.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    corpus, out = Path(corpus), Path(out)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus {corpus} does not exist")
    check_replaceable(out, META_FILE, "an index", "choose another --out, or move it away first")
    t0 = time.time()
    report = report if report is not None else Report()
    offsets, sha = scan_corpus(corpus, report)
    n = len(offsets) - 1
    if n == 0:
        raise ValueError(f"corpus {corpus} has no passages" + (f" ({report.summary()})" if report.read else ""))
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / OFFSETS_FILE, offsets)
    store = PassageStore(corpus, offsets)
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "kind": kind, "num_passages": n,
        "corpus": {"path": str(corpus.resolve()), "sha256": sha, "size_bytes": int(offsets[-1]),
                   "lines_skipped": report.skipped},
    }
    try:
        if kind == "bm25":
            meta.update(_build_bm25(store, tmp, progress))
        else:
            enc = encoder if isinstance(encoder, Encoder) else Encoder(
                encoder, pooling=params.pop("pooling", None), backend=params.pop("backend", None),
                precision=params.pop("precision", None))
            meta.update(_build_dense(store, sha, tmp, out, kind, enc, batch_size, shard_size, progress, params))
    finally:
        store.close()
    meta["build_seconds"] = round(time.time() - t0, 2)
    meta["passages_per_second"] = round(n / max(meta.get("encode_seconds") or meta["build_seconds"], 1e-9), 1)
    meta["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    replace_dir(tmp, out)
    partial = out.parent / f".{out.name}.partial"
    if params.get("keep_embeddings") and partial.is_dir():
        os.replace(partial, out / "embeddings")
    shutil.rmtree(partial, ignore_errors=True)
    return meta


def import_bm25s() -> Any:
    """bm25s, imported so that it leaves the GPU alone.

    bm25s runs a JAX top-k when it is imported, wherever JAX is installed. On a CUDA machine
    JAX then takes 75% of the GPU's memory in every process that imports bm25s (the index
    builder, the retriever server), and a vLLM engine started beside them finds under 1 GiB
    free (docs/gpu.md). BM25's top-k is CPU work, so JAX runs on the CPU here unless the user
    chose its platform (JAX_PLATFORMS)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s

    return bm25s


def _build_bm25(store: PassageStore, tmp: Path, progress: bool) -> dict:
    bm25s = import_bm25s()
    from bm25s.tokenization import Tokenizer

    t = time.time()
    tokenizer = Tokenizer(stopwords=BM25_STOPWORDS)
    ids = tokenizer.tokenize(list(store.iter_contents()), return_as="ids", show_progress=progress)
    retriever = bm25s.BM25()
    retriever.index(ids, show_progress=progress)
    retriever.save(str(tmp / BM25_DIR), show_progress=False)
    tokenizer.save_vocab(str(tmp / BM25_DIR))
    tokenizer.save_stopwords(str(tmp / BM25_DIR))
    return {"metric": "bm25", "dim": None, "encoder": None, "encode_seconds": round(time.time() - t, 2),
            "params": {"k1": retriever.k1, "b": retriever.b, "method": retriever.method,
                       "stopwords": BM25_STOPWORDS, "stemmer": None},
            "bm25s_version": getattr(bm25s, "__version__", None)}


def _encode_shards(store: PassageStore, sha: str, partial: Path, enc: Encoder, batch_size: int,
                   shard_size: int, progress: bool) -> list[Path]:
    """Encode passages shard by shard; shards already on disk for this corpus+encoder are reused."""
    n = len(store)
    stamp = {"corpus_sha256": sha, "encoder": enc.identity(), "shard_size": shard_size, "num_passages": n}
    stamp_file = partial / "build.json"
    if partial.is_dir():
        try:
            same = json.loads(stamp_file.read_text()) == json.loads(json.dumps(stamp))
        except (OSError, ValueError):
            same = False
        if not same:
            log.info("discarding stale embedding shards in %s", partial)
            shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    stamp_file.write_text(json.dumps(stamp))
    files = []
    num_shards = math.ceil(n / shard_size)
    for s in range(num_shards):
        lo, hi = s * shard_size, min(n, (s + 1) * shard_size)
        f = partial / f"emb_{s:06d}.npy"
        files.append(f)
        if f.is_file():
            try:
                if np.load(f, mmap_mode="r").shape == (hi - lo, enc.dim):
                    continue
            except ValueError:
                pass  # torn write from an older version: re-encode
        if progress and num_shards > 1:
            print(f"shard {s + 1}/{num_shards} (passages {lo}-{hi})", flush=True)
        emb = enc.encode_passages(list(store.iter_contents(lo, hi)), batch_size=batch_size, progress=progress)
        part = f.with_suffix(".tmp.npy")
        np.save(part, emb)
        os.replace(part, f)  # a shard is either complete or absent
    return files


def _build_dense(store: PassageStore, sha: str, tmp: Path, out: Path, kind: str, enc: Encoder,
                 batch_size: int, shard_size: int, progress: bool, params: dict) -> dict:
    import faiss

    n, dim = len(store), enc.dim
    t = time.time()
    partial = out.parent / f".{out.name}.partial"
    files = _encode_shards(store, sha, partial, enc, batch_size, shard_size, progress)
    encode_seconds = time.time() - t
    shards = [np.load(f, mmap_mode="r") for f in files]
    used: dict[str, Any] = {}
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        used = {"hnsw_m": int(params.get("hnsw_m") or 32), "ef_construction": int(params.get("ef_construction") or 200)}
        index = faiss.IndexHNSWFlat(dim, used["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = used["ef_construction"]
    else:
        used = ivfpq_params(n, dim, params.get("nlist"), params.get("pq_m"), params.get("pq_nbits"))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, used["nlist"], used["pq_m"], used["pq_nbits"],
                                 faiss.METRIC_INNER_PRODUCT)
        index.train(_training_sample(shards, n, used))
    for sh in shards:
        for lo in range(0, len(sh), 65536):
            index.add(np.ascontiguousarray(sh[lo:lo + 65536], dtype=np.float32))
    faiss.write_index(index, str(tmp / FAISS_FILE))
    return {"metric": "inner_product", "dim": dim, "encoder": enc.identity(),
            "encode_seconds": round(encode_seconds, 2), "params": used,
            "faiss_version": getattr(faiss, "__version__", None)}


def ivfpq_params(n: int, dim: int, nlist: int | None, pq_m: int | None, nbits: int | None) -> dict:
    """Defaults that also work on tiny corpora: k-means needs at least as many points as centroids
    (faiss recommends 39x), so nlist and the 2^nbits PQ codebook shrink with n."""
    nlist = int(nlist or max(1, min(int(4 * math.sqrt(n)), n // 39)))
    nbits = int(nbits or min(8, max(1, int(math.log2(max(n, 2))))))
    if pq_m is None:
        pq_m = next(m for m in (dim // 8, dim // 4, dim // 2, dim, 1) if m >= 1 and dim % m == 0)
    if dim % int(pq_m):
        raise ValueError(f"pq_m={pq_m} must divide the dimension {dim}")
    if nlist > n or 2 ** nbits > n:
        raise ValueError(f"ivfpq needs at least nlist={nlist} and 2**pq_nbits={2 ** nbits} passages, corpus has {n}")
    return {"nlist": nlist, "pq_m": int(pq_m), "pq_nbits": nbits}


def _training_sample(shards: Sequence[np.ndarray], n: int, used: dict) -> np.ndarray:
    want = min(n, max(256 * used["nlist"], 64 * 2 ** used["pq_nbits"], 65536))
    rows = np.sort(np.random.default_rng(0).choice(n, size=want, replace=False))
    bounds = np.cumsum([0] + [len(s) for s in shards])
    parts = []
    for i, sh in enumerate(shards):
        sel = rows[(rows >= bounds[i]) & (rows < bounds[i + 1])] - bounds[i]
        if len(sel):
            parts.append(np.asarray(sh[sel], dtype=np.float32))
    return np.ascontiguousarray(np.concatenate(parts))


# ============================================================================ metadata checks
def read_meta(index_dir: str | os.PathLike) -> dict:
    path = Path(index_dir) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir} is not an index directory (no {META_FILE}); "
                                "build one with `agent-rl-prep index`")
    return json.loads(path.read_text())


def check_index(index_dir: str | os.PathLike, corpus: str | os.PathLike, encoder_identity: dict | None = None,
                verify_hash: bool = True) -> dict:
    """Raise IndexMismatch naming what differs (corpus passage count / hash, encoder field)."""
    meta = read_meta(index_dir)
    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus {corpus} does not exist")
    built = meta["corpus"]
    size = corpus.stat().st_size
    offsets = np.load(Path(index_dir) / OFFSETS_FILE, mmap_mode="r")
    if size != built["size_bytes"] or int(offsets[-1]) != size:
        raise IndexMismatch(
            f"corpus mismatch: index {index_dir} was built from {built['path']} ({meta['num_passages']} passages, "
            f"{built['size_bytes']} bytes) but {corpus} has {size} bytes: the corpus changed or is another file; "
            "rebuild the index")
    if verify_hash:
        sha = sha256_file(corpus)
        if sha != built["sha256"]:
            raise IndexMismatch(
                f"corpus mismatch: {corpus} has sha256 {sha[:12]}... but index {index_dir} was built from "
                f"sha256 {built['sha256'][:12]}... (same size, different content); rebuild the index")
    if len(offsets) - 1 != meta["num_passages"]:
        raise IndexMismatch(f"index {index_dir}: offsets hold {len(offsets) - 1} passages, meta.json says "
                            f"{meta['num_passages']}: the index directory is damaged")
    if encoder_identity is not None and meta.get("encoder"):
        diff = EncoderIdentity.mismatches(meta["encoder"], encoder_identity)
        if diff:
            raise IndexMismatch(f"encoder mismatch: index {index_dir} was built with a different encoder ("
                                + "; ".join(diff) + "); serve it with the encoder it was built with")
    return meta


# ============================================================================ searching
class Searcher:
    """search(queries, topk) -> per query [(passage id, score)], best first."""

    kind: str
    store: PassageStore

    def search_rows(self, queries: Sequence[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64 (n, topk), scores float32 (n, topk)); row -1 where fewer than topk exist."""
        raise NotImplementedError

    def search(self, queries: list[str], topk: int) -> list[list[tuple[str, float]]]:
        rows, scores = self.search_rows(queries, topk)
        return [[(str(self.store.get(int(r))["id"]), float(s)) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(rows, scores)]


class DenseSearcher(Searcher):
    def __init__(self, index, encoder: Encoder, store: PassageStore, kind: str,
                 nprobe: int | None = None, ef_search: int | None = None):
        self.index, self.encoder, self.store, self.kind = index, encoder, store, kind
        self.set_params(nprobe, ef_search)

    def set_params(self, nprobe: int | None, ef_search: int | None) -> None:
        import faiss

        base = faiss.downcast_index(self.index) if hasattr(faiss, "downcast_index") else self.index
        if nprobe and hasattr(base, "nprobe"):
            base.nprobe = int(nprobe)
        if ef_search and hasattr(base, "hnsw"):
            base.hnsw.efSearch = int(ef_search)

    def search_vectors(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        if len(vectors) == 0:
            return np.empty((0, topk), np.int64), np.empty((0, topk), np.float32)
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), topk)
        return rows.astype(np.int64, copy=False), scores.astype(np.float32, copy=False)

    def search_rows(self, queries, topk):
        return self.search_vectors(self.encoder.encode_queries(list(queries)), topk)


class BM25Searcher(Searcher):
    kind = "bm25"

    def __init__(self, index_dir: str | os.PathLike, store: PassageStore, mmap: bool = True):
        bm25s = import_bm25s()
        from bm25s.tokenization import Tokenizer

        d = str(Path(index_dir) / BM25_DIR)
        self.retriever = bm25s.BM25.load(d, mmap=mmap, show_progress=False)
        self.tokenizer = Tokenizer(stopwords=BM25_STOPWORDS)
        self.tokenizer.load_vocab(d)
        self.tokenizer.load_stopwords(d)
        self.store = store

    def search_rows(self, queries, topk):
        n = len(self.store)
        k = min(topk, n)
        if not queries:
            return np.empty((0, topk), np.int64), np.empty((0, topk), np.float32)
        ids = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        rows, scores = self.retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)
        rows, scores = np.asarray(rows, np.int64), np.asarray(scores, np.float32)
        if k < topk:  # same shape contract as FAISS: -1 rows past the corpus size
            rows = np.pad(rows, ((0, 0), (0, topk - k)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, topk - k)), constant_values=-np.inf)
        return rows, scores


def load_faiss(index_dir: str | os.PathLike, mmap: bool = False):
    return load_faiss_file(Path(index_dir) / FAISS_FILE, mmap=mmap)


def load_faiss_file(path: str | os.PathLike, mmap: bool = False):
    """Read a FAISS index; mmap: map its vectors from the file instead of copying them, so
    processes serving one index share one copy in the page cache (and start at once).

    FAISS has two flags and they do not combine: IO_FLAG_MMAP maps IVF inverted lists (it needs
    a plain file reader), IO_FLAG_MMAP_IFC maps flat codes (IndexFlat, the storage of HNSW)
    through its own mapped reader. The file header says which one applies."""
    import faiss

    path = str(path)
    if not mmap:
        return faiss.read_index(path)
    with open(path, "rb") as f:
        ivf = f.read(2) in (b"Iw", b"Iv")  # the fourcc of every IVF index (IwPQ, IwFl, IwSQ, ...)
    return faiss.read_index(path, faiss.IO_FLAG_MMAP if ivf else faiss.IO_FLAG_MMAP_IFC)


def load_searcher(index_dir: str | os.PathLike, corpus_path: str | os.PathLike, *,
                  encoder: Encoder | str | None = None, verify: bool = True, nprobe: int | None = None,
                  ef_search: int | None = None, mmap: bool = False, **encoder_kwargs: Any) -> Searcher:
    """Open an index built by `build_index` for searching (checks it against corpus and encoder).
    mmap: map the FAISS vectors from the file instead of copying them (see load_faiss_file).

    encoder: an Encoder, a spec, or None for the one recorded in meta.json (same pooling and
    prefixes; backend/precision from encoder_kwargs or the defaults)."""
    meta = read_meta(index_dir)
    spec = None
    if meta["kind"] in DENSE_KINDS and not isinstance(encoder, Encoder):
        rec = meta["encoder"]
        spec = encoder if encoder is not None else (rec["path"] if Path(rec["path"]).is_dir() else rec["name"])
        if encoder is None:
            for k in ("pooling", "query_prefix", "passage_prefix", "max_length"):
                encoder_kwargs.setdefault(k, rec[k])
    if meta["kind"] in DENSE_KINDS:
        # checked from config files first: a mismatch is refused before any weights are loaded
        ident = encoder.identity() if isinstance(encoder, Encoder) else describe_encoder(
            spec, **{k: v for k, v in encoder_kwargs.items() if k != "num_threads"})
        check_index(index_dir, corpus_path, ident, verify_hash=verify)
        if not isinstance(encoder, Encoder):
            encoder = Encoder(spec, **encoder_kwargs)
    else:
        check_index(index_dir, corpus_path, None, verify_hash=verify)
    store = PassageStore(corpus_path, Path(index_dir) / OFFSETS_FILE)
    if meta["kind"] == "bm25":
        return BM25Searcher(index_dir, store)
    return DenseSearcher(load_faiss(index_dir, mmap=mmap), encoder, store, meta["kind"], nprobe=nprobe,
                         ef_search=ef_search)
