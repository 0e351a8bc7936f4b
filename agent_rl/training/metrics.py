"""Namespaced metrics (`actor/pg_loss`, `rollout/num_searches`, `timing/gen`) to several sinks.

Only the driver writes metrics: workers return dicts, the trainer merges them and calls
`MetricsLogger.log` once per step. Sinks: a console line, TensorBoard, a jsonl file
(`<run_dir>/metrics.jsonl`, one object per step, the source for `agent_rl.evaluation.plot`), and W&B
when it is installed and "wandb" is in `trainer.logger`.

The jsonl file survives a kill or a full disk at any instant: rows are appended whole and
flushed, a partial last line is skipped (with a warning naming file:line) by every reader
(`data_prep.io.read_jsonl_rows`), and the rewrite on resume replaces the file atomically.

Each validation's questions, one row each, go to `<trainer.validation_data_dir>/<step>.jsonl`
(`write_validation`, `validation_rows`), so two validations compare question by question.

What a step measures: `StepTimer` (timing/*), `reward_metrics` (reward/* of a collection),
`batch_metrics` (batch/*, adv/* of the trained batch).
"""

from __future__ import annotations

import json
import math
import numbers
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from agent_rl.config import redacted
from data_prep.atomic import atomic_write
from data_prep.io import read_jsonl_rows

if TYPE_CHECKING:
    import torch

    from agent_rl.training.batch import TokenBatch

JSONL = "metrics.jsonl"
SINKS = ("console", "tensorboard", "jsonl", "wandb")
# Shown on the console line when present, in this order (the rest go to the files only).
CONSOLE_KEYS = (
    "reward/mean",
    "reward/em",
    "val/em",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "critic/vf_loss",
    "rollout/response_length",
    "rollout/num_searches",
    "timing/step",
)


def check_metrics(metrics: dict) -> dict[str, float]:
    """Keys must be namespaced `group/name`; values scalar numbers (tensors are unwrapped)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or "/" not in key.strip("/"):
            raise ValueError(f"metric key {key!r} is not namespaced (expected 'group/name')")
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}")
        out[key] = float(value)
    return out


class RisingRate:
    """Watches a per-step rate (e.g. `rollout/invalid_action_rate`) and says when it doubles
    over its running mean: a search agent going wrong shows in its protocol before its reward
    drops. The mean covers the steps before the current one; it needs `min_steps` of them, and
    a rate under `floor` is never a warning."""

    def __init__(self, key: str, factor: float = 2.0, min_steps: int = 3, floor: float = 0.05):
        self.key, self.factor, self.min_steps, self.floor = key, factor, min_steps, floor
        self.total = 0.0
        self.steps = 0

    def update(self, metrics: dict, step: int) -> str | None:
        """Record this step's value (if present); the warning text when it rose, else None."""
        value = metrics.get(self.key)
        if value is None:
            return None
        value = float(value)
        mean = self.total / self.steps if self.steps else None
        self.total += value
        self.steps += 1
        metrics[f"{self.key}_running_mean"] = self.total / self.steps
        if mean is None or self.steps <= self.min_steps or value < self.floor or value < self.factor * mean:
            return None
        return (f"step {step}: {self.key} is {value:.3f}, {value / mean if mean > 0 else float('inf'):.1f}x its running "
                f"mean {mean:.3f}: the policy is breaking the action protocol (see rollout/bad_tool_calls)")


def read_jsonl(run_dir: str | Path) -> list[dict]:
    """All rows of a run's metrics file (one dict per logged step); an unreadable line (a
    partial last one from a killed run) is skipped with a warning."""
    path = Path(run_dir) / JSONL
    if not path.exists():
        raise FileNotFoundError(f"no {JSONL} in {run_dir}")
    return read_jsonl_rows(path)


def validation_points(run_dir: str | Path) -> list[tuple[int, float, float]]:
    """The run's validations as (step, training minutes, val/em), by step: step 0 is the model
    before training; training minutes are `training/elapsed_s`, which leaves validations out."""
    rows = [r for r in read_jsonl(run_dir) if isinstance(r.get("val/em"), (int, float))]
    return sorted((int(r["step"]), r.get("training/elapsed_s", 0.0) / 60, float(r["val/em"])) for r in rows)


def write_validation(out_dir: str | Path, step: int, rows: list[dict]) -> Path:
    """One validation's questions, a row each, to `<out_dir>/<step>.jsonl` (trainer.validation_data_dir),
    replaced whole: a killed write leaves the step's earlier file or none."""
    path = Path(out_dir) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return path


def validation_rows(out_dir: str | Path, step: int) -> dict[str, float]:
    """{question id: metric} of the validation at `step` (write_validation's file). Raises
    FileNotFoundError when there is none, ValueError naming the file when a row has no id or
    no numeric metric, or an id comes twice."""
    path = Path(out_dir) / f"{step}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no validation of step {step} in {out_dir}")
    out: dict[str, float] = {}
    for i, row in enumerate(read_jsonl_rows(path), 1):
        qid, metric = row.get("id"), row.get("metric")
        if not isinstance(qid, str) or isinstance(metric, bool) or not isinstance(metric, numbers.Real):
            raise ValueError(f"{path}: row {i} needs a text id and a numeric metric, got {qid!r}, {metric!r}")
        if qid in out:
            raise ValueError(f"{path}: question {qid!r} comes twice")
        out[qid] = float(metric)
    return out


