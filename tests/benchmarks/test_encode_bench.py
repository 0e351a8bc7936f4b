"""benchmarks/encode.py runs and its JSON is consistent: sorting by tokens never pads more
than sorting by characters, and the two batchings give the same vectors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_rl.demo.records import read_record

ROOT = Path(__file__).resolve().parents[2]


def test_encode_benchmark_runs(tmp_path):
    out = tmp_path / "encode.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "encode.py"), "--passages", "100",
                           "--shard", "2048", "--json", str(out),
                           "--record-dir", str(tmp_path / "record")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| by tokens (now) |" in proc.stdout
    res = json.loads(out.read_text())
    rec = read_record(tmp_path / "record")  # its record: command, host, the full JSON beside it
    assert rec.benchmark == "benchmarks/encode.py" and "--record-dir" in rec.command and rec.headline
    assert "encode.json" in rec.files and (tmp_path / "record" / "encode.json").is_file()
    assert res["passages"] == 100 and res["shard"] == 2048 and res["psg_per_s_by_chars"] > 0 and res["psg_per_s_by_tokens"] > 0
    assert 1.0 <= res["padding_by_tokens"] <= res["padding_by_chars"]
    assert 1.0 <= res["shard_padding_by_tokens"] <= res["shard_padding_by_chars"]
    assert res["max_abs_diff"] < 1e-4
