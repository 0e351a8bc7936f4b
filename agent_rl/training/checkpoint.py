"""Run-level checkpoints: step, data-loader position, RNG states, config, and worker states.

Layout under `<run_dir>/checkpoints/`:

    global_step_20/
        trainer_state.json   step, loader position, kl controller, anything small
        rng.pt               python / numpy / torch RNG states of the driver
        config.yaml          the resolved config the run used (secrets redacted)
        actor/  critic/      written by the workers' own `save(dir)`
        manifest.json        written last: every other file's relative path -> size in bytes
    latest                   text file naming the newest checkpoint saved (for people and
                             tools; `CheckpointManager.latest()` scans and verifies)

Guarantees. A checkpoint is written into `global_step_K.tmp/`; every file and directory in it
(the workers' included) is fsynced, then it is renamed to `global_step_K/`, the parent
directory fsynced, and `latest` replaced atomically. So a run killed at any instant (SIGKILL
included) or a full disk leaves the previous checkpoint intact and the new one absent or
complete, and a power loss after the save cannot leave empty or short files in it.
A step saved again (a run resumed from an earlier step) is swapped whole: the old one is
renamed to `.global_step_K.old` just before the new one takes its name, and a kill between
the two renames leaves it there, complete: the resume path takes it under that name and the
next save renames it back first (with keep=1 it was the only checkpoint left).
A save is refused before anything is written when the disk has less room than the
checkpoint needs (the newest one's size, or the caller's estimate of the state being saved):
a clear message instead of a disk filled to the last byte.
`latest()` (the resume path) returns the newest checkpoint whose files all match its manifest,
and skips a damaged one (a missing, empty or truncated file, an unreadable
trainer_state.json or one without the step its directory is named for) with a message naming
it and why, falling back to the one before; `load` refuses a state it cannot restore with a
ValueError naming the file. Saving, pruning and clearing a killed save touch only the names
the manager writes (`global_step_7`, not `global_step_07` or `global_step_7.bak`).
Checkpoints written before manifests existed count as complete when their
trainer_state.json parses. Only the newest `keep` complete ones are kept; a damaged one never
counts towards `keep`, so pruning never leaves nothing to resume from. A resume from an
earlier step first moves every trace of the steps past it away (`move_after`: their
directories, `.old` and `.tmp` ones included, and `latest`), so pruning and the next resume
see one line of steps (agent_rl.training.run.set_branch_aside).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from agent_rl.config import redacted
from data_prep.atomic import atomic_write, fsync, replace_dir

LATEST = "latest"
STATE = "trainer_state.json"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"global_step_(0|[1-9]\d*)")
"""The names `step_dir_name` writes, and only those: `global_step_01` or `global_step_x.tmp` is
someone else's (a copy, a backup), never resumed, pruned or cleared."""
_ASIDE = re.compile(r"\.global_step_(0|[1-9]\d*)\.old")
"""A re-saved step's previous save, renamed aside by `replace_dir` until the new one is in place."""
_TMP = re.compile(r"global_step_(0|[1-9]\d*)\.tmp")
_LATEST_TMP = re.compile(rf"\.{LATEST}\.[a-z0-9_]{{8}}\.tmp")
"""atomic_write's temporary file for `latest` (tempfile.mkstemp's name)."""
SPACE_MARGIN = 1.05
"""Room asked beyond the estimate: file-system overhead, and the small files beside the state."""


def step_dir_name(step: int) -> str:
    return f"global_step_{step}"


# numpy's RNG state is an array: its reconstruction is plain data, allowed beside tensors
_SAFE_NUMPY = [np.dtype, np.ndarray, np._core.multiarray._reconstruct, type(np.dtype(np.uint32))]


class NoSpaceForCheckpoint(OSError):
    """The disk has less room than the next checkpoint needs; nothing of it was written."""


class UnsafeCheckpoint(ValueError):
    """A state file holds Python objects beyond tensors and plain data: loading it could run code."""


def safe_torch_load(path: str | Path):
    """torch.load with safe types only (tensors, containers, numbers, strings, numpy arrays): a
    checkpoint made by someone else cannot run code through its pickle (weights_only=False
    would run whatever it holds)."""
    import pickle

    try:
        with torch.serialization.safe_globals(_SAFE_NUMPY):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(f"refusing to load {path}: it holds Python objects beyond tensors and plain data, "
                               f"which could run code ({str(e).splitlines()[0][:200]})") from None
    except Exception as e:  # noqa: BLE001  a short, empty or scrambled file: torch raises anything
        # (RuntimeError, EOFError, IndexError from its unpickler, ...) and its message names no file
        if isinstance(e, OSError) and e.filename is not None:
            raise  # the file itself could not be read: its own message names it
        raise ValueError(f"{path} is damaged (truncated or not a torch file): "
                         f"{(str(e) or type(e).__name__).splitlines()[0][:200]}") from None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def manifest_of(path: Path) -> dict[str, int]:
    """Relative path -> size of every file under `path` (the manifest itself excepted)."""
    files = (p for p in sorted(path.rglob("*")) if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(path).as_posix(): p.stat().st_size for p in files}


