"""The settings of cold-start SFT (`agent-rl-sft`): its data and loop; the model and actor
settings are RL's (`ActorRolloutRefConfig`), the run fields too (`RunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_rl.config.schema import ActorConfig, ActorRolloutRefConfig, OptimConfig, RunConfig


@dataclass
class SFTDataConfig:
    train_files: list[str] = field(default_factory=lambda: ["artifacts/demos/kb_train.parquet"])
    """Demonstration parquet files written by `agent-rl-prep demos` (token ids + loss mask)."""
    val_files: list[str] = field(default_factory=list)
    """Held-out demonstration files for a validation loss (empty: none)."""
    train_batch_size: int = 16
    """Demonstrations per optimizer step (veRL sft: data.train_batch_size)."""
    max_length: int = 1024
    """Demonstrations longer than this (prompt + response tokens) are skipped and counted."""
    shuffle: bool = True
    """Shuffle the demonstrations each epoch (seeded)."""
    seed: int = 1
    """Seed for the data order (and torch)."""
    train_data_num: int | None = None
    """Use only the first N demonstrations (None: all)."""


@dataclass
class SFTTrainerConfig(RunConfig):
    """Loop, checkpoints, logging of an SFT run (the run fields are RL's: `RunConfig`)."""

    experiment_name: str = "sft"
    """Run name."""
    default_local_dir: str = "runs/sft/${trainer.experiment_name}"
    """Run directory: metrics, checkpoints and the final HF model in `<dir>/model`."""
    max_ckpt_to_keep: int | None = 1
    """Keep only the newest K checkpoints (None: all)."""
    log_freq: int = 1
    """Log metrics every K steps (the progress bar updates every step)."""


@dataclass
class SFTConfig:
    """`agent-rl-sft`: supervised fine-tuning on demonstrations through the RL actor worker."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Demonstrations."""
    actor_rollout_ref: ActorRolloutRefConfig = field(
        default_factory=lambda: ActorRolloutRefConfig(actor=ActorConfig(optim=OptimConfig(lr=1e-5)))
    )
    """Policy model (path, LoRA) and actor settings (optimizer, micro-batching, loss_agg_mode,
    state_masking) exactly as in RL; rollout/ref are unused."""
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    """Loop, checkpoints, logging."""
