"""Loss aggregation, PPO policy loss, value loss and entropy.

All per-token inputs are (B,T) with a `mask` that is 1 on tokens the policy sampled; masked
positions contribute nothing to a loss, its gradient or a metric. Losses return
`(scalar, metrics)` with metrics as plain floats (unprefixed; the driver namespaces them).

Gradient accumulation: a mini-batch split into micro-batches gives exactly the mini-batch
gradient when every micro-batch loss is aggregated with the mini-batch's normalisers
(`agg_normalizers(mini_batch_mask)` -> `global_tokens`, `global_seqs`) and the micro-batch
losses are summed (backward on each, no division by the number of micro-batches). With DDP,
which averages gradients over W workers, pass normalisers computed over all workers' data
divided by W (or all-reduce the counts and multiply the loss by W).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from agent_rl.training.algos.masked import as_bool_mask, masked_mean, masked_sum
from agent_rl.training.algos.registry import cfg_get, register_policy_loss

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")

LOG_RATIO_CLAMP = 20.0
"""|log pi/pi_old| is clamped before exp so a stale token cannot overflow the ratio (veRL)."""


# ----------------------------------------------------------------------------- aggregation
def agg_normalizers(mask: torch.Tensor) -> tuple[int, int]:
    """(tokens, sequences) of a (mini-)batch: masked tokens, and rows with >= 1 masked token.

    These are the denominators `agg_loss` uses by default; compute them once on the whole
    mini-batch and pass them to every micro-batch's `agg_loss` for exact accumulation.
    """
    m = mask.bool()
    return int(m.sum()), int(m.any(dim=-1).sum())


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss (B,T) over masked tokens into a scalar.

    Modes (weights each sampled token t of row i gets; L_i = its number of sampled tokens,
    N = total sampled tokens, S = number of non-empty rows):

    - "token-mean": 1/N. Every token counts the same, so long responses weigh more in total
      but no token is up- or down-weighted by its response's length. DAPO (Yu et al. 2025,
      arXiv:2503.14476) recommends it for long reasoning.
    - "seq-mean-token-mean": 1/(S*L_i). The original GRPO objective: each response counts the
      same, so tokens of short responses weigh more. Dr.GRPO (Liu et al. 2025,
      arXiv:2503.20783) shows the bias this creates: short correct answers are pushed harder,
      and long wrong answers are penalised less, so responses grow when the model is wrong.
    - "seq-mean-token-sum": 1/S. No 1/L_i factor, hence no per-token length bias (Dr.GRPO
      divides the sum by a constant instead); the loss scale grows with response length.

    `global_tokens` / `global_seqs` replace N / S (see module doc on gradient accumulation).
    A denominator of 0 (and only 0) is treated as 1, so an all-masked batch gives 0, not NaN.
    """
    m = as_bool_mask(mask, loss_mat, "agg_loss")
    if mode == "token-mean":
        denom = m.sum() if global_tokens is None else global_tokens
        return masked_sum(loss_mat, m) / _clamp1(denom, loss_mat)
    row_sum = masked_sum(loss_mat, m, dim=-1)
    if mode == "seq-mean-token-mean":
        row = row_sum / m.sum(dim=-1).clamp(min=1).to(loss_mat.dtype)
    elif mode == "seq-mean-token-sum":
        row = row_sum
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {list(AGG_MODES)}")
    denom = m.any(dim=-1).sum() if global_seqs is None else global_seqs
    return row.sum() / _clamp1(denom, loss_mat)


def _clamp1(denom, like: torch.Tensor) -> torch.Tensor:
    """`denom`, or 1 where it is 0 (an all-masked batch). Only 0 is replaced: a data-parallel
    normaliser divided by W (module doc) is below 1 on a worker holding less than one
    sequence's share, and clamping it to 1 would shrink that loss by W/S."""
    d = torch.as_tensor(denom, dtype=like.dtype, device=like.device)
    return torch.where(d > 0, d, torch.ones_like(d))


