"""Run-level checkpoints: step, data-loader position, RNG states, config, and worker states.

Layout under `<run_dir>/checkpoints/`:

    global_step_20/
        trainer_state.json   step, loader position, kl controller, anything small
        rng.pt               python / numpy / torch RNG states of the driver
        config.yaml          the resolved config the run used
        actor/  critic/      written by the workers' own `save(dir)`
    latest                   text file naming the newest complete checkpoint (for people
                             and tools; `CheckpointManager.latest()` scans)

A checkpoint is written into `global_step_K.tmp/` and renamed when complete, then `latest`
is replaced atomically, so a run killed at any moment (SIGKILL included) leaves either the
previous or the new checkpoint, never half of one. Only the newest `keep` are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

LATEST = "latest"
STATE = "trainer_state.json"


def step_dir_name(step: int) -> str:
    return f"global_step_{step}"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class CheckpointManager:
    """Saves and finds run checkpoints under `root` (see module docstring)."""

    def __init__(self, root: str | Path, keep: int | None = None):
        self.root = Path(root)
        self.keep = keep

    def latest(self) -> Path | None:
        """The newest complete checkpoint (one with its trainer_state.json), or None.

        Found by scanning, not from the `latest` pointer: a kill between the rename and the
        pointer update leaves the pointer one checkpoint behind."""
        done = self._complete()
        return done[-1] if done else None

    def _complete(self) -> list[Path]:
        dirs = [p for p in self.root.glob("global_step_*") if not p.name.endswith(".tmp") and (p / STATE).exists()]
        return sorted(dirs, key=lambda p: int(p.name.rsplit("_", 1)[1]))

    def save(
        self, step: int, state: dict, config: dict, save_workers: Callable[[Path], None] | None = None
    ) -> Path:
        """Write checkpoint `step`: `save_workers(dir)` writes worker states into `dir` first."""
        final = self.root / step_dir_name(step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if save_workers is not None:
            save_workers(tmp)
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / STATE).write_text(json.dumps({"step": step, **state}, indent=1))
        if final.exists():  # re-saving the same step (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer_tmp = self.root / (LATEST + ".tmp")
        pointer_tmp.write_text(final.name)
        os.replace(pointer_tmp, self.root / LATEST)
        self._prune(keep_also=final)
        return final

    @staticmethod
    def read_state(path: str | Path) -> dict:
        """The trainer state of the checkpoint at `path` (with "step"), touching nothing else."""
        state_file = Path(path) / STATE
        if not state_file.exists():
            raise FileNotFoundError(f"not a checkpoint (no {STATE}): {path}")
        return json.loads(state_file.read_text())

    def load(self, path: str | Path) -> dict:
        """Restore the driver's RNG states from `path`; return its trainer state (with "step")."""
        state = self.read_state(path)
        set_rng_state(torch.load(Path(path) / "rng.pt", weights_only=False))
        return state

    def _prune(self, keep_also: Path) -> None:
        if not self.keep or self.keep <= 0:
            return
        for old in self._complete()[: -self.keep]:
            if old != keep_also:
                shutil.rmtree(old, ignore_errors=True)
