"""The RL run's settings: one dataclass per section, each field with its default and a one-line
docstring under it. Knob names follow veRL / Search-R1 (docs/search_r1_mapping.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=lambda: ["artifacts/kb/train.parquet"])
    """QA parquet/jsonl files for training (id, question, golden_answers, data_source)."""
    val_files: list[str] = field(default_factory=lambda: ["artifacts/kb/test.parquet"])
    """Held-out QA files for validation."""
    train_batch_size: int = 8
    """Prompts per training step (each sampled `actor_rollout_ref.rollout.n` times)."""
    val_batch_size: int = 64
    """Prompts per validation batch."""
    max_prompt_length: int = 512
    """Prompts longer than this (tokens) are dropped when loading."""
    max_response_length: int = 512
    """Total response budget in tokens (sampled + observation tokens), all turns."""
    max_start_length: int = 512
    """Search-R1 name for the initial prompt budget; kept for script compatibility."""
    max_obs_length: int = 256
    """Each observation is truncated to this many tokens before it is appended."""
    shuffle: bool = True
    """Shuffle training prompts each epoch (seeded)."""
    seed: int = 1
    """Seed for the data order and sampling."""
    balance_by: str | None = None
    """A QA column (e.g. data_source, or the knowledge base's kind): every training batch holds
    its values in their shares of the data (a stratified order each epoch; agent_rl/training/data.py).
    None: a plain shuffle, as veRL. Not a veRL knob."""
    train_data_num: int | None = None
    """Use only the first N training rows (None: all)."""
    val_data_num: int | None = None
    """Use only the first N validation rows (None: all)."""


@dataclass
class ModelConfig:
    path: str = "artifacts/model"
    """HF model directory (policy initialisation; also the reference policy)."""
    dtype: str = "float32"
    """Parameter dtype of the trainable copy (float32 master weights)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (slower)."""
    load_format: str = "auto"
    """auto: the directory's weights | dummy: seeded random weights from its config.json alone (no
    weight files; the reference policy starts equal to the policy): speed and memory at a shape
    whose weights cannot travel (benchmarks/scale.py); set rollout.load_format=dummy with it."""
    lora_rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    lora_alpha: int = 32
    """LoRA alpha (scaling = alpha / rank)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names LoRA adapts."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    lr_warmup_steps_ratio: float = 0.0
    """Fraction of total steps for linear warm-up."""
    lr_warmup_steps: int = -1
    """Warm-up steps; overrides the ratio when >= 0."""
    warmup_style: str = "constant"
    """After warm-up: constant, or cosine decay to min_lr_ratio * lr at the run's last step
    (trainer.total_training_steps, else the epochs' steps)."""
    min_lr_ratio: float = 0.0
    """The cosine's floor as a fraction of lr."""
    num_cycles: float = 0.5
    """Cosine periods over the decay (0.5: one half-wave from lr down to the floor)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer settings."""
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (x rollout.n trajectories), veRL meaning."""
    ppo_micro_batch_size_per_gpu: int = 4
    """Trajectories per forward/backward (gradient accumulation inside a mini-batch)."""
    use_dynamic_bsz: bool = True
    """Form micro-batches by token count instead of a fixed number of sequences."""
    ppo_max_token_len_per_gpu: int = 4096
    """Token budget of one micro-batch when use_dynamic_bsz."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    policy_loss: str = "vanilla"
    """Policy loss registered in agent_rl.training.algos (veRL: policy_loss.loss_mode); vanilla = PPO clip,
    rft = NLL of rejection_sampling's kept trajectories (that estimator selects it itself)."""
    clip_ratio: float = 0.2
    """PPO clip epsilon (used for low and high when those are unset)."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon (clip-higher: set high > low)."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant c for negative advantages (> 1)."""
    tis_cap: float | None = None
    """Truncated importance sampling cap between trainer and rollout-engine logprobs (None: off)."""
    use_kl_loss: bool = False
    """Add KL(policy || ref) to the loss (GRPO style) instead of the reward."""
    kl_loss_coef: float = 0.001
    """Coefficient of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the loss: kl (k1), abs, mse (k2), low_var_kl (k3)."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient: the loss gets -entropy_coeff * (entropy aggregated like the policy loss)."""
    top_entropy_quantile: float = 1.0
    """Forking-token gradient (TRL's name, arXiv 2506.01939), in (0, 1]: only each response's top-q tokens by entropy carry the policy gradient (not KL/entropy terms); 1.0 = all."""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum."""
    grad_clip: float = 1.0
    """Max gradient norm."""
    state_masking: bool = True
    """Mask retrieved/observation tokens out of loss and KL (Search-R1 name)."""
    bf16_autocast: str = "auto"
    """bf16 autocast for forward/backward (fp32 master weights): auto (where the hardware runs
    bf16 natively: AMX/AVX512-BF16, ARM BF16, CUDA; fp32 elsewhere) | true | false."""
    shuffle: bool = False
    """Shuffle sequences before splitting a batch into mini-batches (veRL actor.shuffle)."""
    strategy: str = "auto"
    """Data parallelism: auto (FSDP2 on GPUs, full replicas + gradient all-reduce on CPU) | fsdp | replicas."""


@dataclass
class ToolConfig:
    """One entry of `actor_rollout_ref.rollout.tools`: a built-in tool or an MCP server."""

    name: str = "search"
    """Built-in: search | calculator. An MCP server: a label for it (its tools keep the server's names)."""
    mcp_command: list[str] | None = None
    """Start this MCP server as a child process and speak stdio to it (e.g. [python, -m, my_server])."""
    mcp_url: str | None = None
    """Or connect to this MCP server over streamable HTTP (e.g. http://127.0.0.1:9000/mcp)."""
    include: list[str] | None = None
    """The server's tools to offer (None: all of them)."""
    timeout_s: float | None = None
    """Per-call limit (None: actor_rollout_ref.rollout.tool_timeout_s)."""
    max_concurrency: int | None = None
    """Calls of this tool in flight (None: actor_rollout_ref.rollout.max_concurrent_tool_calls)."""

    @property
    def is_mcp(self) -> bool:
        return self.mcp_command is not None or self.mcp_url is not None


@dataclass
class RolloutConfig:
    name: str = "vllm"
    """Rollout engine (vllm)."""
    n: int = 4
    """Samples per prompt (a GRPO group). Search-R1's n_agent."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the actor takes its log-probs at the same temperature (veRL)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    max_tokens_per_turn: int = 128
    """Generation budget of one assistant turn."""
    dtype: str = "auto"
    """Engine dtype: auto (bfloat16 where the hardware runs it natively, else float32) |
    bfloat16 | float32 | float16. float32 makes engine logprobs equal the trainer's."""
    gpu_memory_utilization: float = 0.5
    """vLLM GPU memory fraction (GPU only)."""
    tensor_model_parallel_size: int = 1
    """vLLM tensor parallelism (GPU only)."""
    kv_cache_space_gb: float = 2.0
    """VLLM_CPU_KVCACHE_SPACE on CPU."""
    max_num_seqs: int = 64
    """Engine batch slots."""
    enforce_eager: bool = True
    """Disable graph capture (required/faster on CPU for small models)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prefixes (prompt, earlier turns)."""
    max_concurrent_trajectories: int = 128
    """Trajectories in flight (more than batch slots keeps the engine full during tool calls)."""
    max_concurrent_tool_calls: int = 64
    """Calls of one tool in flight (per rollout manager: evaluation's concurrent questions share it)."""
    protocol: str = "search_r1"
    """How the model acts: search_r1 (<search>/<answer> tags) | hermes (native <tool_call> JSON, results as tool messages; veRL multi_turn.format=hermes)."""
    tool_chat_template: str = "auto"
    """hermes only: auto (the model's chat template if it has a tool role, else the fallback) | model | fallback."""
    tools: list[ToolConfig] = field(default_factory=lambda: [ToolConfig()])
    """Tools offered in agent mode: built-ins (search, calculator) and MCP servers; search_r1 allows only search."""
    chat_template: bool = True
    """Use the model's chat template (instruct models) instead of the base-model template."""
    load_format: str = "auto"
    """vLLM's weight loading: auto (the model directory's weights) | dummy (random weights from its
    config.json alone; the first weight sync replaces them): with model.load_format=dummy."""
    engine_mode: str = "inproc"
    """Rollout backend: inproc (vLLM, engine core in this process: fast load, cheap weight sync) | mp (vLLM AsyncLLM, core in a child process) | hf (plain transformers, one sequence at a time, no vLLM: tests of the training loop)."""
    seed: int = 0
    """vLLM engine seed (sampling is reproducible for a fixed seed and request order)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step (prefill chunking); None: vLLM's default."""
    tool_timeout_s: float = 120.0
    """Upper bound on one tool call including the client's retries; exceeded -> error observation."""

    @property
    def template(self) -> str:
        """The prompt template `chat_template` selects: "chat" | "base" (derived here only)."""
        return "chat" if self.chat_template else "base"


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 8
    """Sequences per log-prob forward (policy and reference) when not use_dynamic_bsz."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget of one log-prob forward (policy and reference) when use_dynamic_bsz."""


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy update settings."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation settings."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy settings."""


@dataclass
class CriticConfig:
    model_path: str | None = None
    """Critic init (None: the policy's path); a value head is added."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Critic optimizer."""
    ppo_micro_batch_size_per_gpu: int = 4
    """Trajectories per critic forward/backward."""
    cliprange_value: float = 0.5
    """Value clipping range."""
    ppo_epochs: int = 1
    """Critic passes per batch."""
    ppo_mini_batch_size: int = 8
    """Prompts per critic optimizer step (x rollout.n trajectories), veRL meaning."""
    use_dynamic_bsz: bool = True
    """Form critic micro-batches by token count instead of a fixed number of sequences."""
    ppo_max_token_len_per_gpu: int = 4096
    """Token budget of one critic micro-batch when use_dynamic_bsz."""
    forward_max_token_len_per_gpu: int = 16384
    """Token budget of one value forward (compute_values) when use_dynamic_bsz."""
    grad_clip: float = 1.0
    """Max gradient norm of the critic."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the value loss: token-mean | seq-mean-token-mean | seq-mean-token-sum."""
    shuffle: bool = False
    """Shuffle sequences before splitting into mini-batches."""
    bf16_autocast: str = "auto"
    """bf16 autocast for the critic's forward/backward: auto | true | false (as actor.bf16_autocast)."""
    strategy: str = "auto"
    """Data parallelism: auto | fsdp | replicas (as actor.strategy)."""


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    """fixed | adaptive."""
    kl_coef: float = 0.001
    """Initial coefficient of the in-reward KL penalty."""
    target_kl: float = 0.1
    """Adaptive controller target."""
    horizon: int = 10000
    """Adaptive controller horizon."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | gae | rejection_sampling
    (RFT: the samples whose answer is right, trained by their NLL; it brings policy loss rft)."""
    rft_min_acc: float = 1.0
    """rejection_sampling keeps a trajectory whose task metric (reward.kind's EM / subEM / F1 of its
    answer; format terms and search cost left out) is at least this: 1.0 with em = a right answer."""
    gamma: float = 1.0
    """Discount (GAE)."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group std (False = Dr.GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract a per-token KL penalty from the reward (refused under rejection_sampling, whose keep
    test reads the task metric unchanged)."""
    kl_penalty: str = "kl"
    """KL estimator for the in-reward penalty: kl | abs | mse | low_var_kl."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """In-reward KL coefficient controller."""
    filter_groups: bool = False
    """Drop groups whose rewards all agree (no signal) and over-sample to refill the batch; no effect under
    rejection_sampling, which trains on every sample of an all-right group."""
    max_filter_rounds: int = 3
    """Extra rollout rounds allowed to refill a filtered batch."""
    filter_metric: str = "score"
    """What a kept group's samples must disagree on: score (the reward, format terms included;
    veRL's seq_reward) | acc (the task metric alone, reward.kind's EM or F1; DAPO's acc). With
    format-aware rewards, acc keeps only groups where some samples answer right."""


@dataclass
class RetrieverConfig:
    url: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000/retrieve"])
    """Retriever /retrieve URL(s); several are balanced round-robin with failover."""
    topk: int = 3
    """Passages per search."""
    timeout_s: float = 30.0
    """Per-request timeout."""
    max_retries: int = 3
    """Retries (with backoff) on connection errors and 5xx before an error observation."""
    skip_failed_searches: bool = True
    """Leave trajectories whose search failed (an error observation) out of the update, with
    their whole group for group estimators (GRPO, RLOO): a retriever outage must not teach
    the policy that searching fails. Counted in rollout/failed_search_*."""
    outage_share: float = 0.25
    """When more than this share of a step's trajectories had a failed search, wait for the
    retriever's /health before going on (and collect the step again if nothing was kept)."""
    outage_wait_s: float = 600.0
    """How long to wait for a healthy retriever before the run stops with an error."""
    api_key_file: str | None = None
    """File whose first line is the retriever's API key (sent as X-API-Key). Unset: env
    RETRIEVER_API_KEY when set. A refused key stops the command at start-up."""
    api_key: str | None = None
    """The key itself; prefer api_key_file or the env variable (a key given here shows on a
    command line; loggers and checkpoints' config.yaml get "<redacted>": `SECRETS`)."""
    proxy: str | None = None
    """HTTP proxy to reach the retriever through (http://host:port). None: none; env
    HTTP_PROXY/ALL_PROXY are not read, so a proxy set for downloads never sees the queries or
    the key."""


@dataclass
class RewardConfig:
    kind: str = "em"
    """Outcome score: em | subem | f1."""
    format_score: float = 0.0
    """Search-R1 qa_em: floor for an extracted but wrong answer (ignored when a v0.3 weight is set)."""
    structure_format_score: float = 0.0
    """Search-R1 v0.3: reward of a well-formed response with a wrong answer; a right answer in a malformed one gets 1 minus this."""
    final_format_score: float = 0.0
    """Search-R1 v0.3: reward of a malformed response whose answer is wrong."""
    retrieval_score: float = 0.0
    """Search-R1 v0.3: added to structure_format_score when a gold answer is in the retrieved text."""
    search_cost: float = 0.0
    """Taken from a right answer's reward for each search it made (each `<information>` block):
    of the right answers, the one with fewer searches scores higher, so GRPO stops spreading a
    second search to questions one search answers; a wrong answer pays nothing, so a search
    while unsure costs nothing. Not in Search-R1 (0: its reward). Keep it below
    (1 - structure_format_score - retrieval_score) / max_turns, so that a right answer still
    beats every wrong one."""
    normalize: str = "unicode"
    """How answers are normalised before em / subem / f1 and the retrieval check (one function,
    `data_prep.normalize`, also the QA readers' and the overlap check's): unicode (NFKC, typographic
    quotes and dashes as ASCII, then SQuAD's lower case / punctuation / articles / spaces; ASCII
    text scores exactly as under squad) | squad (SQuAD v1.1 and Search-R1 bit for bit: an NFD
    "Beyoncé" or "N’ Roses" misses its plain form). A gold answer that normalises to "" never
    matches in either."""


@dataclass
class RunConfig:
    """The run fields RL (`trainer` of TrainConfig) and SFT (`trainer` of SFTConfig) share;
    `agent_rl.training.run.Run` reads them."""

    project_name: str = "agent_rl"
    """Run grouping name (logs)."""
    experiment_name: str = "run"
    """Run name."""
    total_epochs: int = 1
    """Epochs over the training data."""
    total_training_steps: int | None = None
    """Stop after this many optimizer steps (None: epochs decide)."""
    max_time_s: float | None = None
    """Training time budget of the run in seconds, summed over resumed attempts: stop before a
    step that would end past it (judged by the mean step time so far, or by the longest step of
    this attempt if longer: GRPO steps vary with the filter's rounds) and save a checkpoint. A
    re-run whose budget is spent does nothing. None: no limit. Worker start-up, model load,
    validation (trainer.test_freq) and saving come on top (unless trainer.max_time_counts=all)."""
    max_time_counts: str = "steps"
    """What trainer.max_time_s counts: steps (the training steps' wall time) | all (every second
    from the first step's start: the validations, checkpoints and logging between steps too,
    so runs that validate or save differently get the same wall minutes; start-up, the step-0
    validation and what follows the last step do not count)."""
    save_freq: int = -1
    """Checkpoint every K steps (-1: none in between); one is always saved when the run stops
    (last step or time budget), so a re-run continues it or finds it finished."""
    test_freq: int = -1
    """Validate every K steps and at the step the run stops, by step count or time budget (-1: RL
    never during training; SFT at the end, if val files are given)."""
    default_local_dir: str = "runs/${trainer.experiment_name}"
    """Run directory: metrics, checkpoints (and SFT's final model in `<dir>/model`)."""
    logger: list[str] = field(default_factory=lambda: ["console", "tensorboard", "jsonl"])
    """Metric sinks: console, tensorboard, jsonl, wandb."""
    resume_mode: str = "auto"
    """auto: resume from the run's latest checkpoint if any (RL: one saved with another model,
    tokenizer, train data, batch settings, protocol, rollout.n or trainer.mode is refused in one
    line naming the difference) |
    disable: start from scratch; an earlier run in default_local_dir is first moved whole to
    `<dir>.prev-<YYYYmmdd-HHMMSS>` (said in one line), so its metrics, TensorBoard events and
    checkpoints are neither rewritten nor mixed with the new run's (veRL would write over them)."""
    resume_from_path: str | None = None
    """Resume from this checkpoint directory (global_step_K) instead of the run's latest (checked
    as with auto). Where the run saved past step K, those later steps (checkpoints, validations,
    SFT's model, with a copy of the metrics and TensorBoard events) are first moved whole to
    `<dir>.prev-<YYYYmmdd-HHMMSS>` (said in one line): the run goes on as one story from K."""
    max_ckpt_to_keep: int | None = 2
    """Keep only the newest K run checkpoints (None: keep all). veRL: max_actor_ckpt_to_keep."""
    n_gpus_per_node: int = 0
    """GPUs per node (0: CPU)."""
    nnodes: int = 1
    """Nodes the training workers spread over, as in veRL (on GPUs nnodes x n_gpus_per_node is
    the world size). On CPU the num_actor_workers ranks sit num_actor_workers / nnodes to a node
    (a multiple of nnodes), one STRICT_SPREAD placement bundle per node; the engine runs on one.
    Above 1 it needs a Ray cluster of that many nodes (trainer.ray_address): fewer is refused in
    one line before the engine starts."""
    num_actor_workers: int = 1
    """Data-parallel actor workers in all nodes together (torch.distributed: gloo on CPU, NCCL on GPU); SFT with 1 runs the actor in its own process."""
    ray_address: str | None = None
    """Ray cluster address (None: start a local cluster; "auto": join a running one)."""
    torch_threads: int = 0
    """Threads for torch in trainer processes (0: all cores)."""


@dataclass
class TrainerConfig(RunConfig):
    """Loop, checkpoints, logging of an RL run."""

    experiment_name: str = "demo"
    """Run name."""
    val_before_train: bool = False
    """Validate once before the first step."""
    validation_data_dir: str | None = None
    """Where each validation's questions go, one row each, in `<dir>/<step>.jsonl` (veRL's knob):
    id, data_source, metric, score, answer, searches, finish reason, response. Two models are
    compared question by question from these (`make demo` sets `<run>/validation`:
    agent_rl.demo.selection). null (veRL's default) writes none: on Search-R1's full test set a
    file is ~100 MB."""
    rollout_data_dir: str | None = None
    """Where sampled rollouts go, `<dir>/<step>.jsonl` (veRL's knob): `rollout_data_n` trajectories
    of the batch every `rollout_data_freq` steps, with the reward's breakdown and the loss-masked
    context marked (agent_rl.training.rollout_data); `agent-rl-eval show <dir>` renders them.
    null: none."""
    rollout_data_freq: int = 10
    """Write sampled rollouts every this many steps (and at step 1)."""
    rollout_data_n: int = 4
    """Trajectories written per such step (a draw seeded by the step)."""
    preflight: bool = True
    """Print the exploration pre-flight of step 1's batch and log it as explore/* (docs/explore.md)."""
    retriever_health_timeout_s: float = 300.0
    """How long agent-rl-train waits for the retriever's /health before giving up."""
    mode: str = "sync"
    """How rollout and update overlap (veRL's sync / one-step-off / fully async trainers):
    sync (generate step k's batch with step k-1's weights, then update: on-policy, the engine
    idles during the update) | one_step_off (step k+1's batch is generated with step k-1's
    weights while step k updates; the weights are swapped when that batch is done: staleness
    exactly 1) | async (groups generate continuously, up to trainer.max_staleness batches
    ahead; new weights reach trajectories in flight at their next turn: partial rollouts).
    The off-policy modes need actor_rollout_ref.actor.tis_cap: the loss reweights each token
    from the policy version that sampled it to the trainer's."""
    max_staleness: int = 1
    """async: how many policy versions a trained trajectory's oldest token may lag the
    trainer's (veRL max_off_policy_threshold, SkyRL max_staleness_steps); it is also how many
    batches are generated ahead."""
    staleness_policy: str = "wait"
    """async: wait (train groups in submission order; the bound holds by construction) | drop
    (train groups in the order they finish, so a slow multi-search group does not hold the
    step; groups past the bound are dropped and counted as async/dropped_stale)."""


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy, rollout and reference."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Critic (PPO / GAE only)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and KL."""
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """Retrieval service."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Outcome reward."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, checkpoints, logging."""
    max_turns: int = 4
    """Maximum assistant turns with search; then one last turn without search (Search-R1)."""
