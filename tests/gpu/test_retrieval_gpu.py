"""The retrieval side on CUDA: the query/passage encoder against the CPU encoder, and the real
retriever server answering with a CUDA encoder over a FAISS index built with it (faiss-cpu
search: a faiss-gpu wheel needs CUDA 12 libraries that do not travel; docs/gpu.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def texts(passages) -> list[str]:
    return [p["contents"] for p in passages]


@pytest.fixture(scope="module")
def cpu_vectors(encoder_dir, texts) -> np.ndarray:
    """The reference: the same weights, torch fp32 on the CPU."""
    from data_prep.encoder import Encoder

    return Encoder(encoder_dir, backend="torch", precision="fp32", device="cpu").encode_passages(texts, progress=False)


# fp32 on the GPU differs from the CPU only in summation order; fp16 keeps 10 mantissa bits,
# bf16 7 (cosines measured on an H100 are in docs/gpu.md)
@pytest.mark.parametrize("precision,min_cos", [("fp32", 0.99999), ("fp16", 0.9995), ("bf16", 0.995)])
def test_cuda_encoder_matches_the_cpu_encoder(encoder_dir, texts, cpu_vectors, precision, min_cos):
    from data_prep.encoder import Encoder

    enc = Encoder(encoder_dir, backend="torch", precision=precision, device="cuda")
    vectors = enc.encode_passages(texts, progress=False)
    assert vectors.shape == cpu_vectors.shape and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    cos = (vectors * cpu_vectors).sum(1)
    assert cos.min() >= min_cos, f"{precision}: min cosine {cos.min():.6f} (mean {cos.mean():.6f})"
    # the neighbourhoods agree: each passage's nearest other passage is the same
    def nearest(v):
        s = v @ v.T
        np.fill_diagonal(s, -2)
        return s.argmax(1)
    agree = (nearest(vectors) == nearest(cpu_vectors)).mean()
    assert agree >= (0.999 if precision == "fp32" else 0.97), f"{precision}: nearest neighbour agreement {agree:.3f}"


def test_auto_precision_on_cuda_is_fp16_torch(encoder_dir):
    from data_prep.encoder import Encoder

    enc = Encoder(encoder_dir, device="cuda")
    assert (enc.backend, enc.precision) == ("torch", "fp16")
    assert next(enc._module.parameters()).device.type == "cuda"


def test_server_with_a_cuda_encoder_answers_like_the_cpu_search(encoder_dir, passages, tmp_path):
    """Index built on the GPU, served by the real server (auto: torch fp16 on CUDA), compared
    with the same index searched in-process with CPU fp32 query vectors."""
    import httpx

    from data_prep.encoder import Encoder
    from data_prep.indexing import build_index, load_searcher
    from retriever_server.launch import start_server, stop_server, wait_healthy

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in passages))
    meta = build_index(corpus, tmp_path / "flat", kind="flat", encoder=Encoder(encoder_dir, device="cuda"),
                       batch_size=256, progress=False)
    assert meta["num_passages"] == len(passages)
    # queries: each passage's title line, which should find the passage itself
    queries = [p["contents"].split("\n")[0].strip('"') + " history" for p in passages[:64]]
    cpu = load_searcher(tmp_path / "flat", corpus, encoder=Encoder(encoder_dir, backend="torch", precision="fp32",
                                                                   device="cpu"))
    want = cpu.search(queries, 5)

    proc, url = start_server(tmp_path / "flat", corpus, extra_args=["--encoder", encoder_dir, "--log-level", "warning"])
    try:
        wait_healthy(url, timeout=300, proc=proc)
        r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 5, "return_scores": True}, timeout=60)
        assert r.status_code == 200, r.text
        got = [[(d["document"]["id"], d["score"]) for d in row] for row in r.json()["result"]]
    finally:
        stop_server(proc)
    assert len(got) == len(queries)
    top1 = np.mean([g[0][0] == w[0][0] for g, w in zip(got, want)])
    assert top1 >= 0.95, f"top-1 agreement with the CPU search {top1:.3f}"
    gap = max(abs(gs - ws) for g, w in zip(got, want) for (gi, gs), (wi, ws) in zip(g, w) if gi == wi)
    assert gap < 5e-3, f"score difference up to {gap:.4f} for the same passage"
