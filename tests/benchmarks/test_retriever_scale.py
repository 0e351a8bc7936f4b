"""benchmarks/retriever_scale.py --quick as a smoke test: every index kind is built, probed in
its own process, shared through mmap, extrapolated, and the figures are sane (exact search is
exact, HNSW near-exact, the refine step beats PQ alone, the store returns the right passages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_rl.demo.records import read_record

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_measures_every_kind(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "retriever_scale.py"), "--quick",
                           "--json", str(out),
                           "--record-dir", str(tmp_path / "record")], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("[hardware] ")
    res = json.loads(out.read_text())
    rec = read_record(tmp_path / "record")  # its record: command, host, the full JSON beside it
    assert rec.benchmark == "benchmarks/retriever_scale.py" and "--record-dir" in rec.command and rec.headline
    assert "retriever_scale.json" in rec.files and (tmp_path / "record" / "retriever_scale.json").is_file()
    assert res["hardware_line"].startswith("[hardware] ")
    best = {r["kind"]: r for r in res["rows"] if r["best"]}
    assert set(best) == {"flat", "hnsw", "ivfpq", "ivfpq_refine"}
    for r in res["rows"]:
        assert {"build_s", "disk_mb", "load_s", "rss_mb", "single_qps", "batch_qps", "recall@10"} <= set(r)
        assert r["single_qps"] > 0 and r["batch_qps"] > 0 and r["disk_mb"] > 0
    assert best["flat"]["recall@10"] == 1.0
    assert best["hnsw"]["recall@10"] >= 0.95
    assert best["ivfpq_refine"]["recall@10"] > best["ivfpq"]["recall@10"]
    assert best["ivfpq"]["disk_mb"] < best["flat"]["disk_mb"] / 4
    ex = {r["kind"]: r for r in res["extrapolated"]}
    assert set(ex) == set(best) and all(r["n"] == 21_000_000 and r["dim"] == 768 for r in ex.values())
    assert all(r["source"].startswith("extrapolated") for r in ex.values())
    assert {(s["kind"], s["mmap"], s["processes"]) for s in res["shared_memory"]} == {
        (k, m, p) for k in ("flat", "ivfpq") for m in (False, True) for p in (1, 2)}
    lookup = res["corpus_lookup"]
    assert lookup["lines"] == 20_000 and lookup["first"]["p50_us"] > 0
