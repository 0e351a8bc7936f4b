"""The dtypes a run will use on this host, resolved from its config's `auto` settings, for
the hardware line every command prints at start (data_prep.hardware decides)."""

from __future__ import annotations

from typing import Any

from data_prep.hardware import announce, default_device, resolve_autocast, resolve_dtype


def chosen_precisions(cfg: Any, engine: bool = True, critic: bool = False) -> dict[str, str]:
    """{'engine': 'float32 (auto: ...)', 'actor': 'fp32 (auto: ...)', ...} for a Train/SFT config."""
    device = default_device()
    arr = cfg.actor_rollout_ref
    out = {}
    if engine:
        dtype, why = resolve_dtype(arr.rollout.dtype, device)
        out["engine"] = f"{dtype} ({why})"
    out["actor"] = resolve_autocast(arr.actor.bf16_autocast, device)[1]
    if critic:
        out["critic"] = resolve_autocast(cfg.critic.bf16_autocast, device)[1]
    return out


def announce_run(cfg: Any, engine: bool = True, critic: bool = False) -> str:
    return announce(**chosen_precisions(cfg, engine, critic))
