"""GPU users can install the project: the `gpu` and `gpu-torch` extras resolve with pip's own
resolver on Python 3.11, 3.12 and 3.13 (binary wheels for x86-64 Linux), and requires-python
admits each. Asks the package index when the requirements changed since the resolution recorded
in scripts/gpu_extras_resolved.json (skipped, saying so, where it cannot be reached), and reads
that record otherwise (scripts/check_install.py's doc)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _check_install():
    """scripts/check_install.py as a module (scripts/ is not a package)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_install
    finally:
        sys.path.pop(0)
    return check_install


@pytest.mark.slow
def test_gpu_extras_resolve_on_python_311_to_313(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_install.py"), "--if-changed", "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode == 3:
        pytest.skip(f"nothing decided (index unreachable, downloads breaking off, or no disk for them): "
                    f"{proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {(r["python"], r["extra"]) for r in rows} == {(p, e) for p in ("3.11", "3.12", "3.13")
                                                         for e in ("gpu", "gpu-torch")}
    for r in rows:
        assert r["admitted"] and r["result"] == "ok", r
        assert r["chosen"]["vllm"].startswith("0.24.") and r["chosen"]["torch"].startswith("2.11.")
        assert ("faiss-gpu-cu12" if r["extra"] == "gpu" else "faiss-cpu") in r["chosen"]


def test_the_index_is_asked_again_only_when_the_requirements_change(monkeypatch, tmp_path):
    """--if-changed: a passing full resolution is recorded with its key; the same requirements
    read the record without asking pip; a changed key, or a recorded row that did not pass, asks
    again. Runs of other extras or Pythons neither read nor write the record."""
    check_install = _check_install()
    monkeypatch.setattr(check_install, "RESOLVED", tmp_path / "resolved.json")
    calls = []

    def resolve(reqs, py):
        calls.append(py)
        return "ok", {"vllm": "0.24.0", "torch": "2.11.0"}, ""

    monkeypatch.setattr(check_install, "resolve", resolve)
    assert check_install.main(["--if-changed"]) == 0 and len(calls) == 6
    record = json.loads((tmp_path / "resolved.json").read_text())
    assert record["key"] == check_install.inputs_key() and len(record["rows"]) == 6
    calls.clear()
    out = tmp_path / "rows.json"
    assert check_install.main(["--if-changed", "--json", str(out)]) == 0 and calls == []
    assert json.loads(out.read_text()) == record["rows"]
    assert check_install.main([]) == 0 and len(calls) == 6  # without --if-changed: always asked
    calls.clear()
    monkeypatch.setattr(check_install, "inputs_key", lambda extras=None: "another")
    assert check_install.main(["--if-changed"]) == 0 and len(calls) == 6
    calls.clear()
    record = json.loads((tmp_path / "resolved.json").read_text())
    record["rows"][0]["result"] = "failed"
    (tmp_path / "resolved.json").write_text(json.dumps(record))
    assert check_install.main(["--if-changed"]) == 0 and len(calls) == 6
    calls.clear()
    (tmp_path / "resolved.json").unlink()
    assert check_install.main(["--if-changed", "--extras", "gpu"]) == 0 and len(calls) == 3
    assert not (tmp_path / "resolved.json").exists()


def test_requires_python_refusal_is_reported(monkeypatch):
    """The check itself can fail: a Python outside requires-python is reported as not admitted."""
    check_install = _check_install()
    assert check_install.admits("3.12") and check_install.admits("3.13") and not check_install.admits("3.14")
    monkeypatch.setattr(check_install, "resolve", lambda reqs, py: ("ok", {"vllm": "0.24.0"}, ""))
    assert check_install.main(["--pythons", "3.10", "--extras", "gpu"]) == 1


def test_broken_downloads_are_tried_again_then_reported_unchecked(monkeypatch):
    """A download that breaks off (pip: resumed, then a hash mismatch) is the network, not the
    resolution: tried again one at a time; if it keeps breaking, exit 3 (nothing decided), but a
    resolution that failed outright still fails the check."""
    check_install = _check_install()
    broken = ("WARNING: Connection interrupted while downloading.\nERROR: THESE PACKAGES DO NOT MATCH THE "
              "HASHES FROM THE REQUIREMENTS FILE.")
    assert check_install.failure(broken) == "interrupted"
    assert check_install.failure("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.") == "failed"
    assert check_install.failure("ResolutionImpossible: conflicting dependencies") == "failed"
    assert check_install.failure("Max retries exceeded with url") == "unreachable"

    ok = ("ok", {"vllm": "0.24.0"}, "")
    calls = []

    def flaky(outcomes):
        def resolve(reqs, py):
            calls.append(py)
            return outcomes.pop(0) if outcomes else ok
        return resolve

    monkeypatch.setattr(check_install, "resolve", flaky([("interrupted", {}, broken)]))
    assert check_install.main(["--pythons", "3.12", "--extras", "gpu"]) == 0 and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(check_install, "resolve", flaky([("interrupted", {}, broken)] * 5))
    assert check_install.main(["--pythons", "3.12", "--extras", "gpu"]) == 3
    assert len(calls) == 1 + check_install.RETRIES
    monkeypatch.setattr(check_install, "resolve", lambda reqs, py: ("failed", {}, "no") if py == "3.11"
                        else ("interrupted", {}, broken))
    assert check_install.main(["--pythons", "3.11", "3.12", "--extras", "gpu"]) == 1


def test_a_full_disk_runs_fewer_at_once_and_is_tried_again_alone(monkeypatch):
    """pip's downloads (GBs a resolution) that fill TMPDIR are the host, not the resolution: as many
    resolutions at once as the free space holds; one that ran out of space is tried again alone;
    still no space is reported unchecked (exit 3), not as a failed resolution."""
    check_install = _check_install()
    gib = 1 << 30
    assert check_install.workers(6, free=80 * gib) == 6
    assert check_install.workers(6, free=13 * gib) == 2  # 6 GiB each
    assert check_install.workers(6, free=1 * gib) == 1
    full = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
    assert check_install.failure(full) == "no space"

    outcomes = {"3.11": [("no space", {}, full)], "3.12": []}
    calls = []

    def resolve(reqs, py):
        calls.append(py)
        return outcomes[py].pop(0) if outcomes[py] else ("ok", {"vllm": "0.24.0"}, "")

    monkeypatch.setattr(check_install, "resolve", resolve)
    assert check_install.main(["--pythons", "3.11", "3.12", "--extras", "gpu"]) == 0
    assert sorted(calls) == ["3.11", "3.11", "3.12"]
    outcomes["3.11"] = [("no space", {}, full)] * 5
    assert check_install.main(["--pythons", "3.11", "--extras", "gpu"]) == 3


def test_console_scripts_are_cli_functions(capsys):
    """Each console script pyproject.toml installs runs a function of a package's cli.py
    (docs/architecture.md) and answers --help."""
    import importlib
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"agent-rl-prep", "agent-rl-retriever", "agent-rl-train", "agent-rl-sft", "agent-rl-eval"} <= set(scripts)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        assert module.endswith(".cli"), (name, target)
        with pytest.raises(SystemExit) as stop:
            getattr(importlib.import_module(module), func)(["--help"])
        assert stop.value.code == 0, name
        assert f"usage: {name}" in capsys.readouterr().out, name
