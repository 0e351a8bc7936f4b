"""`python -m data_prep` end to end, as a user runs it: help, summaries, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["corpus", "qa", "overlap", "split", "synthetic", "model", "kbcheck"]


def run(*args: str, cwd: Path, hashseed: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONHASHSEED": hashseed, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "data_prep", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_help_lists_every_command(tmp_path):
    p = run("--help", cwd=tmp_path)
    assert p.returncode == 0
    for cmd in COMMANDS + ["index", "demos"]:
        assert f"    {cmd}" in p.stdout
    for cmd in COMMANDS:
        p = run(cmd, "--help", cwd=tmp_path)
        assert p.returncode == 0 and f"usage: agent-rl-prep {cmd}" in p.stdout, p.stderr
    assert run(cwd=tmp_path).returncode == 2  # no command: usage error


def test_corpus_summary_and_reported_rows(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"id": "1", "contents": '"A"\ntext a'}) + "\n{oops\n"
                   + json.dumps({"id": "2", "title": "B", "text": "text b"}) + "\n")
    p = run("corpus", "--input", str(src), "--out", "out.jsonl", "--problems", "problems.txt", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "read 3, written 2, skipped 1 -> out.jsonl" in p.stdout
    assert f"{src}:2: invalid JSON" in p.stderr
    assert (tmp_path / "problems.txt").read_text().startswith(f"{src}:2: invalid JSON")
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2


def test_user_errors_exit_1_without_traceback(tmp_path):
    (tmp_path / "corpus.xml").write_text("<x/>")
    cases = [
        ("corpus", "--input", "missing.jsonl", "--out", "o.jsonl"),
        ("corpus", "--input", "corpus.xml", "--out", "o.jsonl"),
        ("qa", "--input", "missing.jsonl", "--out", "o.parquet"),
        ("kbcheck", "--kb", "no_kb_here"),
    ]
    for args in cases:
        p = run(*args, cwd=tmp_path)
        assert p.returncode == 1, (args, p.stderr)
        # every command starts with the hardware line; the user's error comes right after it
        err = "".join(l for l in p.stderr.splitlines(True) if not l.startswith("[hardware] "))
        assert err.startswith("error: ") and "Traceback" not in p.stderr, p.stderr
        # none of these loads torch, so its line does not import it to name it (uses_torch)
        assert p.stderr.startswith("[hardware] ") and " torch=unused " in p.stderr.splitlines()[0], p.stderr
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("argv,torch", [
    (["synthetic", "--out", "kb"], False), (["qa", "--input", "a", "--out", "b"], False),
    (["split", "a", "--out-rest", "b", "--out-held", "c"], False), (["kbcheck", "--kb", "kb"], False),
    (["index", "--corpus", "c", "--out", "i", "--kind", "bm25"], False),
    (["index", "--corpus", "c", "--out", "i", "--kind", "flat"], True),
    (["kbcheck", "--kb", "kb", "--index", "i"], True), (["model", "--out", "m"], True)])
def test_the_hardware_line_asks_torch_only_where_the_command_may_load_it(argv, torch):
    from data_prep.cli import build_parser, uses_torch

    assert uses_torch(build_parser(with_index_args=argv[0] == "index").parse_args(argv)) is torch


def test_qa_and_overlap(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"question": q, "answer": ["x"]}) + "\n" for q in ["A b?", "C d?"]))
    test.write_text(json.dumps({"question": "a B", "answer": ["x"]}) + "\n")
    p = run("qa", "--input", str(train), "--out", "train.parquet", "--source", "toy", cwd=tmp_path)
    assert p.returncode == 0 and "read 2, written 2, skipped 0 -> train.parquet" in p.stdout, p.stderr
    p = run("overlap", "--train", "train.parquet", "--test", str(test), cwd=tmp_path)
    assert p.returncode == 0 and "test questions also in train: 1 of 1 (100.0%)" in p.stdout, p.stderr
    p = run("overlap", "--train", "train.parquet", "--test", str(test), "--fail-on-overlap", cwd=tmp_path)
    assert p.returncode == 1
    p = run("overlap", "--train", "train.parquet", "--test", str(test), "--drop-from-train", "clean.parquet",
            cwd=tmp_path)
    assert p.returncode == 0 and "1 of 2 rows (1 dropped)" in p.stdout, p.stderr
    assert list(pd.read_parquet(tmp_path / "clean.parquet")["question"]) == ["C d?"]


def test_split_writes_both_parts_and_reports_bad_input(tmp_path):
    """The command over `qa.split_by_id` (its rule is tested in test_qa.py): both files, the
    counts printed, and a clear error, no file written, without an id column."""
    pd.DataFrame({"id": [f"r{i}" for i in range(20)], "question": ["q"] * 20}).to_parquet(tmp_path / "d.parquet")
    p = run("split", "d.parquet", "--every", "4", "--out-rest", "a.parquet", "--out-held", "b.parquet", cwd=tmp_path)
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    assert p.returncode == 0 and f"{len(a)} rows -> a.parquet, {len(b)} held out (1 in 4 by id)" in p.stdout, p.stderr
    assert len(a) + len(b) == 20 and len(b) > 0 and not set(a["id"]) & set(b["id"])
    pd.DataFrame({"question": ["q"]}).to_parquet(tmp_path / "noid.parquet")
    for bad, says in (("noid.parquet", "noid.parquet: no 'id' column"), ("missing.parquet", "missing.parquet: no such file")):
        p = run("split", bad, "--out-rest", "c.parquet", "--out-held", "d2.parquet", cwd=tmp_path)
        assert p.returncode == 1 and f"error: {says}" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "c.parquet").exists() and not (tmp_path / "d2.parquet").exists()


def test_synthetic_is_deterministic_across_processes_and_checks(tmp_path):
    """Different PYTHONHASHSEEDs: catches any dependence on set or hash ordering."""
    args = ["synthetic", "--entities", "150", "--train", "120", "--test", "30", "--seed", "5"]
    a = run(*args, "--out", "kb_a", cwd=tmp_path, hashseed="1")
    b = run(*args, "--out", "kb_b", cwd=tmp_path, hashseed="2")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "written" in a.stdout and "120 train and 30 test questions" in a.stdout
    for name in ("corpus.jsonl", "train.parquet", "test.parquet"):
        assert (tmp_path / "kb_a" / name).read_bytes() == (tmp_path / "kb_b" / name).read_bytes()
    p = run("kbcheck", "--kb", "kb_a", "--json", "report.json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "answer in support passages: 100.00%" in p.stdout
    assert "test questions shared with train: 0" in p.stdout
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is True


def test_demos_dispatch(tmp_path):
    try:
        import agent_rl.coldstart.cli  # noqa: F401
    except ModuleNotFoundError:
        p = run("demos", "--help", cwd=tmp_path)
        assert p.returncode == 2
        assert "demos needs agent_rl.coldstart.cli (install the agent_rl package)" in p.stderr
    else:
        p = run("demos", "--help", cwd=tmp_path)
        assert p.returncode == 0, p.stderr


def test_index_help(tmp_path):
    p = run("index", "--help", cwd=tmp_path)
    try:
        import data_prep.indexing  # noqa: F401
    except ModuleNotFoundError:
        assert p.returncode == 1 and "index needs data_prep.indexing" in p.stderr
        pytest.skip("data_prep.indexing not written yet")
    assert p.returncode == 0 and "--corpus" in p.stdout and "--kind" in p.stdout, p.stderr
