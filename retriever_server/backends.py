"""Search backends behind one shape: `search(queries, topk) -> [[(row, score)]]` per query.

dense (FAISS flat / HNSW / IVF-PQ, optionally on all GPUs), bm25 (bm25s), and hybrid
(reciprocal-rank fusion of the two). Loading checks each index against the corpus and the
configured encoder (data_prep.indexing.check_index) and refuses a mismatch with a message
saying which part differs.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.encoder import cpu_threads, default_encoder_device
from data_prep.indexing import (DENSE_KINDS, BM25Searcher, DenseSearcher, IndexMismatch, Searcher,
                                load_searcher, read_meta)
from data_prep.store import PassageStore
from retriever_server.batcher import Hits
from retriever_server.settings import Settings

log = logging.getLogger(__name__)
DOC_JSON_CACHE = 65536
"""Passages kept serialized (row -> JSON bytes): a busy server answers the same popular passages
again and again, and parsing the corpus line and writing it back out was most of the per-request
work besides encoding (issue 27)."""


def rows_to_hits(rows: np.ndarray, scores: np.ndarray) -> list[Hits]:
    return [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0] for rr, ss in zip(rows, scores)]


def score_json(score: float) -> bytes:
    """A score as JSON: repr of the float, null when it is not finite (strict JSON has no NaN)."""
    score = float(score)
    return repr(score).encode() if math.isfinite(score) else b"null"


def finite(value: Any) -> Any:
    """`value` (parsed JSON) with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def rrf_fuse(rankings: list[list[int]], k: int, topk: int) -> Hits:
    """Reciprocal-rank fusion: score(d) = sum_r 1 / (k + rank_r(d)), rank from 1.
    Cormack, Clarke & Buettcher, SIGIR 2009. Ties: the better best rank, then the lower row."""
    fused: dict[int, float] = {}
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking, start=1):
            fused[row] = fused.get(row, 0.0) + 1.0 / (k + rank)
            best[row] = min(best.get(row, rank), rank)
    order = sorted(fused, key=lambda r: (-fused[r], best[r], r))
    return [(r, fused[r]) for r in order[:topk]]


