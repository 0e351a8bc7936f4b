"""The exact torch search (GPUs without faiss-gpu) against faiss-cpu flat, on the CPU: the
same shards, dtypes and chunked top-k code that runs on CUDA devices."""

from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from retriever_server.torch_search import TorchFlatIP, flat_vectors  # noqa: E402


def unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shards,chunk_rows", [(1, 1 << 20), (3, 97)])
def test_same_results_as_faiss_flat(dtype, shards, chunk_rows):
    xb, xq = unit(2000, 64, 0), unit(50, 64, 1)
    index = faiss.IndexFlatIP(64)
    index.add(xb)
    want_s, want_r = index.search(xq, 10)
    got_s, got_r = TorchFlatIP(flat_vectors(index), ["cpu"] * shards, dtype, chunk_rows=chunk_rows).search(xq, 10)
    assert got_r.dtype == np.int64 and got_s.dtype == np.float32 and got_r.shape == (50, 10)
    # random unit vectors have no exact ties: the same ids in the same order, fp32 scores
    assert (got_r == want_r).all()
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


def test_near_duplicates_are_ranked_by_exact_scores():
    """Vectors that fp16 cannot tell apart are ranked by their fp32 scores (the re-scoring)."""
    base = unit(1, 32, 2)[0]
    xb = np.stack([base + 1e-4 * i * unit(1, 32, 10 + i)[0] for i in range(40)]).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(32)
    index.add(xb)
    want_s, want_r = index.search(base[None], 5)
    got_s, got_r = TorchFlatIP(flat_vectors(index), ["cpu", "cpu"], "float16").search(base[None], 5)
    np.testing.assert_allclose(got_s, want_s, atol=1e-6)
    assert set(got_r[0]) == set(want_r[0]) or np.allclose(np.sort(got_s), np.sort(want_s), atol=1e-6)


def test_more_k_than_vectors_pads_like_faiss_and_refuses_other_indexes():
    xb = unit(3, 8, 3)
    index = faiss.IndexFlatIP(8)
    index.add(xb)
    s, r = TorchFlatIP(flat_vectors(index), ["cpu", "cpu"]).search(xb[:2], 5)
    assert (r[:, 3:] == -1).all() and (r[:, 0] == [0, 1]).all() and sorted(r[0, :3]) == [0, 1, 2]
    with pytest.raises(ValueError, match="flat inner-product"):
        flat_vectors(faiss.IndexFlatL2(8))


def test_the_server_serves_through_torch_search(flat_index, tiny_corpus, needles):
    """gpu_search=torch through the real backend loader: the same passages as faiss-cpu."""
    from retriever_server.backends import load_backend
    from retriever_server.settings import Settings
    from retriever_server.torch_search import TorchFlatIP

    base = dict(index=[str(flat_index)], corpus=str(tiny_corpus), encoder_precision="fp32")
    plain = load_backend(Settings(**base, use_gpu=False))
    torch_b = load_backend(Settings(**base, gpu_search="torch"))
    assert isinstance(torch_b.dense.index, TorchFlatIP)
    questions = [q for _, _, q in needles]
    a, b = plain.search(questions, 5), torch_b.search(questions, 5)
    assert [[r for r, _ in h] for h in a] == [[r for r, _ in h] for h in b]
    np.testing.assert_allclose([[s for _, s in h] for h in a], [[s for _, s in h] for h in b], atol=1e-5)