def _step_of(state) -> int | None:
    """The step a parsed trainer_state.json holds, or None when it is not an object with an integer step."""
    if not isinstance(state, dict) or type(state.get("step")) is not int:
        return None
    return state["step"]


def damage(path: str | Path) -> str | None:
    """Why checkpoint `path` cannot be resumed from (a file missing, empty or truncated, an
    unreadable trainer_state.json or manifest, a state without its step or with another step
    than its directory's name: a copy under a later name would be resumed forever), or None
    when it is complete."""
    path = Path(path)
    try:
        step = _step_of(json.loads((path / STATE).read_text()))
    except FileNotFoundError:
        return f"no {STATE}"
    except (OSError, ValueError) as e:
        return f"{STATE} is unreadable ({e})"
    if step is None:
        return f"{STATE} is not an object with an integer step"
    named = _STEP_DIR.fullmatch(path.name) or _ASIDE.fullmatch(path.name)
    if named and int(named.group(1)) != step:
        return f"{STATE} is step {step}, not {named.group(1)}"
    if not (path / MANIFEST).exists():
        return None  # saved before manifests: complete once its trainer state parses
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"{MANIFEST} is unreadable ({e})"
    if not isinstance(manifest, dict) or not all(type(size) is int for size in manifest.values()):
        return f"{MANIFEST} is not a map of file to size in bytes"
    for rel, size in manifest.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, {size} were written"
    return None


