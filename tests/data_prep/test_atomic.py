"""Durable output: fsync before the rename and of the directory after it, a full disk leaves
the previous file, directory swaps, and tools never replace what they did not write."""

from __future__ import annotations

import os

import pytest

from data_prep import atomic
from data_prep.atomic import atomic_write, check_replaceable, replace_dir


def _record_fsyncs(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync and rename, in order, as ("fsync", path) / ("replace", destination)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b))) or real_replace(a, b))
    return events


def test_atomic_write_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    events = _record_fsyncs(monkeypatch)
    with atomic_write(out) as f:
        f.write("{}\n")
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(tmp_path / ".out.json.")) and events[1:] == [("replace", str(out)),
                                                                                    ("fsync", str(tmp_path))]


def test_a_full_disk_leaves_the_previous_file_and_says_so(tmp_path, small_disk):
    out = tmp_path / "rows.jsonl"
    out.write_text("old complete file\n")
    code = ("from data_prep.atomic import atomic_write\n"
            f"with atomic_write({str(out)!r}) as f:\n"
            "    f.write('x' * 100_000)\n")
    res = small_disk(code, 4096)
    assert res.returncode != 0 and "File too large" in res.stderr
    assert f"{out} was not written (what it held before, if anything, is unchanged)" in res.stderr
    assert out.read_text() == "old complete file\n" and [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_replace_dir_fsyncs_every_file_and_swaps_in_the_new_directory(tmp_path, monkeypatch):
    final, tmp = tmp_path / "model", tmp_path / "model.tmp"
    final.mkdir()
    (final / "old.bin").write_text("old")
    (tmp / "actor").mkdir(parents=True)
    (tmp / "actor" / "weights.bin").write_text("new weights")  # as a worker process writes it
    (tmp / "state.json").write_text("{}")
    synced: list[str] = []
    monkeypatch.setattr(atomic, "fsync", lambda p: synced.append(os.path.relpath(p, tmp)))
    replace_dir(tmp, final)
    assert sorted(synced[:-1]) == [".", "actor", "actor/weights.bin", "state.json"]
    assert synced[-1] == ".."  # the parent, after the rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == ["actor", "actor/weights.bin", "state.json"]


def test_check_replaceable_allows_only_absent_empty_or_marked_directories(tmp_path):
    check_replaceable(tmp_path / "absent", ".complete", "a model", "use another --out")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", ".complete", "a model", "use another --out")
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / ".complete").write_text("")
    check_replaceable(tmp_path / "ours", ".complete", "a model", "use another --out")
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"user exists and is a directory not written by this tool "
                                              r"\(no \.complete in it\).*a model: use another --out"):
        check_replaceable(tmp_path / "user", ".complete", "a model", "use another --out")
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match="file exists and is a file"):
        check_replaceable(tmp_path / "file", ".complete", "a model", "use another --out")
    assert (tmp_path / "user" / "notes.txt").read_text() == "mine"
