"""benchmarks/retriever.py --quick with a busy neighbour and the httpx driver: it runs, the
neighbour processes are gone afterwards, and the JSON carries issue #15's figures (the ratio to
the server's own encoder in-process, the encoder speed-up apart, C=64 vs C=16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_rl.demo.records import read_record

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_with_a_neighbour(tmp_path):
    out = tmp_path / "retriever.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "retriever.py"), "--quick", "--duration", "0.5",
                           "--concurrency", "1,16,64", "--neighbour", "1", "--client", "httpx", "--json", str(out),
                           "--record-dir", str(tmp_path / "record")],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    rec = read_record(tmp_path / "record")  # its record: command, host, the full JSON beside it
    assert rec.benchmark == "benchmarks/retriever.py" and "--record-dir" in rec.command and rec.headline
    assert "retriever.json" in rec.files and (tmp_path / "record" / "retriever.json").is_file()
    assert res["neighbour"] == 1 and res["client"] == "httpx"
    assert res["hardware_line"].startswith("[hardware] ")
    assert {r["concurrency"] for r in res["rows"]} == {1, 16, 64}
    assert all(r["errors"] == 0 and r["qps"] > 0 for r in res["rows"])
    # the limit is the server's own encoder in-process: at batch 64 it is the encoder's own figure
    assert res["encoder_qps_b64"] > 0 and res["encoder_speedup"] == pytest.approx(
        res["encoder_qps_b64"] / res["torch_fp32_qps_b64"])
    assert res["ratio_to_limit"] == pytest.approx(res["qps"] / res["limit_qps"])
    assert res["c64_over_c16"] > 0 and res["p99_over_p50_c64"] >= 1
    import psutil

    busy = [sys.executable, "-c", "while True:\n    pass\n"]  # benchmarks/retriever.py BUSY_LOOP
    leftover = [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == busy]
    assert not leftover, f"neighbour processes left running: {leftover}"