# ----------------------------------------------------------------------------- policy loss
@register_policy_loss("vanilla")
def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg=None,
    rollout_logp: torch.Tensor | None = None,
    *,
    global_tokens=None,
    global_seqs=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher, dual-clip and truncated importance sampling.

    Inputs (B,T): `logp` current policy (carries the gradient), `old_logp` the trainer's
    log-probs of the behaviour policy, `advantages`, `mask`; optional `rollout_logp` from the
    rollout engine. `cfg` is the `ActorConfig` (clip_ratio, clip_ratio_low, clip_ratio_high,
    clip_ratio_c, tis_cap, loss_agg_mode).

    Per token, with r = exp(logp - old_logp):
      1. PPO clip (arXiv:1707.06347) with separate bounds (clip-higher, DAPO arXiv:2503.14476):
             l = max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high))
      2. dual-clip (Ye et al. 2020, arXiv:1912.09729), for A < 0 only: l = min(l, -A*c), which
         bounds the loss of a negative-advantage token whose ratio has exploded;
      3. truncated importance sampling when cfg.tis_cap is set (Yao et al. 2025, "Your
         efficient RL framework secretly brings you off-policy RL training"): the engine
         sampled with its own numerics (e.g. bf16), so l = l * min(exp(old_logp -
         rollout_logp), tis_cap) reweights towards the trainer's old policy.
    The TIS weight is a constant (no gradient). Aggregated with `agg_loss(cfg.loss_agg_mode)`.

    Metrics (masked means over this batch): pg_loss; pg_clipfrac (tokens where a clip bound
    is active, either side); pg_clipfrac_ratio_high (A>0 and r>1+eps_high);
    pg_clipfrac_ratio_low (A<0 and r<1-eps_low); pg_clipfrac_lower (dual-clip active, veRL's
    name); ppo_kl (mean of old_logp - logp, the k1 estimate of KL(old || new)); with TIS:
    tis_weight_mean and tis_capfrac.
    """
    m = as_bool_mask(mask, logp, "policy loss")
    for name, x in (("old_logp", old_logp), ("advantages", advantages)):
        if x.shape != logp.shape:
            raise ValueError(f"policy loss: {name} shape {tuple(x.shape)} != logp shape {tuple(logp.shape)}")
    eps = float(cfg_get(cfg, "clip_ratio", 0.2))
    eps_low = float(cfg_get(cfg, "clip_ratio_low", eps))
    eps_high = float(cfg_get(cfg, "clip_ratio_high", eps))
    c = float(cfg_get(cfg, "clip_ratio_c", 3.0))
    if c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {c}")
    tis_cap = cfg_get(cfg, "tis_cap", None)
    mode = cfg_get(cfg, "loss_agg_mode", "token-mean")

    # Neutral values at masked positions (ratio 1, A 0, TIS weight 1): garbage there (inf/NaN
    # from padding) must not reach the gradient, where 0 * inf is NaN.
    old_logp = torch.where(m, old_logp, logp.detach())
    advantages = torch.where(m, advantages, torch.zeros_like(advantages))
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    dual = -advantages * c
    neg = advantages < 0
    loss = torch.where(neg, torch.minimum(loss, dual), loss)

    metrics: dict[str, float] = {}
    if tis_cap is not None:
        if rollout_logp is None:
            raise ValueError("tis_cap is set but rollout_logp was not passed to the policy loss")
        if rollout_logp.shape != logp.shape:
            shapes = f"{tuple(rollout_logp.shape)} != logp shape {tuple(logp.shape)}"
            raise ValueError(f"policy loss: rollout_logp shape {shapes}")
        rollout_logp = torch.where(m, rollout_logp, old_logp)
        raw_w = torch.exp((old_logp - rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
        w = raw_w.clamp(max=float(tis_cap))
        loss = loss * w
        metrics["tis_weight_mean"] = masked_mean(w, m).item()
        metrics["tis_capfrac"] = masked_mean((raw_w > float(tis_cap)).float(), m).item()

    pg_loss = agg_loss(loss, m, mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        metrics.update(
            pg_loss=pg_loss.item(),
            pg_clipfrac=masked_mean((clipped > unclipped).float(), m).item(),
            pg_clipfrac_ratio_high=masked_mean(((advantages > 0) & (ratio > 1.0 + eps_high)).float(), m).item(),
            pg_clipfrac_ratio_low=masked_mean((neg & (ratio < 1.0 - eps_low)).float(), m).item(),
            pg_clipfrac_lower=masked_mean((neg & (torch.maximum(unclipped, clipped) > dual)).float(), m).item(),
            ppo_kl=masked_mean(-log_ratio, m).item(),
        )
    return pg_loss, metrics


@register_policy_loss("rft")
def rft_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg=None,
    rollout_logp: torch.Tensor | None = None,
    *,
    global_tokens=None,
    global_seqs=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection sampling fine-tuning: SFT's loss, the NLL of the sampled tokens, on the kept
    trajectories.

    Inputs (B,T): `logp` current policy (carries the gradient); `advantages` are the keep
    weights of the `rejection_sampling` estimator (1 on a kept trajectory's sampled tokens, 0
    elsewhere); `mask` the sampled tokens. Per token l = -w * logp, aggregated with
    `agg_loss(cfg.loss_agg_mode)` and the mini-batch's normalisers. A trajectory not kept adds
    0 and its tokens still count in the normaliser, as GRPO's zero-advantage ones do: with
    token-mean the loss is the kept tokens' summed NLL over all sampled tokens, i.e. an SFT step
    on the kept set scaled by their share: REINFORCE with the 0/1 outcome and no baseline (RAFT
    as Xiong et al. 2025, arXiv:2504.11343, compare it with GRPO), a step of GRPO's size at one lr.
    No ratio and no clip: the samples are the policy's own, so `old_logp` and `rollout_logp`
    (tis_cap) are not read.

    Metrics: pg_loss (the aggregated loss); rft_nll (mean NLL of the kept tokens: SFT's loss on
    them, exact when the trajectories not kept skip the update, i.e. without entropy or KL terms).
    """
    m = as_bool_mask(mask, logp, "rft loss")
    if advantages.shape != logp.shape:
        raise ValueError(f"rft loss: advantages shape {tuple(advantages.shape)} != logp shape {tuple(logp.shape)}")
    # garbage (inf / NaN) at masked positions must not reach the gradient, where 0 * inf is NaN
    weights = torch.where(m, advantages, torch.zeros_like(advantages))
    nll = torch.where(m, -logp, torch.zeros_like(logp))
    loss = agg_loss(weights * nll, m, cfg_get(cfg, "loss_agg_mode", "token-mean"),
                    global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        metrics = {"pg_loss": loss.item(), "rft_nll": masked_mean(nll, m & (weights > 0)).item()}
    return loss, metrics


# ----------------------------------------------------------------------------- value loss
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens=None,
    global_seqs=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 / veRL): 0.5 * agg(max((V-R)^2, (clip(V, V_old +- c) - R)^2)).

    (B,T) inputs: `values` current critic output (carries the gradient), `old_values` the
    critic's output at rollout time, `returns` GAE targets. Metrics: vf_loss, vf_clipfrac
    (tokens where the clipped term is the larger one), vpred_mean.
    """
    m = as_bool_mask(mask, values, "value loss")
    old_values = torch.where(m, old_values, values.detach())
    returns = torch.where(m, returns, values.detach())
    v_clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    l1 = (values - returns) ** 2
    l2 = (v_clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(l1, l2), m, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        metrics = {
            "vf_loss": loss.item(),
            "vf_clipfrac": masked_mean((l2 > l1).float(), m).item(),
            "vpred_mean": masked_mean(values, m).item(),
        }
    return loss, metrics


# ----------------------------------------------------------------------------- entropy
def _entropy_rows(z: torch.Tensor) -> torch.Tensor:
    z = z.float()  # bf16 logsumexp over a 50k vocab loses too much precision
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Per-token entropy H = logsumexp(z) - sum softmax(z) * z, (B,T,V) -> (B,T) float32.

    Rows are processed `chunk_size` positions at a time so the float32 softmax of the whole
    (B,T,V) tensor never exists at once; under autograd each chunk is checkpointed, so only
    the logits (already alive) are kept for backward.
    """
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, B * T, chunk_size):
        chunk = flat[start : start + chunk_size]
        parts.append(checkpoint(_entropy_rows, chunk, use_reentrant=False) if grad else _entropy_rows(chunk))
    return torch.cat(parts).reshape(B, T) if parts else flat.new_zeros(B, T, dtype=torch.float32)


def entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The forking tokens of each response: (B,T) bool, True on the sampled tokens whose
    entropy is at or above their row's (1 - quantile) quantile among its sampled tokens.

    `entropy`, `mask` (B,T); 0 < quantile <= 1. Only these tokens carry the policy gradient
    with actor.top_entropy_quantile < 1 ("Beyond the 80/20 rule", Wang et al. 2025,
    arXiv:2506.01939; the paper keeps rho = 0.2). The quantile rule is TRL's
    (trl/trainer/grpo_trainer.py `get_high_entropy_mask`, called with 1 - top_entropy_quantile):
    torch's linearly interpolated quantile, ties at the threshold kept, unsampled tokens never.
    The scope differs: per sequence here, where TRL (and the paper) take the quantile over the
    batch (TRL: the per-device micro-batch, gathered over processes). Per row, the mask does not
    depend on how micro-batches are packed or sharded, so gradient accumulation stays exact,
    and every response keeps at least its highest-entropy token. A row without sampled tokens
    keeps none; quantile 1 keeps every sampled token.
    """
    m = as_bool_mask(mask, entropy, "entropy_mask")
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"entropy_mask: quantile must be in (0, 1], got {quantile}")
    # unsampled positions as NaN: nanquantile ignores them, and NaN >= threshold is False
    ent = torch.where(m, entropy.detach().float(), torch.full_like(entropy, float("nan"), dtype=torch.float32))
    threshold = torch.nanquantile(ent, 1.0 - quantile, dim=-1, keepdim=True)
    return m & (ent >= threshold)


def entropy_loss(
    logits: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    chunk_size: int = 1024,
    global_tokens=None,
    global_seqs=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean entropy of the policy on sampled tokens, aggregated like the policy loss.

    Returns (entropy scalar, {"entropy": float}); the trainer adds `- entropy_coeff * entropy`
    to the loss (a bonus: higher entropy lowers the loss).
    """
    ent = entropy_from_logits(logits, chunk_size)
    value = agg_loss(ent, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    return value, {"entropy": masked_mean(ent.detach(), mask).item()}
