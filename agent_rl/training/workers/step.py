"""What the actor and the critic share: AdamW with warm-up, the update loop (`UpdateLoop`:
epochs x mini-batches, one optimizer step over micro-batches with exact gradient accumulation
across micro-batches and ranks, the no-grad per-token forward), metrics.

Exactness: every micro-batch loss is aggregated with the normalisers (sampled tokens,
non-empty sequences) of the whole mini-batch over all ranks, so summing micro-batch
gradients on a rank, then summing over ranks, gives the gradient of the mini-batch loss
(agent_rl/training/algos/losses.py, "Gradient accumulation").

Metrics: a loss function returns per-micro-batch values. Keys ending in `loss` are already
shares of the mini-batch loss and are summed; every other key is a mean over the
micro-batch's sampled tokens and is weighted by its share of them. Ranks add their sums, so
each rank returns the metrics of the whole mini-batch. An update averages its mini-batches'
metrics, except the counts of optimizer steps not taken (`COUNTS`), which it sums.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from agent_rl.config import OptimConfig
from agent_rl.training.batch import TokenBatch, micro_batches, split_mini_batches
from agent_rl.training.workers import dist

log = logging.getLogger(__name__)

COUNTS = ("skipped_steps", "no_signal_steps")
"""Per-mini-batch 0/1 metrics that an update sums (counts of optimizer steps not taken), where
every other metric is a mean over its mini-batches."""


@dataclass
class Normalizers:
    """Mini-batch totals over all ranks: sampled tokens and sequences with >= 1 of them."""

    tokens: int
    seqs: int


LossFn = Callable[[TokenBatch, Normalizers], tuple[torch.Tensor, dict[str, float]]]
"""(micro-batch, mini-batch normalisers) -> (loss share with grad, per-micro-batch metrics)."""


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    """lr_warmup_steps if set (>= 0), else lr_warmup_steps_ratio * total_steps."""
    return cfg.lr_warmup_steps if cfg.lr_warmup_steps >= 0 else int(cfg.lr_warmup_steps_ratio * total_steps)


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """The multiplier of cfg.lr at 0-based trainer step `step`: linear warm-up, then constant
    or (warmup_style cosine) veRL's / HF's cosine decay to min_lr_ratio at `total_steps`."""
    warm = warmup_steps(cfg, total_steps)
    if step < warm:
        return (step + 1) / warm
    if cfg.warmup_style == "constant":
        return 1.0
    if cfg.warmup_style != "cosine":
        raise ValueError(f"optim.warmup_style={cfg.warmup_style!r}: one of constant, cosine")
    progress = min(1.0, (step - warm) / max(1, total_steps - warm))
    wave = max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * cfg.num_cycles * progress)))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * wave


class Optim:
    """AdamW + linear warm-up to a constant or cosine-decayed lr, gradient clipping,
    data-parallel sum.

    The scheduler advances once per trainer step (`end_update`), as in veRL, so warm-up
    counts training steps whatever the number of mini-batches. Warm-up step k (0-based) uses
    lr * (k + 1) / warmup: the first step already learns (veRL's schedule starts at 0).
    """

    def __init__(self, params: list[nn.Parameter], cfg: OptimConfig, total_steps: int, grad_clip: float,
                 fsdp: bool = False):
        if not params:
            raise ValueError("Optim: no trainable parameters")
        self.params = params
        self.grad_clip = grad_clip
        self.fsdp = fsdp
        # fused AdamW is one kernel per step on CPU and GPU alike (torch >= 2.4)
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
            fused=not fsdp,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: lr_factor(k, cfg, total_steps))

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def step(self) -> float:
        """Sum gradients over ranks, clip, step (skipped when the norm is not finite)."""
        if not self.fsdp:  # FSDP reduce-scatters gradients in backward itself
            dist.sum_gradients(self.params)
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def end_update(self) -> None:
        with warnings.catch_warnings():
            # the schedule counts trainer steps, also one whose mini-batches all took no optimizer
            # step (no signal, a non-finite gradient): torch's warning on that order is moot here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def normalizers(mask: torch.Tensor) -> Normalizers:
    """`agg_normalizers` of this rank's mini-batch mask, summed over ranks."""
    from agent_rl.training.algos import agg_normalizers

    tokens, seqs = agg_normalizers(mask) if mask.numel() else (0, 0)
    tokens, seqs = dist.all_reduce_sum([float(tokens), float(seqs)])
    return Normalizers(tokens=int(tokens), seqs=int(seqs))


def combine_metrics(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Mini-batch metrics from (token share, metrics) of each micro-batch on every rank.

    Losses are built as shares of the mini-batch loss, so they add up. Every other metric is
    a per-token mean, weighted by the tokens of the micro-batches that ran: when sequences were
    skipped (all-zero advantages) the shares sum to less than 1, and dividing by the shares
    that ran keeps e.g. tis_weight_mean ~1 and the entropy a mean, not scaled down by the
    skipped fraction."""
    local: dict[str, float] = {}
    ran = sum(share for share, _ in parts)
    for share, metrics in parts:
        for k, v in metrics.items():
            local[k] = local.get(k, 0.0) + (v if k.endswith("loss") else v * share)
    if dist.world_size() > 1:  # ranks may hold different keys (an empty shard has none)
        keys = sorted(set().union(*dist.all_gather_objects(sorted(local))))
        ran, *values = dist.all_reduce_sum([ran, *(local.get(k, 0.0) for k in keys)])
        local = dict(zip(keys, values))
    return {k: v if k.endswith("loss") or ran <= 0 else v / ran for k, v in local.items()}


def equalise(parts: list[TokenBatch], whole: TokenBatch, fsdp: bool) -> list[tuple[TokenBatch, bool]]:
    """(micro-batch, is_real). Under FSDP every rank must run the same number of forwards
    (each gathers parameters collectively): pad with zero-weight copies of one sequence."""
    out = [(p, True) for p in parts]
    if not fsdp:
        return out
    (most,) = dist.all_reduce_max([float(len(parts))])
    if len(parts) < most and len(whole) == 0:
        raise RuntimeError("FSDP rank with an empty shard: give every rank at least one sequence")
    return out + [(whole.select([0]), False)] * (int(most) - len(parts))


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over mini-batches (and epochs)."""
    keys = {k for r in rows for k in r}
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}


class UpdateLoop:
    """The update loop the actor and the critic share; each supplies only its loss (and its
    forward for the no-grad pass):

    - `per_token(batch, forward, ...)`: a no-grad forward over micro-batches, (B, R) float32
      per response token (log-probs, values), 0 in padding;
    - `epochs(batch, loss_fn, ...)`: PPO epochs x mini-batches, one optimizer step each. The
      number of mini-batches is ceil(sequences present on all ranks / mini-batch size in
      sequences), so a batch short of a few sequences (trajectories left out for a failed
      tool call) is not padded with an extra, tiny step; every rank takes the same number;
    - `mini_batch(mini, loss_fn, ...)`: micro-batch accumulation with the mini-batch's
      normalisers (exact, see the module docstring), then the optimizer step;
    - `end(rows, prefix)`: the metrics of the update, the scheduler step, `num_updates`.
    """

    def __init__(self, model: nn.Module, optim: Optim, *, fsdp: bool, world_size: int, state_masking: bool,
                 use_dynamic_bsz: bool, max_token_len: int, micro_batch_size: int):
        self.model, self.optim = model, optim
        self.fsdp, self.world_size, self.state_masking = fsdp, world_size, state_masking
        self.use_dynamic_bsz, self.max_token_len, self.micro_batch_size = use_dynamic_bsz, max_token_len, micro_batch_size
        self.num_updates = 0
        """Completed updates (scheduler steps): seeds the mini-batch shuffle, saved in checkpoints."""

    @torch.no_grad()
    def per_token(self, batch: TokenBatch, forward: Callable[[TokenBatch], torch.Tensor], max_token_len: int,
                  micro_batch_size: int) -> torch.Tensor:
        local = dataclasses.replace(batch, index=torch.arange(len(batch)))
        out = torch.zeros(len(batch), batch.loss_mask.shape[1])
        parts = micro_batches(local, self.use_dynamic_bsz, max_token_len, micro_batch_size)
        for mb, real in equalise(parts, local, self.fsdp):
            v = forward(mb)
            if real:
                out[mb.index, : v.shape[1]] = v.float().cpu()
        return out

    def epochs(self, batch: TokenBatch, loss_fn: LossFn, prefix: str, *, epochs: int, mini_size: int, shuffle: bool,
               active: Callable[[TokenBatch], torch.Tensor] | None = None) -> dict[str, float]:
        """`epochs` passes over this rank's shard in mini-batches of about `mini_size`
        sequences. `active(mini)` (bool per sequence): only those run a forward/backward (the
        others would add exactly no gradient); the normalisers still count them."""
        (total,) = dist.all_reduce_sum([float(len(batch))])
        n_mini = max(1, -(-int(total) // mini_size))
        rows = []
        for epoch in range(epochs):
            seed = self.num_updates * epochs + epoch
            for mini in split_mini_batches(batch, mini_size, shuffle, seed, num_mini_batches=n_mini):
                rows.append(self.mini_batch(mini, loss_fn, prefix, active(mini) if active is not None else None))
        return self.end(rows, prefix)

    def mini_batch(self, mini: TokenBatch, loss_fn: LossFn, prefix: str,
                   active: torch.Tensor | None = None) -> dict[str, float]:
        """One optimizer step on `mini`; `prefix/*` metrics of the whole mini-batch (all ranks).

        No step when no sequence is active on any rank: a zero gradient would still move the
        weights (AdamW's decay, the moments of earlier steps) and age Adam's state for a
        mini-batch with nothing to learn (`no_signal_steps`). A step whose gradient norm is not
        finite is not taken either (`Optim.step`), counted as `skipped_steps` and warned by `end`."""
        results = self.backward(mini, loss_fn, active)
        out = {f"{prefix}/{k}": v for k, v in combine_metrics(results).items()}
        if active is not None:
            out[f"{prefix}/skipped_sequences"] = float(len(mini) - int(active.sum()))
            (n_active,) = dist.all_reduce_sum([float(active.sum())])  # every rank skips alike
            if n_active == 0:
                self.optim.optimizer.zero_grad(set_to_none=True)
                return {**out, f"{prefix}/no_signal_steps": 1.0, f"{prefix}/skipped_steps": 0.0}
        grad_norm = self.optim.step()
        out[f"{prefix}/grad_norm"] = grad_norm
        out[f"{prefix}/no_signal_steps"] = 0.0
        out[f"{prefix}/skipped_steps"] = 0.0 if math.isfinite(grad_norm) else 1.0
        return out

    def backward(self, mini: TokenBatch, loss_fn: LossFn,
                 active: torch.Tensor | None = None) -> list[tuple[float, dict[str, float]]]:
        """Accumulate this rank's share of the mini-batch gradient over its micro-batches;
        returns (token share, metrics) per micro-batch. `active`: run only those sequences."""
        self.model.train()
        norm = normalizers(mini.mask(self.state_masking))
        run = mini
        if active is not None and not bool(active.all()):
            run = mini.select(active.nonzero().flatten())
        # nothing left: the optimizer step sees zero gradients (under FSDP, equalise still runs
        # this rank's share of the collective forwards with zero-weight copies)
        parts = micro_batches(run, self.use_dynamic_bsz, self.max_token_len, self.micro_batch_size) if len(run) else []
        results = []
        for mb, real in equalise(parts, mini, self.fsdp):
            loss, metrics = loss_fn(mb, norm)
            # FSDP averages gradients over ranks; the loss shares are built to be summed
            scale = (self.world_size if self.fsdp else 1.0) if real else 0.0
            (loss * scale).backward()
            if real:
                share = float(mb.mask(self.state_masking).sum()) / max(norm.tokens, 1)
                results.append((share, metrics))
        return results

    def end(self, rows: list[dict[str, float]], prefix: str) -> dict[str, float]:
        metrics = mean_metrics(rows)
        for key in COUNTS:
            metrics[f"{prefix}/{key}"] = sum(r.get(f"{prefix}/{key}", 0.0) for r in rows)
        skipped = int(metrics[f"{prefix}/skipped_steps"])
        # a non-finite gradient is a fault (an overflow, a NaN in the data), not a quiet event:
        # one line per update, from one rank (every rank saw the same all-reduced norm)
        if skipped and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
            log.warning("%s update %d: %d of %d optimizer steps skipped for a non-finite gradient norm; "
                        "their mini-batches left the weights unchanged", prefix, self.num_updates + 1, skipped, len(rows))
        metrics[f"{prefix}/lr"] = self.optim.lr
        self.optim.end_update()
        self.num_updates += 1
        return metrics


class UpdateLoopWorker:
    """A worker whose updates run on `self.loop` (an UpdateLoop): its update count, which seeds
    the mini-batch order and is saved in its checkpoints."""

    loop: UpdateLoop

    @property
    def num_updates(self) -> int:
        """Completed updates (scheduler steps)."""
        return self.loop.num_updates

    @num_updates.setter
    def num_updates(self, value: int) -> None:
        self.loop.num_updates = value

    def state_bytes(self) -> int:
        """About what this worker's checkpoint takes on disk: every parameter (saved whole;
        LoRA: merged, so the frozen base counts) and the optimizer's state tensors (AdamW:
        two moments each). The driver checks the disk for it before the first save."""
        optim_state = self.loop.optim.optimizer.state.values()
        tensors = [*self.loop.model.parameters(), *(t for s in optim_state for t in s.values() if torch.is_tensor(t))]
        return sum(t.numel() * t.element_size() for t in tensors)
