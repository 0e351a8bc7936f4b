"""Run-level checkpoints: atomic and durable write, latest pointer, keep-last-K, RNG restore,
and the fallback past a checkpoint damaged by a power loss, a kill or a full disk."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_rl.training.checkpoint import CheckpointManager, damage

ROOT = Path(__file__).resolve().parents[2]


def _save(mgr: CheckpointManager, step: int, **kw):
    def workers(d):
        (d / "actor").mkdir()
        (d / "actor" / "weights.txt").write_text(f"step {step}")

    return mgr.save(step, {"data": {"epoch": 0, "index": step}, **kw}, {"lr": 1e-6}, workers)


def test_save_then_load_restores_state_and_rng(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    assert mgr.latest() is None
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(mgr, 3)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7), np.random.seed(7), torch.manual_seed(7)  # disturb
    assert mgr.latest() == path and path.name == "global_step_3"
    state = mgr.load(mgr.latest())
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "index": 3}
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert (path / "actor" / "weights.txt").read_text() == "step 3"
    assert "lr" in (path / "config.yaml").read_text()


def test_keep_last_k_and_latest_points_to_newest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        _save(mgr, step)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]
    assert mgr.latest().name == "global_step_4"


def test_interrupted_save_leaves_previous_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)

    def crash(d):
        (d / "actor").mkdir()
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError):
        mgr.save(2, {}, {}, crash)
    assert mgr.latest().name == "global_step_1"
    assert not (tmp_path / "global_step_2").exists()  # only the .tmp dir, never a partial final dir
    _save(mgr, 2)  # a later save of the same step cleans up the stale tmp dir
    assert mgr.latest().name == "global_step_2" and not (tmp_path / "global_step_2.tmp").exists()


def test_load_rejects_a_directory_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        CheckpointManager(tmp_path).load(tmp_path)


def test_latest_is_found_even_if_the_pointer_lags(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)
    _save(mgr, 2)
    (tmp_path / "latest").write_text("global_step_1")  # killed between rename and pointer update
    (tmp_path / "global_step_3").mkdir()  # a directory without trainer_state.json is not complete
    assert mgr.latest().name == "global_step_2"


def _break(path, how: str) -> None:
    """Damage a saved checkpoint as a power loss before its data reached the disk would."""
    if how == "empty worker file":
        (path / "actor" / "weights.txt").write_bytes(b"")
    elif how == "truncated rng":
        (path / "rng.pt").write_bytes((path / "rng.pt").read_bytes()[:100])
    elif how == "empty trainer state":
        (path / "trainer_state.json").write_bytes(b"")
    elif how == "missing file":
        (path / "config.yaml").unlink()
    elif how == "empty manifest":
        (path / "manifest.json").write_bytes(b"")


@pytest.mark.parametrize("how, why", [
    ("empty worker file", "actor/weights.txt has 0 bytes, 6 were written"),
    ("truncated rng", "rng.pt has 100 bytes"),
    ("empty trainer state", "trainer_state.json is unreadable"),
    ("missing file", "config.yaml is missing"),
    ("empty manifest", "manifest.json is unreadable"),
])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, capsys, how, why):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)
    _save(mgr, 2)
    _break(tmp_path / "global_step_2", how)
    capsys.readouterr()
    assert mgr.latest() == tmp_path / "global_step_1"
    assert f"[checkpoint] skipping {tmp_path / 'global_step_2'}: {why}" in capsys.readouterr().out
    assert mgr.load(mgr.latest())["step"] == 1
    with pytest.raises(ValueError, match=f"global_step_2 is damaged: {why}"):  # resume_from_path names it
        mgr.load(tmp_path / "global_step_2")


def test_a_checkpoint_saved_before_manifests_is_complete_when_its_state_parses(tmp_path):
    mgr = CheckpointManager(tmp_path)
    path = _save(mgr, 1)
    (path / "manifest.json").unlink()  # as older code saved it
    assert damage(path) is None and mgr.latest() == path
    (path / "trainer_state.json").write_text('{"step": 1, "da')
    assert "unreadable" in damage(path) and mgr.latest() is None


def test_save_fsyncs_every_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    """Without fsync a power loss after the rename can leave the new checkpoint's files
    empty (delayed allocation); the workers' files must be synced too."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b))) or real_replace(a, b))
    final = _save(CheckpointManager(tmp_path), 1)
    rename = events.index(("replace", str(final)))
    tmp = str(final) + ".tmp"
    synced = {os.path.relpath(p, tmp) for kind, p in events[:rename] if kind == "fsync"}
    written = {str(p.relative_to(final)) for p in final.rglob("*")} | {"."}
    assert written <= synced and "actor/weights.txt" in synced
    assert ("fsync", str(tmp_path)) in events[rename:]  # the rename itself is durable
    pointer = events.index(("replace", str(tmp_path / "latest")))
    assert ("fsync", str(tmp_path)) in events[pointer:]


