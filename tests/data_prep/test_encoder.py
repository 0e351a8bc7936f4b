"""Encoder: against sentence-transformers as the reference, and the fast default against fp32."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_prep.encoder import (BGE_QUERY_INSTRUCTION, Encoder, EncoderIdentity, default_pooling,
                               default_prefixes, resolve_model_path)

SENTENCES = ["Who wrote the novel Middlemarch?", "Middlemarch is a novel by George Eliot, published in 1871.",
             "The capital of Australia is Canberra.", "x", "A much longer sentence " * 20]


@pytest.fixture(scope="module")
def fp32():
    return Encoder("minilm", backend="torch", precision="fp32")


def test_default_resolves_to_packaged_minilm():
    p = resolve_model_path(None)
    assert p == resolve_model_path("minilm") and (p / "config.json").is_file()
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        resolve_model_path("intfloat/e5-base-v2")


def test_torch_fp32_matches_sentence_transformers(fp32):
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(resolve_model_path("minilm")), device="cpu").encode(
        SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    got = fp32.encode_passages(SENTENCES, batch_size=2, progress=False)
    assert got.dtype == np.float32 and got.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    # order is kept although batches are formed longest-first
    np.testing.assert_allclose(fp32.encode_queries(SENTENCES[::-1]), ref[::-1], atol=2e-5)


def test_cls_pooling_is_the_first_token(fp32):
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = str(resolve_model_path("minilm"))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        h = model(**tok(SENTENCES[:2], padding=True, return_tensors="pt")).last_hidden_state[:, 0]
    want = torch.nn.functional.normalize(h, dim=-1).numpy()
    cls = Encoder("minilm", backend="torch", precision="fp32", pooling="cls")
    np.testing.assert_allclose(cls.encode_queries(SENTENCES[:2]), want, atol=2e-5)
    assert cls.identity()["pooling"] == "cls"


@pytest.mark.parametrize("backend,precision", [("onnx", "int8"), ("onnx", "fp32"), ("torch", "bf16")])
def test_fast_variants_stay_close_to_fp32(backend, precision, fp32):
    e = Encoder("minilm", backend=backend, precision=precision)
    got, ref = e.encode_passages(SENTENCES, progress=False), fp32.encode_passages(SENTENCES, progress=False)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cos = (got * ref).sum(1)
    assert cos.min() > (0.9999 if precision == "fp32" else 0.97), cos
    # a clear retrieval case: the question finds its answer among the other sentences
    q = e.encode_queries([SENTENCES[0]])
    assert int(np.argmax(q @ got[1:].T)) == 0
    ident = e.identity()
    assert (ident["backend"], ident["precision"], ident["dim"]) == (backend, precision, 384)
    assert not EncoderIdentity.mismatches(ident, fp32.identity())


def test_default_is_the_fast_cpu_variant(monkeypatch):
    from data_prep import hardware

    monkeypatch.delenv(hardware.ENCODER_PRECISION_ENV, raising=False)  # the rule itself, not a forced run
    # int8 only where the CPU has int8 dot products (VNNI); fp32 ONNX elsewhere
    e = Encoder()
    assert (e.backend, e.precision) == ("onnx", "int8" if hardware.has_vnni() else "fp32")
    monkeypatch.setattr(hardware, "has_vnni", lambda info=None: True)
    assert Encoder().precision == "int8"
    monkeypatch.setattr(hardware, "has_vnni", lambda info=None: False)
    assert Encoder().precision == "fp32"
    assert e.identity()["name"] == "all-MiniLM-L6-v2"
    assert e.encode_queries([]).shape == (0, 384)


def test_prefix_and_pooling_conventions(tmp_path):
    for name, cfg in [("e5-base-v2", {}), ("bge-small-en-v1.5", {"pooling_mode_cls_token": True})]:
        d = tmp_path / name
        (d / "1_Pooling").mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    assert default_prefixes("e5-base-v2", tmp_path / "e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("bge-small-en-v1.5", tmp_path / "bge-small-en-v1.5") == (BGE_QUERY_INSTRUCTION, "")
    assert default_pooling(tmp_path / "bge-small-en-v1.5") == "cls"
    assert default_pooling(tmp_path / "e5-base-v2") == "mean"
    assert default_prefixes("all-MiniLM-L6-v2", resolve_model_path("minilm")) == ("", "")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="pooling"):
        Encoder("minilm", pooling="max")
    with pytest.raises(ValueError, match="bf16 needs backend torch"):
        Encoder("minilm", backend="onnx", precision="bf16")
    with pytest.raises(ValueError, match="int8 needs backend onnx"):
        Encoder("minilm", backend="torch", precision="int8")
    with pytest.raises(ValueError, match="fp16 needs backend torch"):
        Encoder("minilm", backend="onnx", precision="fp16")
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        Encoder("minilm", backend="torch", precision="fp16", device="cpu")


def test_onnx_threads_do_not_spin():
    """Beside a busy trainer the encoder's idle threads must sleep (issue #15): no spinning,
    one inter-op thread, intra-op threads bounded by the cores this process may use."""
    from data_prep.encoder import cpu_threads

    enc = Encoder("minilm", backend="onnx", precision="fp32")
    so = enc._session.get_session_options()
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.inter_op_num_threads == 1 and 1 <= so.intra_op_num_threads <= cpu_threads()


def test_query_sub_batches_give_the_same_vectors():
    """Queries are encoded in length-sorted passes of QUERY_BATCH (less padding when the
    retriever's batches grow with load); the vectors do not depend on the pass size."""
    from data_prep.encoder import QUERY_BATCH

    enc = Encoder("minilm", backend="onnx", precision="fp32")
    queries = [("why " * (i % 13 + 1)) + f"question {i}" for i in range(3 * QUERY_BATCH + 5)]
    a, b = enc.encode_queries(queries), enc.encode_queries(queries, batch_size=len(queries))
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-4)