class CheckpointManager:
    """Saves and finds run checkpoints under `root` (see module docstring)."""

    def __init__(self, root: str | Path, keep: int | None = None):
        self.root = Path(root)
        self.keep = keep

    def latest(self) -> Path | None:
        """The newest complete checkpoint (its files match its manifest), or None.

        Found by scanning, not from the `latest` pointer: a kill between the rename and the
        pointer update leaves the pointer one checkpoint behind. A damaged checkpoint (a
        power loss before its data reached the disk) is skipped with a message."""
        return self._newest_complete(report=True)

    def _newest_complete(self, report: bool = False) -> Path | None:
        """The newest checkpoint whose files match its manifest; `report`: say which were skipped."""
        for path in reversed(self._step_dirs()):
            why = damage(path)
            if why is None:
                return path
            if report:
                print(f"[checkpoint] skipping {path}: {why}; falling back to the one before", flush=True)
        return None

    def _step_dirs(self) -> list[Path]:
        """Every checkpoint directory, oldest first, complete or not (not `.tmp` ones): each
        step's `global_step_K`, or its `.global_step_K.old` where a kill between the two
        renames of a re-save left the step only under that name."""
        found: dict[int, Path] = {}
        for pattern, name in (("global_step_*", _STEP_DIR), (".global_step_*.old", _ASIDE)):
            for p in self.root.glob(pattern):
                m = name.fullmatch(p.name)
                if m and p.is_dir():
                    found.setdefault(int(m.group(1)), p)  # the step's own name first
        return [found[k] for k in sorted(found)]

    def after(self, step: int) -> list[Path]:
        """Every checkpoint directory of a step past `step`, oldest first: complete or damaged,
        a re-save's `.global_step_K.old`, a killed save's `global_step_K.tmp`."""
        found = []
        for p in self.root.glob("*global_step_*"):
            m = _STEP_DIR.fullmatch(p.name) or _ASIDE.fullmatch(p.name) or _TMP.fullmatch(p.name)
            if m and p.is_dir() and int(m.group(1)) > step:
                found.append((int(m.group(1)), p.name, p))
        return [p for _, _, p in sorted(found)]

    def move_after(self, step: int, dest: Path) -> list[Path]:
        """Move every checkpoint directory past `step` (`after`) into `dest` under its own name
        (renames: nothing is copied), and point `latest` at the newest complete checkpoint left
        (none: no pointer). Returns where they went, oldest first."""
        later = self.after(step)
        if not later:
            return []
        dest.mkdir(parents=True, exist_ok=True)
        moved = []
        for p in later:
            os.replace(p, dest / p.name)
            moved.append(dest / p.name)
        fsync(dest)
        fsync(self.root)
        newest = self._newest_complete()
        if newest is None:
            (self.root / LATEST).unlink(missing_ok=True)
        else:
            with atomic_write(self.root / LATEST) as f:
                f.write(step_dir_name(int(json.loads((newest / STATE).read_text())["step"])))
        return moved

    def _clear_killed_save(self) -> None:
        """What a killed save left: a step aside (`.global_step_K.old`) is renamed back when
        its own name is free (the kill came between the renames) and removed otherwise; `.tmp`
        directories and files are removed."""
        for aside in self.root.glob(".global_step_*.old"):
            if not _ASIDE.fullmatch(aside.name):
                continue  # not a name the manager writes
            final = self.root / aside.name[1:-len(".old")]
            if not final.exists():
                os.replace(aside, final)
                fsync(self.root)
            else:
                shutil.rmtree(aside, ignore_errors=True)
        for stale in self.root.glob("global_step_*.tmp"):
            if _TMP.fullmatch(stale.name):
                shutil.rmtree(stale, ignore_errors=True)
        for stale in self.root.glob(f".{LATEST}.*.tmp"):  # atomic_write's, killed before its rename
            if _LATEST_TMP.fullmatch(stale.name) and stale.is_file():
                stale.unlink()

    def _check_space(self, name: str, expected_bytes: int) -> None:
        """Raise NoSpaceForCheckpoint unless the disk holds the checkpoint about to be saved:
        `expected_bytes` (the caller's estimate of the state being saved) or the newest
        checkpoint's size if larger (the same weights and optimizer state again)."""
        newest = self._newest_complete()
        last = sum(manifest_of(newest).values()) if newest is not None else 0
        need = max(expected_bytes, last)
        free = shutil.disk_usage(self.root).free
        if free >= need * SPACE_MARGIN:
            return
        basis = "the size of the last one" if last >= expected_bytes else "the state being saved"
        kept = f"{newest.name} is intact" if newest is not None else "no earlier checkpoint was touched"
        raise NoSpaceForCheckpoint(
            errno.ENOSPC, f"checkpoint {name} needs about {need / 2**30:.2f} GiB ({basis}) and {self.root} has "
            f"{free / 2**30:.2f} GiB free: nothing was written; {kept}. Free some space on that disk and run "
            f"the same command again to continue from it")

    def save(
        self, step: int, state: dict, config: dict, save_workers: Callable[[Path], None] | None = None,
        expected_bytes: int = 0,
    ) -> Path:
        """Write checkpoint `step`: `save_workers(dir)` writes worker states into `dir` first.
        `expected_bytes`: the size of what it will write, for the free-space check (the
        newest checkpoint's size stands in for it when larger).

        Too little room raises NoSpaceForCheckpoint before anything is written. Any failure
        (a full disk, a worker error) removes the partial `.tmp` directory and raises; the
        checkpoints saved before are left as they were."""
        final = self.root / step_dir_name(step)
        tmp = final.with_name(final.name + ".tmp")
        self.root.mkdir(parents=True, exist_ok=True)
        self._clear_killed_save()
        self._check_space(final.name, expected_bytes)
        tmp.mkdir()
        try:
            if save_workers is not None:
                save_workers(tmp)
            torch.save(rng_state(), tmp / "rng.pt")
            (tmp / "config.yaml").write_text(yaml.safe_dump(redacted(config), sort_keys=False))
            (tmp / STATE).write_text(json.dumps({"step": step, **state}, indent=1))
            (tmp / MANIFEST).write_text(json.dumps(manifest_of(tmp), indent=1))
            replace_dir(tmp, final)  # fsyncs every file first; a re-saved step is swapped whole
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):
                e.add_note(f"checkpoint {final.name} was not saved; the ones before it are unchanged")
            raise
        with atomic_write(self.root / LATEST) as f:
            f.write(final.name)
        self._prune(keep_also=final)
        return final

    @staticmethod
    def read_state(path: str | Path) -> dict:
        """The trainer state of the checkpoint at `path` (with "step"), touching nothing else;
        ValueError naming the file when it is unreadable or holds no step."""
        state_file = Path(path) / STATE
        if not state_file.exists():
            raise FileNotFoundError(f"not a checkpoint (no {STATE}): {path}")
        try:
            state = json.loads(state_file.read_text())
        except ValueError as e:  # UnicodeDecodeError is one
            raise ValueError(f"{state_file} is unreadable ({e})") from None
        if _step_of(state) is None:
            raise ValueError(f"{state_file} is not an object with an integer step")
        return state

    def load(self, path: str | Path) -> dict:
        """Restore the driver's RNG states from `path`; return its trainer state (with "step").
        A damaged checkpoint (see `damage`) is refused with the reason."""
        why = damage(path)
        if why is not None and (Path(path) / STATE).exists():
            raise ValueError(f"checkpoint {path} is damaged: {why}")
        state = self.read_state(path)  # FileNotFoundError: not a checkpoint at all
        rng = Path(path) / "rng.pt"
        saved = safe_torch_load(rng)
        try:
            set_rng_state(saved)
        except (KeyError, TypeError, IndexError, ValueError) as e:  # loaded, but not the states rng_state() saves
            raise ValueError(f"{rng} does not hold the driver's RNG states ({type(e).__name__}: {e})") from None
        return state

    def _prune(self, keep_also: Path) -> None:
        """Keep the newest `keep` complete checkpoints (and `keep_also`); remove every
        checkpoint directory older than the oldest one kept, damaged ones included."""
        if not self.keep or self.keep <= 0:
            return
        dirs = self._step_dirs()
        complete = [p for p in dirs if damage(p) is None]
        if len(complete) <= self.keep:
            return
        oldest_kept = complete[-self.keep]
        for old in dirs[: dirs.index(oldest_kept)]:
            if old != keep_also:
                shutil.rmtree(old, ignore_errors=True)