@dataclass
class Backend:
    """What the app needs: a search function, the passage store, and a description."""

    kind: str
    store: PassageStore
    dense: DenseSearcher | None = None
    bm25: BM25Searcher | None = None
    depth: int = 100
    rrf_k: int = 60
    workers: int = 1
    """Search calls the batcher may run at once (Settings.search_workers)."""

    @property
    def num_passages(self) -> int:
        return len(self.store)

    def search(self, queries: list[str], topk: int) -> list[Hits]:
        if self.kind == "hybrid":
            depth = max(self.depth, topk)
            d_rows, _ = self.dense.search_rows(queries, depth)
            b_rows, b_scores = self.bm25.search_rows(queries, depth)
            # a BM25 score of 0 matches no query term: its rank is arbitrary, leave it out
            return [rrf_fuse([[int(r) for r in dr if r >= 0], [int(r) for r, s in zip(br, bs) if r >= 0 and s > 0]],
                             self.rrf_k, topk)
                    for dr, br, bs in zip(d_rows, b_rows, b_scores)]
        searcher: Searcher = self.dense if self.kind == "dense" else self.bm25
        return rows_to_hits(*searcher.search_rows(queries, topk))

    def __post_init__(self) -> None:
        self.doc_json = functools.lru_cache(maxsize=DOC_JSON_CACHE)(self._doc_json)

    def doc(self, row: int) -> dict:
        doc = self.store.get(row)
        doc["id"] = str(doc.get("id", row))  # the wire type wants a string id
        return doc

    def _doc_json(self, row: int) -> bytes:
        """`doc(row)` as compact, strict JSON (UTF-8, like FastAPI's responses). Python's json
        reads NaN and Infinity in a corpus line and writes them back, which no strict parser
        takes: a non-finite number in a passage is sent as null."""
        doc = self.doc(row)
        try:
            return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except ValueError:  # rare: walk the passage only when it holds one
            return json.dumps(finite(doc), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def docs(self, hits: Hits) -> list[tuple[dict, float]]:
        return [(self.doc(row), score) for row, score in hits]

    def result_json(self, hits: list[Hits], with_scores: bool) -> bytes:
        """The /retrieve response body `{"result": [[{"document": ..., "score": ...}, ...], ...]}`,
        joined from cached passage JSON (scores as JSON writes floats: repr; a non-finite one null)."""
        if with_scores:
            lists = (b",".join(b'{"document":%b,"score":%b}' % (self.doc_json(r), score_json(s))
                               for r, s in h) for h in hits)
        else:
            lists = (b",".join(b'{"document":%b}' % self.doc_json(r) for r, _ in h) for h in hits)
        return b'{"result":[' + b",".join(b"[" + x + b"]" for x in lists) + b"]}"

    def describe(self) -> dict:
        d = {"kind": self.kind, "num_passages": self.num_passages, "corpus": str(self.store.corpus)}
        if self.dense is not None:
            d["dense_index"] = self.dense.kind
            d["encoder"] = self.dense.encoder.identity()
            d["encoder_threads"] = self.dense.encoder.num_threads
        d["search_workers"] = self.workers
        return d


def on_gpus(index, kind: str, settings: Settings):
    """The dense index where it will be searched (Settings.gpu_search): faiss-gpu when it sees
    GPUs, else an exact torch search of a flat index on the CUDA GPUs, else the index as is."""
    import faiss

    faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if settings.gpu_search != "torch" and faiss_gpus:
        return to_gpus(index)
    from retriever_server.torch_search import TorchFlatIP, cuda_devices

    devices = cuda_devices()
    if kind == "flat" and (devices or settings.gpu_search == "torch"):
        return TorchFlatIP.from_faiss(index, devices or ["cpu"], settings.gpu_search_dtype)
    if settings.gpu_search == "faiss" or devices:
        log.warning("%s index on the CPU: faiss-gpu sees no GPU%s", kind,
                    "" if kind == "flat" else " (the torch search serves flat indexes only)")
    return index


def to_gpus(index):
    """faiss-gpu: shard the index across all visible GPUs. Thin on purpose (no GPU here to test)."""
    import faiss

    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        return index
    co = faiss.GpuMultipleClonerOptions()
    co.shard = True
    co.useFloat16 = True
    log.info("moving the FAISS index to %d GPUs (sharded)", faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index, co=co)


def load_backend(settings: Settings) -> Backend:
    """Open the configured index dir(s); raises IndexMismatch / FileNotFoundError / ValueError."""
    if not settings.index:
        raise ValueError("no index given (--index DIR)")
    if not settings.corpus:
        raise ValueError("no corpus given (--corpus corpus.jsonl)")
    metas = {d: read_meta(d) for d in settings.index}
    dense_dirs = [d for d, m in metas.items() if m["kind"] in DENSE_KINDS]
    bm25_dirs = [d for d, m in metas.items() if m["kind"] == "bm25"]
    kind = settings.kind
    if kind == "auto":
        kind = "hybrid" if dense_dirs and bm25_dirs else ("dense" if dense_dirs else "bm25")
    need_dense, need_bm25 = kind in ("dense", "hybrid"), kind in ("bm25", "hybrid")
    if (need_dense and len(dense_dirs) != 1) or (need_bm25 and len(bm25_dirs) != 1) or \
            len(settings.index) != need_dense + need_bm25:
        raise ValueError(f"kind {kind} needs {'one dense' if need_dense else ''}"
                         f"{' and ' if need_dense and need_bm25 else ''}{'one bm25' if need_bm25 else ''} "
                         f"index dir; got {[(d, m['kind']) for d, m in metas.items()]}")
    if kind == "hybrid":
        a, b = (metas[dense_dirs[0]]["corpus"]["sha256"], metas[bm25_dirs[0]]["corpus"]["sha256"])
        if a != b:
            raise IndexMismatch(f"hybrid: {dense_dirs[0]} and {bm25_dirs[0]} were built from different corpora")
    dense = bm25 = None
    workers = settings.search_workers or default_search_workers(kind)
    if need_dense:
        threads = settings.num_threads or max(1, cpu_threads() // workers)
        kwargs = {k: v for k, v in {"pooling": settings.pooling, "backend": settings.encoder_backend,
                                     "precision": settings.encoder_precision,
                                     "num_threads": threads}.items() if v is not None}
        dense = load_searcher(dense_dirs[0], settings.corpus, encoder=settings.encoder,
                              verify=settings.verify_corpus_hash, nprobe=settings.nprobe, mmap=settings.mmap_index,
                              ef_search=max(settings.ef_search, settings.max_topk), **kwargs)
        if settings.use_gpu:
            dense.index = on_gpus(dense.index, dense.kind, settings)
    if need_bm25:
        # the dense side already hashed the (same) corpus
        bm25 = load_searcher(bm25_dirs[0], settings.corpus, verify=settings.verify_corpus_hash and not need_dense)
    store = dense.store if dense is not None else bm25.store
    if dense is not None and bm25 is not None:
        bm25.store.close()
        bm25.store = store
    log.info("loaded %s backend over %d passages from %s", kind, len(store), Path(settings.corpus))
    return Backend(kind=kind, store=store, dense=dense, bm25=bm25, depth=settings.hybrid_depth,
                   rrf_k=settings.rrf_k, workers=workers)


def default_search_workers(kind: str) -> int:
    """Settings.search_workers' default: 2 for a dense backend whose encoder runs on a CPU of 2+
    cores, else 1."""
    return 2 if kind == "dense" and default_encoder_device() == "cpu" and cpu_threads() >= 2 else 1
