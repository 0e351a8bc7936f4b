"""A real retriever over a small generated knowledge base, for the benchmarks that need one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def kb_retriever(prefix: str, n_entities: int = 200) -> Iterator[tuple[Path, str]]:
    """Generate a KB (seed 0) in a fresh temp dir, serve a BM25 index of it in its own
    process; yields (work dir with kb/, base URL) and stops the server on exit."""
    from data_prep.indexing import build_index
    from data_prep.synthetic import generate_kb
    from retriever_server.launch import start_server, stop_server, wait_healthy

    work = Path(tempfile.mkdtemp(prefix=prefix))
    generate_kb(work / "kb", seed=0, n_entities=n_entities)
    build_index(work / "kb" / "corpus.jsonl", work / "index", kind="bm25", progress=False)
    proc, url = start_server(work / "index", work / "kb" / "corpus.jsonl")
    try:
        wait_healthy(url, timeout=120, proc=proc)
        yield work, url
    finally:
        stop_server(proc)