def test_damaged_checkpoints_do_not_count_towards_keep(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    _save(mgr, 1)
    _save(mgr, 2)
    _break(tmp_path / "global_step_2", "empty worker file")
    _save(mgr, 3)  # the run resumed from 1 and went on
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_1", "global_step_2", "global_step_3"]
    _break(tmp_path / "global_step_3", "empty worker file")
    assert mgr.latest().name == "global_step_1"  # still something to resume from
    _save(mgr, 4)
    _save(mgr, 5)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_4", "global_step_5"]


_KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
from agent_rl.training.checkpoint import CheckpointManager

root, where = Path(sys.argv[1]), sys.argv[2]
mgr = CheckpointManager(root)
real_replace = os.replace

def replace(a, b):
    if where == "pointer" and Path(b).name == "latest":
        os.kill(os.getpid(), signal.SIGKILL)  # the checkpoint is renamed, the pointer not yet
    real_replace(a, b)

def workers(d):
    (d / "actor").mkdir()
    (d / "actor" / "weights.txt").write_text("step 2 half")
    if where == "workers":
        os.kill(os.getpid(), signal.SIGKILL)  # mid-way through the workers' files

os.replace = replace
mgr.save(2, {"data": {"index": 2}}, {}, workers)
"""


@pytest.mark.parametrize("where, expected", [("workers", "global_step_1"), ("pointer", "global_step_2")])
def test_a_sigkill_inside_save_leaves_a_loadable_checkpoint(tmp_path, where, expected):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)
    res = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(tmp_path), where], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert mgr.latest().name == expected and (tmp_path / "latest").read_text() == "global_step_1"
    assert mgr.load(mgr.latest())["step"] == int(expected.rsplit("_", 1)[1])
    _save(mgr, 3)  # the next save clears what the killed one left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"global_step_1", expected, "global_step_3", "latest"})


def test_a_full_disk_during_save_keeps_the_previous_checkpoint(tmp_path, small_disk):
    mgr = CheckpointManager(tmp_path)
    _save(mgr, 1)
    code = ("from pathlib import Path\n"
            "from agent_rl.training.checkpoint import CheckpointManager\n"
            "def workers(d):\n"
            "    (d / 'actor').mkdir()\n"
            "    (d / 'actor' / 'weights.bin').write_bytes(b'w' * 3_000_000)\n"
            f"CheckpointManager({str(tmp_path)!r}).save(2, {{}}, {{}}, workers)\n")
    res = small_disk(code, 1_000_000)
    assert mgr.latest().name == "global_step_1" and mgr.load(mgr.latest())["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "latest"]  # no partial .tmp left
    assert res.returncode == 1 and "File too large" in res.stderr
    assert "checkpoint global_step_2 was not saved; the ones before it are unchanged" in res.stderr


_KILLED_RESAVE = """
import os, signal, sys
from pathlib import Path
from agent_rl.training.checkpoint import CheckpointManager

root = Path(sys.argv[1])
real_replace = os.replace

def replace(a, b):
    if Path(a).name == "global_step_1.tmp":  # the old step 1 is aside, the new one not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(a, b)

def workers(d):
    (d / "actor").mkdir()
    (d / "actor" / "weights.txt").write_text("step 1 again")

os.replace = replace
CheckpointManager(root, keep=1).save(1, {"data": {"index": 1}}, {}, workers)
"""


def test_a_kill_between_the_renames_of_a_resaved_step_leaves_it_loadable(tmp_path):
    """keep=1, step 1 saved again (a run resumed from an earlier step, or re-run): a SIGKILL
    after the old step 1 was renamed aside and before the new one took its name left no
    `global_step_1` at all, so the resume started from scratch and the next save deleted both."""
    mgr = CheckpointManager(tmp_path, keep=1)
    _save(mgr, 1)
    res = subprocess.run([sys.executable, "-c", _KILLED_RESAVE, str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert not (tmp_path / "global_step_1").exists()  # the window the kill hit
    path = mgr.latest()
    assert path is not None and mgr.load(path)["step"] == 1
    assert (path / "actor" / "weights.txt").read_text() == "step 1"  # the complete earlier save
    _save(mgr, 2)  # the resumed run goes on: the next save keeps step 1 until 2 is in place, then prunes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", "latest"]
    assert mgr.load(mgr.latest())["step"] == 2


def test_a_resave_after_the_kill_restores_the_step_and_replaces_it_whole(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=1)
    _save(mgr, 1)
    subprocess.run([sys.executable, "-c", _KILLED_RESAVE, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                   capture_output=True, timeout=300)

    def fails(d):
        raise RuntimeError("the re-save fails too")

    with pytest.raises(RuntimeError):
        mgr.save(1, {}, {}, fails)
    assert mgr.latest() == tmp_path / "global_step_1" and mgr.load(mgr.latest())["step"] == 1  # back under its name
    _save(mgr, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "latest"]


def _free_space(monkeypatch, free: int) -> None:
    """shutil.disk_usage as a disk with `free` bytes left would report it."""
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=free))


def test_a_save_that_cannot_fit_stops_before_writing_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The next checkpoint is as large as the last one (the same weights and optimizer); a disk
    without that much room is found before anything is written, with a message saying so."""
    mgr = CheckpointManager(tmp_path, keep=1)
    first = _save(mgr, 1)
    size = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    _free_space(monkeypatch, size // 2)
    written = []
    with pytest.raises(OSError) as e:  # NoSpaceForCheckpoint: an OSError as a full disk's would be
        mgr.save(2, {}, {}, lambda d: written.append(d))
    assert type(e.value).__name__ == "NoSpaceForCheckpoint" and not written  # the workers never wrote
    assert "checkpoint global_step_2 needs" in str(e.value) and "global_step_1 is intact" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "latest"]
    assert mgr.load(mgr.latest())["step"] == 1
    _free_space(monkeypatch, 10 * size)
    _save(mgr, 2)
    assert mgr.latest().name == "global_step_2"


def test_the_first_save_is_checked_against_the_size_of_the_state_being_saved(tmp_path, monkeypatch):
    from agent_rl.training.checkpoint import NoSpaceForCheckpoint

    _free_space(monkeypatch, 10 * 2**20)
    with pytest.raises(NoSpaceForCheckpoint, match=r"needs about 1\.00 GiB.*no earlier checkpoint"):
        CheckpointManager(tmp_path).save(1, {}, {}, None, expected_bytes=2**30)
    assert not list(tmp_path.glob("global_step_*"))
    assert CheckpointManager(tmp_path).save(1, {}, {}, None, expected_bytes=2**20).name == "global_step_1"


def test_a_worker_reports_the_bytes_its_checkpoint_takes():
    """Parameters and the optimizer's state (AdamW: two moments per parameter, and a step)."""
    from types import SimpleNamespace

    from agent_rl.training.workers.step import UpdateLoopWorker

    model = torch.nn.Linear(10, 5)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 10)).sum().backward()
    opt.step()
    worker = UpdateLoopWorker()
    worker.loop = SimpleNamespace(model=model, optim=SimpleNamespace(optimizer=opt))
    params = 55 * 4
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert worker.state_bytes() == params + 2 * params + steps


