"""Exact inner-product search in torch, sharded over devices: the flat index on GPUs where
faiss-gpu cannot be installed (no wheel for the CUDA, the Python or the platform in use).

`TorchFlatIP` answers faiss's `search(x, k) -> (scores, rows)`, so `DenseSearcher` uses it as
it uses a faiss index. The passage vectors are split into one shard per device and stored in
fp16 / bf16 (half a flat fp32 index's memory: wiki-18's 21M x 768 is 32 GB instead of 64);
each shard is scanned in chunks (a bounded score matrix) for its top `k + margin` candidates,
and the candidates of every shard are then scored again in fp32 against the index's own fp32
vectors on the host, so the ranking and the scores are faiss-cpu flat's (a candidate that the
reduced precision would push out of the top k + margin is the one way to differ: a near-tie
at the cut).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

log = logging.getLogger(__name__)
MARGIN = 16
"""Extra candidates per shard taken in reduced precision before the exact fp32 re-scoring."""


def flat_vectors(index) -> np.ndarray:
    """The fp32 vectors of a faiss IndexFlatIP (a view, no copy where faiss allows it)."""
    import faiss

    base = faiss.downcast_index(index)
    if not isinstance(base, faiss.IndexFlat) or base.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"torch search needs a flat inner-product index, got {type(base).__name__}")
    return faiss.rev_swig_ptr(base.get_xb(), base.ntotal * base.d).reshape(base.ntotal, base.d)


class TorchFlatIP:
    """Exact top-k inner product over `vectors` (n, d) float32, one shard per device."""

    def __init__(self, vectors: np.ndarray, devices: Sequence[str] = ("cuda",), dtype: str = "float16",
                 chunk_rows: int = 1 << 20):
        import torch

        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # the host copy for exact scores
        self.ntotal, self.d = self.vectors.shape
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        self.chunk_rows = chunk_rows
        bounds = np.linspace(0, self.ntotal, len(devices) + 1).astype(int)
        self.shards = [(int(lo), torch.from_numpy(self.vectors[lo:hi]).to(dev, self.dtype))
                       for dev, lo, hi in zip(devices, bounds, bounds[1:]) if hi > lo]
        self.owner = None  # what holds the memory of `vectors`, kept alive (from_faiss)
        log.info("torch flat search: %d vectors x %d over %s in %s", self.ntotal, self.d, list(devices), dtype)

    @classmethod
    def from_faiss(cls, index, devices: Sequence[str], dtype: str = "float16") -> "TorchFlatIP":
        """Over a faiss IndexFlatIP's own vectors (mapped from its file, not copied): the index
        is kept alive with it, since its memory is the host copy."""
        out = cls(flat_vectors(index), devices, dtype)
        out.owner = index
        return out

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        x = np.ascontiguousarray(x, dtype=np.float32)
        if k <= 0 or self.ntotal == 0:
            return np.full((len(x), k), -np.inf, np.float32), np.full((len(x), k), -1, np.int64)
        cands = []
        with torch.inference_mode():
            for offset, shard in self.shards:
                q = torch.from_numpy(x).to(shard.device, self.dtype)
                take = min(k + MARGIN, len(shard))
                best_s, best_r = None, None
                for lo in range(0, len(shard), self.chunk_rows):
                    s = (q @ shard[lo:lo + self.chunk_rows].T).float()
                    top = torch.topk(s, min(take, s.shape[1]), dim=1)
                    rows = top.indices + lo
                    if best_s is not None:  # merge with the best of the earlier chunks
                        s_all, r_all = torch.cat([best_s, top.values], 1), torch.cat([best_r, rows], 1)
                        keep = torch.topk(s_all, min(take, s_all.shape[1]), dim=1).indices
                        best_s, best_r = s_all.gather(1, keep), r_all.gather(1, keep)
                    else:
                        best_s, best_r = top.values, rows
                cands.append(best_r.cpu().numpy() + offset)
        rows = np.concatenate(cands, axis=1)
        # exact fp32 scores of the candidates, then the top k by them (ties: the lower row, as faiss)
        exact = np.einsum("qd,qcd->qc", x, self.vectors[rows])
        order = np.lexsort((rows, -exact), axis=1)[:, :k]
        out_rows = np.take_along_axis(rows, order, 1)
        out_scores = np.take_along_axis(exact, order, 1).astype(np.float32)
        if out_rows.shape[1] < k:  # fewer vectors than k: faiss pads with -1
            pad = k - out_rows.shape[1]
            out_rows = np.pad(out_rows, ((0, 0), (0, pad)), constant_values=-1)
            out_scores = np.pad(out_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        return out_scores, out_rows.astype(np.int64)


def cuda_devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
