"""Real retrievers for the benchmarks: over a small generated knowledge base, or over a
given corpus and index (built when missing)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def kb_retriever(prefix: str, n_entities: int = 200) -> Iterator[tuple[Path, str]]:
    """Generate a KB (seed 0) in a fresh temp dir, serve a BM25 index of it in its own
    process; yields (work dir with kb/, base URL), stops the server on exit and removes the
    work dir with what the benchmark wrote there (train.py's GRPO runs: ~2 GB of checkpoints)."""
    from data_prep.synthetic import generate_kb

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        generate_kb(work / "kb", seed=0, n_entities=n_entities)
        with serve_index(work / "index", work / "kb" / "corpus.jsonl", kind="bm25") as url:
            yield work, url


@contextmanager
def serve_index(index: Path, corpus: Path, kind: str = "flat", log_path: Path | None = None) -> Iterator[str]:
    """Serve `index` over `corpus` in its own process, building a `kind` index first when
    `index` has none; yields the base URL and stops the server on exit (also on errors)."""
    from retriever_server.launch import start_server, stop_server, wait_healthy

    if not (Path(index) / "meta.json").is_file():
        from data_prep.indexing import build_index

        build_index(corpus, index, kind=kind)
    proc, url = start_server(index, corpus, log_path=log_path)
    try:
        wait_healthy(url, timeout=300, proc=proc)
        yield url
    finally:
        stop_server(proc)
