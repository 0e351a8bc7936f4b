"""benchmarks/retriever_faults.py: a short run against the real server process with its
misbehaving backend passes every check, and the JSON carries the figures of issue 33."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_rl.demo.records import read_record

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_short_fault_run_has_no_hang(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "retriever_faults.py"), "--seconds", "4",
                           "--clients", "4", "--entities", "60", "--json", str(out),
                           "--record-dir", str(tmp_path / "record")], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    rec = read_record(tmp_path / "record")  # its record: command, host, the full JSON beside it
    assert rec.benchmark == "benchmarks/retriever_faults.py" and "--record-dir" in rec.command and rec.headline
    assert "retriever_faults.json" in rec.files and (tmp_path / "record" / "retriever_faults.json").is_file()
    assert all(res["checks"].values()) and not any(res["hangs"].values())
    assert res["codes"]["boom"] == {"500": res["codes"]["boom"]["500"]} and res["codes"]["normal"].get("200", 0) > 0
    assert res["health"]["n"] > 10 and res["health"]["p99_ms"] < 30_000
    assert "| kind | requests |" in proc.stdout and res["hardware_line"].startswith("[hardware] ")
