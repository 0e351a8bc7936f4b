"""benchmarks/encoder_precision.py --quick runs and its JSON is consistent: every precision is
measured through the real server without errors, each is batch-independent, and fp32 is the
recall reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_rl.demo.records import read_record

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_precision_table_runs(tmp_path):
    out = tmp_path / "precision.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "encoder_precision.py"), "--quick",
                           "--precisions", "int8", "--json", str(out),
                           "--record-dir", str(tmp_path / "record")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| onnx int8" in proc.stdout and "| onnx fp32" in proc.stdout
    res = json.loads(out.read_text())
    rec = read_record(tmp_path / "record")  # its record: command, host, the full JSON beside it
    assert rec.benchmark == "benchmarks/encoder_precision.py" and "--record-dir" in rec.command and rec.headline
    assert "encoder_precision.json" in rec.files and (tmp_path / "record" / "encoder_precision.json").is_file()
    assert res["hardware_line"].startswith("[hardware] ") and res["auto"] in ("fp32", "int8", "bf16")
    rows = {r["precision"]: r for r in res["rows"]}
    assert set(rows) == {"fp32", "int8"} and rows["fp32"]["recall@3_change"] == 0.0
    for r in rows.values():
        assert r["passages_per_s"] > 0 and r["c1_qps"] > 0 and r["c64_qps"] > 0
        assert r["c1_errors"] == r["c64_errors"] == 0
        assert r["batch_max_abs_diff"] <= 1e-5  # issue 27: alone and batched give the same vector
