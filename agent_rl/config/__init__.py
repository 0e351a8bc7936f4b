"""Typed configuration: dataclasses with defaults, loaded from YAML, overridden by dotted keys.

Knob names follow veRL / Search-R1 (`data.train_batch_size`, `actor_rollout_ref.rollout.n`,
`actor_rollout_ref.actor.ppo_mini_batch_size`, `algorithm.adv_estimator`, `max_turns`,
`retriever.url`, ...) so a Search-R1 run script carries over with a small mapping
(docs/search_r1_mapping.md). Every field has a default and a one-line docstring under it.

- `schema`: the RL run's sections (`TrainConfig`); `sft`: cold-start SFT's (`SFTConfig`);
- `loader`: YAML + overrides -> a config (`load_config`), and the form that leaves the process
  (`to_dict`, `redacted`);
- `checks`: the allowed values, ranges and cross-checks every loaded config passes.
"""

from agent_rl.config.schema import (  # noqa: F401
    ActorConfig, ActorRolloutRefConfig, AlgorithmConfig, CriticConfig, DataConfig, KLCtrlConfig,
    ModelConfig, OptimConfig, RefConfig, RetrieverConfig, RewardConfig, RolloutConfig, RunConfig,
    ToolConfig, TrainConfig, TrainerConfig,
)
from agent_rl.config.sft import (  # noqa: F401
    SFTConfig, SFTDataConfig, SFTTrainerConfig,
)
from agent_rl.config.checks import (  # noqa: F401
    AGG_MODES, BUILTIN_TOOLS, CHOICES, ConfigError, KL_KINDS, ON_OFF_AUTO, RANGES, SINKS,
    STRATEGIES, WARMUP_STYLES, check_paths, check_settings, tool_problems,
)
from agent_rl.config.loader import (  # noqa: F401
    REDACTED, SECRETS, load_config, redacted, to_dict,
)