def test_batches_are_sorted_by_tokens_not_characters():
    """Passages are batched by token count: characters mislead where words split unevenly
    (wiki_35k's batches of 256 were padded to 1.55x their tokens when sorted by characters).
    Hand counts with MiniLM's WordPiece: "internationalization" is 2 tokens in 20 characters,
    "7" one token in 1; [CLS] and [SEP] add 2 to each text."""
    enc = Encoder("minilm", backend="onnx", precision="fp32")
    texts = [" ".join(["internationalization"] * 9), " ".join(["internationalization"] * 8),
             " ".join(["7"] * 18), " ".join(["7"] * 16)]
    assert enc.tokenize.lengths(texts).tolist() == [20, 18, 20, 18]
    shapes = []
    run = enc._run
    enc._run = lambda batch: (shapes.append(batch["input_ids"].shape), run(batch))[1]
    vecs = enc.encode_passages(texts, batch_size=2, progress=False)
    # by characters: {20, 18} and {20, 18} tokens, both padded to 20 (80 slots for 76 tokens);
    # by tokens: {20, 20} and {18, 18}, no padding
    assert sorted(shapes) == [(2, 18), (2, 20)]
    enc._run = run
    alone = np.concatenate([enc.encode_passages([t], progress=False) for t in texts])
    assert np.allclose(vecs, alone, atol=1e-5)


# Batch independence (issue 27): a text's vector must not move with its batch mates or padding.
# fp32: different matmul blockings give ~1e-7, bound 1e-5. int8 and bf16 measure ~4e-8 and 0 here
# (AVX-512 and AVX2 kernels alike); bound 1e-3 leaves room for a rare rounding flip of one
# activation on other kernels, and fails what was there before: int8 with one activation scale per
# batch tensor (3e-2), bf16 over padded batches (1.6e-3 on these texts).
BATCH_BOUNDS = {"fp32": 1e-5, "int8": 1e-3, "bf16": 1e-3}
MIXED_QUERIES = ["who wrote middlemarch", "x", "What is the capital city of the Australian state of Victoria?",
                 "when did the 1906 san francisco earthquake happen and how many people died in it",
                 "Which band released the album OK Computer in 1997 and what was its lead single?",
                 "how tall is mount everest", "ZZZZ 99999 ~~~~ [[[", "Élan vital — Henri Bergson's term"]


def _mates(texts: list[str]) -> list[str]:
    """Batch mates that change both the padded length and the activation ranges."""
    return (["supercalifragilistic " * 40, "0 0 0 0"] + [t.upper() + " " + t for t in texts]
            + ["the the the", "1,234,567.89 % $ €"])


@pytest.mark.parametrize("backend,precision", [("onnx", "fp32"), ("onnx", "int8"), ("torch", "fp32"),
                                               ("torch", "bf16")])
def test_vectors_do_not_depend_on_batch_mates(backend, precision):
    e = Encoder("minilm", backend=backend, precision=precision)
    bound = BATCH_BOUNDS[precision]
    for texts, encode in ((MIXED_QUERIES, e.encode_queries),
                          (SENTENCES, lambda t, **kw: e.encode_passages(t, progress=False, **kw))):
        alone = np.concatenate([encode([t]) for t in texts])
        batched = encode(texts, batch_size=len(texts))
        reordered = encode(texts[::-1], batch_size=3)[::-1]
        with_mates = encode(_mates(texts) + texts, batch_size=64)[-len(texts):]
        for name, got in (("batched", batched), ("reordered", reordered), ("with mates", with_mates)):
            diff = float(np.abs(got - alone).max())
            assert diff <= bound, f"{backend}/{precision} {name}: max |diff| {diff:.2e} > {bound:.0e}"


def test_16_bit_passes_hold_equal_lengths_only():
    """bf16/fp16 forward passes never pad: a pass holds texts of one token count (longest first,
    at most batch_size); fp32/int8 passes are length-sorted batches of batch_size. Token counts
    with [CLS] and [SEP]: "a b c d" 6, "a b c" 5, "a b" 4, "a" 3."""
    texts = ["a b c", "a b", "a b c", "a", "a b c d", "a b", "a b c"]
    assert Encoder("minilm", backend="torch", precision="bf16")._batches(texts, 2) == [[4], [0, 2], [6], [1, 5], [3]]
    assert Encoder("minilm", backend="torch", precision="fp32")._batches(texts, 3) == [[4, 0, 2], [6, 1, 5], [3]]
