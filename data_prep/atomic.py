"""Durable output: a file or directory appears complete at its final path or not at all,
and stays complete after a kill or a power loss.

A rename is atomic but not durable by itself: until the new data and the directory entries
reach the disk, a power loss can leave the new name pointing at empty or short files (ext4's
delayed allocation, XFS). So every writer here fsyncs the data before the rename and the
directory after it (https://lwn.net/Articles/457667/, https://danluu.com/file-consistency/).

The one place for this in the repository: data_prep's converters and index builder, and
agent_rl's checkpoints, metrics and SFT model all use these helpers (agent_rl may import
data_prep, not the other way round).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

COMPLETE = ".complete"
"""The marker a tool writes last into an output directory (before `replace_dir`): its presence
means the directory is complete and that this tool may replace it (`check_replaceable`)."""


def fsync(path: str | Path) -> None:
    """Flush a file's data, or a directory's entries (creations, renames, removals), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under `root` (itself included), whoever wrote them
    (e.g. the workers' files inside a checkpoint directory)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                fsync(p)
        fsync(dirpath)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` when the block succeeds.

    The temporary file lives in the same directory, so the final ``os.replace`` is atomic:
    readers see either the old file or the complete new one, never a half-written file; it
    is fsynced before the rename and the directory after it, so this holds after a power loss
    too. On any exception (including KeyboardInterrupt, or a full disk) the temporary file
    is removed and the previous file is left as it was (an OSError gets a note saying so).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        fsync(tmp_path)
        os.replace(tmp_path, path)
    except BaseException as e:
        tmp_path.unlink(missing_ok=True)
        if isinstance(e, OSError):  # e.g. a full disk: say which file and that it is intact
            e.add_note(f"{path} was not written (what it held before, if anything, is unchanged)")
        raise
    fsync(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a file for writing that appears at `path` only if the block completes."""
    binary = "b" in mode
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=None if binary else encoding) as f:
            yield f


def replace_dir(tmp: str | Path, final: str | Path) -> None:
    """Make the finished directory `tmp` appear as `final`, durably.

    Everything under `tmp` is fsynced, then it is renamed to `final` and the parent fsynced.
    An existing `final` is moved aside to `.<name>.old` first and removed only after the
    rename, so a kill at any instant leaves the old or the new directory complete under one
    of those names (never a mix). Callers decide whether `final` may be replaced
    (`check_replaceable`)."""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def temp_dir_beside(final: str | Path) -> Path:
    """A new, uniquely named hidden directory beside `final` (same file system, so
    `replace_dir` can rename it into place), with the permissions a plain mkdir gives: a fixed
    name would have to be cleared first, and could be someone else's."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would become the output's
    return tmp


def check_replaceable(out: str | Path, marker: str, what: str, how: str, own: tuple[str, ...] | None = None) -> None:
    """Raise FileExistsError unless `out` is absent, an empty directory, or a directory this
    tool completed before (it holds `marker`): a tool never deletes what it did not create.
    With `own` (the names the tool writes), a directory it completed that holds anything else
    too (an index built inside it since) is refused as well: replacing it would delete that.

    `what` names the output ("a prepared model"), `how` the way out ("use another --out")."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if out.is_dir() and not out.is_symlink() and (out / marker).exists():
        foreign = sorted(p.name for p in out.iterdir() if own is not None and p.name not in (*own, marker))
        if not foreign:
            return
        raise FileExistsError(f"{out} holds {', '.join(foreign)}, which this tool did not write; refusing to replace "
                              f"it with {what}: {how}")
    kind = "a symbolic link" if out.is_symlink() else "a directory" if out.is_dir() else "a file"
    raise FileExistsError(
        f"{out} exists and is {kind} not written by this tool (no {marker} in it); refusing to replace it "
        f"with {what}: {how}"
    )
