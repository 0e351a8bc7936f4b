"""Backends (in-process, real indexes), reciprocal-rank fusion, and index/corpus/encoder checks."""

from __future__ import annotations

import json
import shutil

import pytest

from retriever_server.backends import load_backend, rrf_fuse
from retriever_server.settings import Settings


def test_rrf_hand_computed():
    # doc 7: ranks 1 and 3 -> 1/61 + 1/63; doc 3: ranks 2 and 1 -> 1/62 + 1/61; doc 9: rank 2 only
    fused = rrf_fuse([[7, 3, 5], [3, 9, 7]], k=60, topk=4)
    want = {7: 1 / 61 + 1 / 63, 3: 1 / 62 + 1 / 61, 5: 1 / 63, 9: 1 / 62}
    assert [r for r, _ in fused] == [3, 7, 9, 5]
    for r, s in fused:
        assert s == pytest.approx(want[r])
    assert rrf_fuse([[1, 2], [2, 1]], k=60, topk=1) == [(1, pytest.approx(1 / 61 + 1 / 62))]  # tie: lower row


@pytest.mark.parametrize("kind", ["bm25", "hybrid"])
def test_bm25_and_hybrid_find_the_needle(kind, flat_index, bm25_index, tiny_corpus, needles):
    dirs = [str(bm25_index)] if kind == "bm25" else [str(flat_index), str(bm25_index)]
    backend = load_backend(Settings(index=dirs, corpus=str(tiny_corpus)))
    assert backend.kind == kind
    questions = [q for _, _, q in needles]
    hits = backend.search(questions, 3)
    for i, h in enumerate(hits):
        assert len(h) == 3
        assert backend.docs(h)[0][0]["id"] == f"n{i}", questions[i]
    # a smaller topk is a prefix of a larger one (what the micro-batcher relies on)
    assert [r for r, _ in backend.search(questions[:2], 1)[0]] == [r for r, _ in hits[0][:1]]


def test_kind_inference_and_bad_combinations(flat_index, bm25_index, tiny_corpus):
    with pytest.raises(ValueError, match="needs one dense and one bm25"):
        load_backend(Settings(index=[str(flat_index)], corpus=str(tiny_corpus), kind="hybrid"))
    with pytest.raises(ValueError, match="no index"):
        load_backend(Settings(index=[], corpus=str(tiny_corpus)))


def _changed_corpus(tiny_corpus, tmp_path, same_size: bool):
    rows = [json.loads(line) for line in open(tiny_corpus)]
    if same_size:  # same byte count, one letter changed: only the hash can tell
        rows[5]["contents"] = rows[5]["contents"].replace("a", "e", 1)
    else:
        rows.append({"id": "extra", "contents": '"Extra"\nOne more passage.'})
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mismatched_index_refused_in_process(flat_index, tiny_corpus, tmp_path):
    from data_prep.indexing import IndexMismatch

    grown = _changed_corpus(tiny_corpus, tmp_path, same_size=False)
    with pytest.raises(IndexMismatch, match="corpus mismatch.*200 passages"):
        load_backend(Settings(index=[str(flat_index)], corpus=str(grown)))
    (tmp_path / "b").mkdir()
    edited = _changed_corpus(tiny_corpus, tmp_path / "b", same_size=True)
    with pytest.raises(IndexMismatch, match="sha256"):
        load_backend(Settings(index=[str(flat_index)], corpus=str(edited)))
    with pytest.raises(IndexMismatch, match="encoder mismatch.*pooling: index='mean' server='cls'"):
        load_backend(Settings(index=[str(flat_index)], corpus=str(tiny_corpus), pooling="cls"))


@pytest.mark.slow
def test_server_process_refuses_mismatch_with_message(flat_index, tiny_corpus, tmp_path):
    from retriever_server.launch import start_server, stop_server, wait_healthy

    grown = _changed_corpus(tiny_corpus, tmp_path, same_size=False)
    # a copy of the model under another name is another encoder as far as the index knows
    from data_prep.encoder import resolve_model_path

    other = tmp_path / "other-encoder"
    shutil.copytree(resolve_model_path("minilm"), other)
    cases = [
        ((flat_index, grown, []), "corpus mismatch"),
        ((flat_index, tiny_corpus, ["--encoder", str(other)]), "encoder mismatch: index"),
    ]
    for (idx, corpus, extra), words in cases:
        proc, url = start_server(idx, corpus, extra_args=extra + ["--log-level", "warning"])
        try:
            with pytest.raises(RuntimeError) as err:
                wait_healthy(url, timeout=180, proc=proc)
            assert proc.returncode == 2
            assert "refusing to start" in str(err.value) and words in str(err.value), str(err.value)
        finally:
            stop_server(proc)
    assert "name: index='all-MiniLM-L6-v2' server='other-encoder'" in str(err.value)


def _strict_json(body: bytes):
    """RFC 8259 JSON only: NaN, Infinity and -Infinity (which Python's json reads) are errors."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


def test_non_finite_numbers_in_a_corpus_are_sent_as_null(tmp_path):
    """Issue 83 case 16: Python's json reads NaN / Infinity in a corpus line and wrote them back
    into /retrieve's answer (`"year":NaN`), which strict parsers (JavaScript, Go, Rust, orjson)
    refuse. They are sent as null, the other fields as they are; so is a non-finite score."""
    import httpx

    from data_prep.indexing import build_index
    from retriever_server.app import create_app
    from retriever_server.launch import ServerThread

    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "nan", "contents": '"Nan"\nthe moth of nowhere', "year": float("nan"),
             "meta": {"w": [1.5, float("inf"), {"x": -float("inf")}], "ok": "yes"}},
            {"id": "fine", "contents": '"Fine"\na lighthouse on an island', "year": 1873}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes NaN
    build_index(corpus, tmp_path / "bm25", kind="bm25", progress=False)
    settings = Settings(index=[str(tmp_path / "bm25")], corpus=str(corpus))
    with ServerThread(create_app(settings)) as srv:
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": ["moth nowhere", "lighthouse island"], "topk": 1},
                       timeout=30)
    assert r.status_code == 200, r.text
    result = _strict_json(r.content)["result"]
    assert result[0][0]["document"] == {"id": "nan", "contents": rows[0]["contents"], "year": None,
                                        "meta": {"w": [1.5, None, {"x": None}], "ok": "yes"}}
    assert result[1][0]["document"] == rows[1]
    backend = load_backend(settings)
    out = _strict_json(backend.result_json([[(0, float("nan")), (1, float("-inf")), (1, 0.25)]], True))
    assert [d["score"] for d in out["result"][0]] == [None, None, 0.25]
