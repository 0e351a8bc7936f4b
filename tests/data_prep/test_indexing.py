"""Index building for every kind on a tiny corpus made here, resume, metadata checks, the store."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from data_prep.indexing import (IndexMismatch, build_index, check_index, ivfpq_params, load_searcher,
                                read_meta)
from data_prep.io import Report
from data_prep.store import PassageStore, scan_corpus, sha256_file

FACTS = [
    ("Harbor of Quillmoss", "The harbor of Quillmoss freezes every January, so the fishing fleet of the town winters "
     "in the southern port of Amberlay.", "Where does the Quillmoss fleet spend the winter?"),
    ("Brontide organ", "The brontide organ in the cathedral of Velmora has 4,200 pipes and imitates distant thunder "
     "with a 64-foot bass register.", "How many pipes does the brontide organ have?"),
    ("Saffronel tea", "Saffronel tea is brewed from dried marigold petals and black cardamom by the hill people of "
     "Oskari.", "What is saffronel tea brewed from?"),
    ("Lumen Crater", "Lumen Crater on the far side of the Moon was named after the astronomer Hedda Lumen, who "
     "charted it in 1968.", "Who was Lumen Crater named after?"),
    ("Grimsby Wolfhound", "The Grimsby wolfhound is a shaggy dog breed used to guard sheep from bears in the "
     "Carpathian foothills.", "What does the Grimsby wolfhound guard sheep from?"),
]


def write_corpus(path, n_fill: int = 75, blank_lines: bool = False):
    rng = random.Random(1)
    rows = [{"id": f"k{i}", "contents": f'"{t}"\n{b}'} for i, (t, b, _) in enumerate(FACTS)]
    things = ["tower", "orchard", "fair", "abbey", "quarry", "ferry", "school", "brewery"]
    for i in range(n_fill):
        t = rng.choice(things)
        rows.append({"id": str(100 + i), "contents": f'"Old {t} {i}"\nThe old {t} number {i} opened in '
                                                     f'{rng.randint(1500, 1990)} and is still in use.'})
    with open(path, "w") as f:
        for j, r in enumerate(rows):
            f.write(json.dumps(r) + "\n")
            if blank_lines and j % 17 == 0:
                f.write("\n  \n")  # blank lines are not passages
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "corpus.jsonl"
    return path, write_corpus(path)


@pytest.fixture(scope="module")
def enc():
    from data_prep.encoder import Encoder

    return Encoder("minilm")


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq", "bm25"])
def test_build_and_search_every_kind(kind, corpus, enc, tmp_path):
    path, rows = corpus
    meta = build_index(path, tmp_path / kind, kind=kind, encoder=None if kind == "bm25" else enc,
                       batch_size=32, progress=False)
    on_disk = read_meta(tmp_path / kind)
    assert on_disk == meta and meta["kind"] == kind and meta["num_passages"] == len(rows)
    assert meta["corpus"]["sha256"] == sha256_file(path)
    if kind != "bm25":
        assert meta["dim"] == 384 and meta["metric"] == "inner_product"
        assert meta["encoder"]["name"] == "all-MiniLM-L6-v2" and meta["encoder"]["pooling"] == "mean"
    assert not list(tmp_path.glob(".*"))  # no temporary / partial dirs left behind
    s = load_searcher(tmp_path / kind, path, encoder=None if kind == "bm25" else enc, nprobe=8)
    res = s.search([q for _, _, q in FACTS], 3)
    top1 = [r[0][0] for r in res]
    if kind == "ivfpq":  # PQ codes are lossy: the right passage must be in the top 3
        assert all(f"k{i}" in [pid for pid, _ in r] for i, r in enumerate(res)), res
    else:
        assert top1 == [f"k{i}" for i in range(len(FACTS))], res
    assert all(r[0][1] >= r[1][1] >= r[2][1] for r in res)
    # topk larger than the corpus: every passage at most once, no padding rows (-1) leak out
    everything = [pid for pid, _ in s.search(["tower"], 500)[0]]
    assert len(set(everything)) == len(everything) and set(everything) <= {r["id"] for r in rows}
    if kind != "hnsw":  # the HNSW graph walk may not reach every node: approximate by design
        assert len(everything) == len(rows)


def test_ivfpq_defaults_fit_tiny_and_large_corpora():
    assert ivfpq_params(80, 384, None, None, None) == {"nlist": 2, "pq_m": 48, "pq_nbits": 6}
    assert ivfpq_params(21_000_000, 768, None, None, None) == {"nlist": 18330, "pq_m": 96, "pq_nbits": 8}
    with pytest.raises(ValueError, match="must divide"):
        ivfpq_params(1000, 384, None, 50, None)


def test_interrupted_build_resumes_from_shards(corpus, enc, tmp_path, monkeypatch):
    path, rows = corpus
    out = tmp_path / "flat"
    calls = []
    real = enc.encode_passages

    def counting(texts, **kw):
        texts = list(texts)
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the build dies while encoding the third shard
        return real(texts, **kw)

    monkeypatch.setattr(enc, "encode_passages", counting)
    with pytest.raises(KeyboardInterrupt):
        build_index(path, out, kind="flat", encoder=enc, shard_size=16, progress=False)
    assert not out.exists() and len(list((tmp_path / ".flat.partial").glob("emb_*.npy"))) == 2
    calls.clear()

    def recording(texts, **kw):
        calls.append(len(texts))
        return real(texts, **kw)

    monkeypatch.setattr(enc, "encode_passages", recording)
    build_index(path, out, kind="flat", encoder=enc, shard_size=16, progress=False)
    assert sum(calls) == len(rows) - 32  # the two finished shards were not encoded again
    s = load_searcher(out, path, encoder=enc)
    fresh = enc.encode_passages([r["contents"] for r in rows], progress=False)
    import faiss

    stored = faiss.read_index(str(out / "index.faiss")).reconstruct_n(0, len(rows))
    # the rows are the passages in corpus order; int8 activations are quantised per batch, so
    # other batch mates shift values a little: compare directions
    assert float(np.min(np.sum(stored * fresh, axis=1))) > 0.99
    assert s.search([FACTS[2][2]], 1)[0][0][0] == "k2"
    assert not (tmp_path / ".flat.partial").exists()


def test_check_index_names_what_differs(corpus, enc, tmp_path):
    path, rows = corpus
    build_index(path, tmp_path / "i", kind="flat", encoder=enc, progress=False)
    ident = enc.identity()
    assert check_index(tmp_path / "i", path, ident)["num_passages"] == len(rows)
    other = tmp_path / "other.jsonl"
    write_corpus(other, n_fill=74)
    with pytest.raises(IndexMismatch, match="corpus mismatch"):
        check_index(tmp_path / "i", other, ident)
    with pytest.raises(IndexMismatch, match="encoder mismatch.*query_prefix: index='' server='query: '"):
        check_index(tmp_path / "i", path, {**ident, "query_prefix": "query: "})
    # precision / backend do not change what the vectors mean: not a mismatch
    check_index(tmp_path / "i", path, {**ident, "precision": "fp32", "backend": "torch"})
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        check_index(tmp_path, path, ident)


def test_store_random_access_and_blank_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = write_corpus(path, n_fill=300, blank_lines=True)
    offsets, sha = scan_corpus(path)
    assert len(offsets) == len(rows) + 1 and sha == sha256_file(path)
    np.save(tmp_path / "offsets.npy", offsets)
    with PassageStore(path, tmp_path / "offsets.npy") as store:
        assert len(store) == len(rows)
        rng = np.random.default_rng(0)
        for i in rng.integers(0, len(rows), 50):
            assert store.get(i) == rows[i]
        idx = [0, len(rows) - 1, 7, 7]
        assert store.get_many(idx) == [rows[i] for i in idx]
        with pytest.raises(IndexError):
            store.get(len(rows))
    # a last line without newline still counts, chunk boundaries do not matter
    path.write_bytes(path.read_bytes().rstrip(b"\n \t"))
    import data_prep.store as st

    old = st._CHUNK
    st._CHUNK = 97
    try:
        offsets2, _ = scan_corpus(path)
    finally:
        st._CHUNK = old
    assert len(offsets2) == len(rows) + 1
    with PassageStore(path, offsets2) as store:
        assert store.get(len(rows) - 1) == rows[-1] and store.get(1) == rows[1]
    with pytest.raises(ValueError, match="corpus changed"):
        PassageStore(path, offsets)


def test_build_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_index(tmp_path / "missing.jsonl", tmp_path / "x")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no passages"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "x", kind="bm25")
    with pytest.raises(ValueError, match="kind must be"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "x", kind="annoy")


def test_cli_index(corpus, tmp_path, capsys):
    from data_prep.cli import main

    path, rows = corpus
    assert main(["index", "--corpus", str(path), "--out", str(tmp_path / "b"), "--kind", "bm25"]) == 0
    assert f"bm25 over {len(rows)} passages" in capsys.readouterr().out
    assert main(["index", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "c")]) == 2
    assert "does not exist" in capsys.readouterr().out


def test_out_is_replaced_only_when_it_is_an_index(corpus, tmp_path, capsys):
    """`index --out DIR` used to move any existing DIR aside and delete it: a user's
    directory (or file) given by mistake is refused now, an index built before is replaced."""
    from data_prep.cli import main

    path, rows = corpus
    out = tmp_path / "idx"
    build_index(path, out, kind="bm25", progress=False)
    build_index(path, out, kind="bm25", progress=False)  # ours: rebuilt in place
    assert read_meta(out)["num_passages"] == len(rows) and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    (tmp_path / "empty").mkdir()
    build_index(path, tmp_path / "empty", kind="bm25", progress=False)  # nothing in it to lose
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"mine exists and is a directory not written by this tool"):
        build_index(path, user, kind="bm25", progress=False)
    assert main(["index", "--corpus", str(path), "--out", str(user), "--kind", "bm25"]) == 2
    assert f"{user} exists" in capsys.readouterr().out
    assert [f.name for f in user.iterdir()] == ["notes.txt"] and (user / "notes.txt").read_text() == "keep me"
    assert not list(tmp_path.glob(".*"))


def _with_bad_lines(path, rows) -> list[str]:
    """Write `rows` with bad lines between them (BOM, CRLF); return the expected problems
    (the JSON syntax error only as far as its reason's first words)."""
    bad = {2: (b'{"id": "x", "contents": "caf\xe9"}', "invalid UTF-8 at byte 29 (0xe9)"),
           20: (b'{"id": "t", "conte', "invalid JSON"), 41: (b'{"id": "m"}', "missing field 'contents'"),
           60: (b'{"id": [1], "contents": "c"}', "'id' must be a string or integer"),
           77: (b"[1, 2]", "expected a JSON object, got list")}
    out, problems, lineno = bytearray(b"\xef\xbb\xbf"), [], 0
    for i, r in enumerate(rows):
        if i in bad:
            lineno += 1
            out += bad[i][0] + b"\r\n"
            problems.append(f"{path}:{lineno}: {bad[i][1]}")
        lineno += 1
        out += json.dumps(r).encode() + b"\r\n"
    path.write_bytes(bytes(out))
    return problems


def test_bad_corpus_lines_are_skipped_and_the_build_resumes(corpus, enc, tmp_path, monkeypatch):
    """Bad lines midway are reported and get no row; a build interrupted after them resumes
    from its shards (the same lines are left out again) and every search hit is a good row."""
    _, rows = corpus
    path = tmp_path / "bad.jsonl"
    expected = _with_bad_lines(path, rows)
    out, calls, real = tmp_path / "flat", [], enc.encode_passages

    def counting(texts, **kw):
        texts = list(texts)
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(texts, **kw)

    monkeypatch.setattr(enc, "encode_passages", counting)
    with pytest.raises(KeyboardInterrupt):
        build_index(path, out, kind="flat", encoder=enc, shard_size=16, progress=False)
    calls.clear()
    monkeypatch.setattr(enc, "encode_passages", lambda texts, **kw: calls.append(len(texts)) or real(texts, **kw))
    report = Report()
    meta = build_index(path, out, kind="flat", encoder=enc, shard_size=16, progress=False, report=report)
    assert sum(calls) == len(rows) - 32  # the two shards from before the interruption were kept
    assert [p[:len(e)] for p, e in zip(report.problems, expected)] == expected
    assert (report.read, report.written, report.skipped) == (len(rows) + 5, len(rows), 5)
    assert meta["num_passages"] == len(rows) and meta["corpus"]["lines_skipped"] == 5
    s = load_searcher(out, path, encoder=enc)
    assert [r[0][0] for r in s.search([q for _, _, q in FACTS], 1)] == [f"k{i}" for i in range(len(FACTS))]
    assert {pid for pid, _ in s.search(["old tower"], len(rows))[0]} <= {r["id"] for r in rows}
    assert [s.store.get(i) for i in range(len(rows))] == rows


def test_cli_reports_skipped_corpus_lines(corpus, tmp_path, capfd):
    from data_prep.cli import main

    _, rows = corpus
    path = tmp_path / "bad.jsonl"
    expected = _with_bad_lines(path, rows)
    assert main(["index", "--corpus", str(path), "--out", str(tmp_path / "b"), "--kind", "bm25"]) == 0
    out, err = capfd.readouterr()
    assert f"bm25 over {len(rows)} passages" in out and f"read {len(rows) + 5}, written {len(rows)}, skipped 5" in out
    assert expected[0] in err and "skipped corpus lines (5)" in err


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_memory_mapped_index_searches_like_a_copied_one(tmp_path, kind):
    """load_faiss_file(mmap=True) picks the FAISS flag that applies (IVF lists vs flat codes;
    the two do not combine) and answers exactly as the copied index."""
    import faiss

    from data_prep.indexing import load_faiss_file

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    if kind == "flat":
        index = faiss.IndexFlatIP(32)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(32, 16, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(32), 32, 16, 8, 6, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
    index.add(x)
    path = tmp_path / "index.faiss"
    faiss.write_index(index, str(path))
    copied, mapped = load_faiss_file(path), load_faiss_file(path, mmap=True)
    for ix in (copied, mapped):
        if kind == "ivfpq":
            faiss.downcast_index(ix).nprobe = 4
    a, b = copied.search(x[:20], 5), mapped.search(x[:20], 5)
    assert np.array_equal(a[1], b[1]) and np.allclose(a[0], b[0])


@pytest.mark.parametrize("backend,precision", [("onnx", "int8"), ("onnx", "fp32"), ("torch", "bf16")])
def test_index_vectors_do_not_depend_on_batching(backend, precision, corpus, tmp_path):
    """The same corpus built with two batch sizes and shard sizes stores the same vectors (issue
    27: int8 with one activation scale per batch moved a passage's vector with its shard mates by
    ~3e-2). fp32 and int8: 1e-5, fp32 rounding of the non-integer ops (measured ~4e-8). bf16: one
    bf16 step at 1.0 (2^-8 = 3.9e-3): on AMX hosts oneDNN blocks a bf16 GEMM by its row count
    (measured 1.0e-3 there, 0 on AVX2 and on an AVX-512 EPYC without AMX); the per-batch-scale
    bug moved vectors by 3e-2, eight times this bound. bf16 over padded batches (2e-3) is kept out
    by construction and checked in test_encoder (test_16_bit_passes_hold_equal_lengths_only)."""
    import faiss

    from data_prep.encoder import Encoder

    enc = Encoder("minilm", backend=backend, precision=precision)
    vecs = []
    for batch, shard in ((7, 16), (64, 1000)):
        build_index(corpus[0], tmp_path / f"b{batch}", kind="flat", encoder=enc, batch_size=batch, shard_size=shard,
                    progress=False)
        index = faiss.read_index(str(tmp_path / f"b{batch}" / "index.faiss"))
        vecs.append(index.reconstruct_n(0, index.ntotal))
    assert vecs[0].shape == (len(corpus[1]), 384)
    assert float(np.abs(vecs[0] - vecs[1]).max()) <= (2.0 ** -8 if precision == "bf16" else 1e-5)


FAKE_JAX = '''
import os
def _record(what):
    with open(os.environ["FAKE_JAX_LOG"], "a") as f:
        f.write(f"{what} {os.environ.get('JAX_PLATFORMS', '<unset>')}\\n")
_record("import")
'''
FAKE_JAX_LAX = '''
import numpy as np
from jax import _record
def top_k(x, k):
    _record("top_k")
    x = np.asarray(x)
    idx = np.argsort(-x, kind="stable")[:k]
    return x[idx], idx
'''


@pytest.mark.parametrize("user_choice", [None, "cuda"])
def test_bm25_keeps_jax_off_the_gpu_unless_the_user_chose(user_choice, corpus, tmp_path):
    """bm25s runs a JAX top-k at import wherever JAX is installed; on a CUDA machine JAX then
    takes 75% of the GPU in the index builder and the retriever, and vLLM beside them finds
    under 1 GiB free. A stand-in `jax` records the platform JAX would start on, in a fresh
    process that builds and searches a BM25 index as `agent-rl-prep index` and the server do."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    (fake / "jax" / "lax.py").write_text(FAKE_JAX_LAX)
    path, _ = corpus
    log = tmp_path / "jax.log"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(FAKE_JAX_LOG=str(log), PYTHONPATH=os.pathsep.join([str(fake), str(root)]))
    if user_choice:
        env["JAX_PLATFORMS"] = user_choice
    code = ("import sys; from data_prep.indexing import build_index, load_searcher; "
            f"build_index({str(path)!r}, {str(tmp_path / 'bm25')!r}, kind='bm25', progress=False); "
            f"s = load_searcher({str(tmp_path / 'bm25')!r}, {str(path)!r}); "
            f"print(s.search([{FACTS[0][2]!r}], 3)[0][0][0])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "k0"  # the stand-in's top-k served the search
    lines = log.read_text().split()
    assert lines[:2] == ["import", user_choice or "cpu"] and "top_k" in lines
    assert set(lines[1::2]) == {user_choice or "cpu"}