class _Payload:
    """What a malicious checkpoint would hold: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_payload_is_refused_not_run(tmp_path):
    """Issue 30: rng.pt and the workers' state were loaded with weights_only=False, so resuming
    from a checkpoint someone else made ran whatever its pickle held."""
    import json

    from agent_rl.training.checkpoint import MANIFEST, UnsafeCheckpoint, manifest_of, safe_torch_load

    marker = tmp_path / "pwned"
    evil = tmp_path / "actor_state.pt"
    torch.save({"optimizer": None, "num_updates": 1, "hook": _Payload(marker)}, evil)
    with pytest.raises(UnsafeCheckpoint, match="refusing to load .*actor_state.pt"):
        safe_torch_load(evil)
    assert not marker.exists()

    mgr = CheckpointManager(tmp_path / "ckpt")
    path = _save(mgr, 2)
    torch.save({"python": _Payload(marker)}, path / "rng.pt")  # planted, the manifest made to match
    (path / MANIFEST).write_text(json.dumps(manifest_of(path)))
    with pytest.raises(UnsafeCheckpoint):
        mgr.load(path)
    assert not marker.exists()
    assert safe_torch_load(_save(mgr, 3) / "rng.pt")["numpy"][0] == "MT19937"  # a real one loads


def test_moving_the_steps_past_a_branch_point_takes_every_trace_of_them(tmp_path):
    """A re-save's `.global_step_K.old` left behind would be renamed back by the next save and
    bring the old branch's step K back; `latest` must not name a step that moved."""
    mgr = CheckpointManager(tmp_path / "ckpt")
    for step in (5, 10, 15, 20):
        _save(mgr, step)
    os.replace(tmp_path / "ckpt" / "global_step_20", tmp_path / "ckpt" / ".global_step_20.old")  # a kill mid re-save
    (tmp_path / "ckpt" / "global_step_25.tmp").mkdir()  # a kill mid save
    (tmp_path / "ckpt" / "global_step_30.bak").mkdir()  # someone else's: not the manager's
    assert [p.name for p in mgr.after(10)] == ["global_step_15", ".global_step_20.old", "global_step_25.tmp"]
    moved = mgr.move_after(10, tmp_path / "aside")
    assert [p.parent for p in moved] == [tmp_path / "aside"] * 3 and mgr.after(10) == []
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["global_step_10", "global_step_30.bak",
                                                                    "global_step_5", "latest"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step_10" and mgr.latest().name == "global_step_10"
    _save(mgr, 11)
    assert mgr.latest().name == "global_step_11" and not (tmp_path / "ckpt" / "global_step_20").exists()