def _after(step, resume_step: int) -> bool:
    return isinstance(step, numbers.Real) and not isinstance(step, bool) and step > resume_step


class MetricsLogger:
    """Writes one dict of metrics per step to the configured sinks.

    `resume_step`: on resume, rows logged after the checkpoint (by the killed run) are dropped
    from the jsonl and TensorBoard purges its events past that step, so curves stay single.
    An existing jsonl is rewritten without its unreadable lines (a partial last line from a
    kill or a full disk), atomically: a failed rewrite leaves the file as it was.
    """

    def __init__(
        self,
        run_dir: str | Path,
        sinks: list[str],
        config: dict | None = None,
        project: str = "agent_rl",
        experiment: str = "run",
        resume_step: int | None = None,
    ):
        unknown = set(sinks) - set(SINKS)
        if unknown:
            raise ValueError(f"trainer.logger: unknown sink(s) {sorted(unknown)}; valid: {list(SINKS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = list(sinks)
        self._tb = self._jsonl = self._wandb = None
        if "jsonl" in sinks:
            path = self.run_dir / JSONL
            if path.exists():
                self._rewrite_jsonl(path, resume_step)
            self._jsonl = path.open("a")
        if "tensorboard" in sinks:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge)
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError:
                print("[metrics] 'wandb' is in trainer.logger but wandb is not installed: skipping it")
            else:
                shown = redacted(config) if config is not None else None  # W&B keeps the run's config
                self._wandb = wandb.init(project=project, name=experiment, config=shown, resume="allow")

    @staticmethod
    def _rewrite_jsonl(path: Path, resume_step: int | None) -> None:
        """Keep the readable rows up to `resume_step` (all when None); appending after a
        partial last line would otherwise glue the next row onto it. Only a row whose step is a
        number past `resume_step` was logged after the checkpoint: one without a numeric step
        (added by hand or another tool) is kept, not a reason to fail the resume."""
        rows = read_jsonl_rows(path)
        kept = [r for r in rows if resume_step is None or not _after(r.get("step"), resume_step)]
        with atomic_write(path) as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)

    def log(self, metrics: dict, step: int, extra: dict | None = None) -> None:
        """Log scalar `metrics` at `step`; `extra` (e.g. consumed prompt ids) goes to jsonl only."""
        scalars = check_metrics(metrics)
        if "console" in self.sinks:
            print(self.console_line(scalars, step), flush=True)
        if self._jsonl is not None:
            row = {"step": step, **scalars, **(extra or {})}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    @staticmethod
    def console_line(scalars: dict[str, float], step: int) -> str:
        parts = [f"step {step}"]
        for key in CONSOLE_KEYS:
            if key in scalars:
                v = scalars[key]
                parts.append(f"{key} {v:.3g}" if math.isfinite(v) else f"{key} {v}")
        return " | ".join(parts)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def reward_metrics(results: list, kind: str) -> dict[str, float]:
    """reward/* of a collection from its RewardResults: mean reward, the task metric (`kind`), format flags."""
    n = max(1, len(results))
    return {
        "reward/mean": sum(r.score for r in results) / n,
        f"reward/{kind}": sum(r.metric for r in results) / n,
        "reward/valid_format": sum(r.valid_format for r in results) / n,
        "reward/retrieval_hit": sum(r.retrieval_hit for r in results) / n,
        "reward/has_answer": sum(r.answer is not None for r in results) / n,
    }


class StepTimer:
    """`with timer("gen"): ...` accumulates seconds per name; `.metrics()` -> timing/*."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.seconds.items()}


def batch_metrics(batch: TokenBatch, mask: torch.Tensor) -> dict[str, float]:
    """Data statistics of the trained batch (veRL's compute_data_metrics, our names)."""
    import torch  # here: the metrics readers (plots, reports) do not load torch

    m = mask.bool()
    adv = batch.advantages[m]
    out = {
        "batch/num_sequences": float(len(batch)),
        "batch/num_tokens": float(batch.num_tokens),
        "batch/sampled_tokens": float(m.sum()),
        "batch/response_length": batch.response_lens.float().mean().item(),
        "adv/mean": adv.mean().item() if adv.numel() else 0.0,
        "adv/abs_max": adv.abs().max().item() if adv.numel() else 0.0,
        # sequences with a nonzero advantage (the others add no policy gradient): rejection sampling's kept share
        "adv/nonzero_frac": (torch.where(m, batch.advantages, 0.0) != 0).any(dim=1).float().mean().item(),
    }
    if batch.old_logprobs is not None and m.any():  # bf16 engine vs trainer: what TIS corrects
        out["rollout/logprob_abs_diff"] = (batch.old_logprobs - batch.rollout_logprobs)[m].abs().mean().item()
    if batch.values is not None:
        out["critic/values_mean"] = batch.values[m].mean().item()
        out["critic/returns_mean"] = batch.returns[m].mean().item()
    return out
