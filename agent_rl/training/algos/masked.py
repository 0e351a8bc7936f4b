"""Masked reductions shared by advantages, losses and KL. `mask` is 1 on sampled tokens.

Masked positions are selected away with `torch.where`, not multiplied by 0, so garbage
(inf / NaN) in padding or observation positions cannot leak into a result.
"""

from __future__ import annotations

import torch


def as_bool_mask(mask: torch.Tensor, like: torch.Tensor, where: str) -> torch.Tensor:
    """`mask` as a bool tensor, checked to have `like`'s shape."""
    if mask.shape != like.shape:
        raise ValueError(f"{where}: mask shape {tuple(mask.shape)} != values shape {tuple(like.shape)}")
    return mask.bool()


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    selected = torch.where(mask.bool(), x, zero)
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked entries; 0 where there are none (no NaN)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries of the whole tensor; 0 outside.

    Unbiased variance (Bessel), as veRL's `masked_whiten`; with fewer than two masked entries
    the variance is taken as 0 instead of 0/0.
    """
    m = mask.bool()
    n = m.sum()
    mean = masked_mean(x, m)
    var = masked_sum((x - mean) ** 2, m) / (n - 1).clamp(min=1).to(x.dtype)
    out = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(m, out, torch.zeros((), dtype=x.dtype, device=x.device))
