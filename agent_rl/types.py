"""Typed records crossing boundaries (rollout -> reward -> trainer). No bare dicts over Ray."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One sampled answer to one prompt (docs/architecture.md, "Trajectory").

    `response_ids` is everything after the prompt: sampled tokens and observation/feedback
    tokens, exactly the ids the engine saw (never decode-and-re-encode). `loss_mask[i]` is 1
    where the policy sampled response_ids[i], 0 on observation/template tokens.
    `rollout_logprobs[i]` is the engine's logprob of a sampled token, 0.0 where masked.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    reward: float = 0.0
    acc: float = 0.0
    """The task metric of its answer (reward.kind's EM / subEM / F1), without the reward's format
    terms and search cost; set with `reward` (rejection sampling keeps on it)."""
    group_id: int = 0
    num_turns: int = 0
    num_searches: int = 0
    finish_reason: str = ""  # "answer" | "max_turns" | "length" | "error"
    response_text: str = ""
    data_source: str = ""
    golden_answers: list[str] = field(default_factory=list)
    question: str = ""
    num_invalid: int = 0
    num_tool_failures: int = 0
    num_obs_truncated: int = 0
    num_rejected_queries: int = 0  # searches the retriever refused as malformed (the policy's mistake)
    num_tool_calls: int = 0  # calls of any tool (searches included)
    num_bad_tool_calls: int = 0  # malformed JSON, unknown tool names, arguments not matching the schema
    num_repeated_queries: int = 0  # searches repeating an earlier query of the same trajectory
    reward_text: str | None = None
    """The response as its protocol shows it to rewards (agent_rl.rollout.reward.score_trajectory)."""
    policy_versions: list[int] = field(default_factory=list)
    """Per response token: the policy version (trainer step) whose weights sampled it, -1 on
    appended context; empty when not recorded. An asynchronous run's trajectory may span
    several versions (partial rollouts); `rollout_logprobs` are each token's own version's."""

    def staleness(self, version: int) -> int:
        """How many policy versions the oldest sampled token lags `version` (0 if none recorded)."""
        sampled = [v for v in self.policy_versions if v >= 0]
        return version - min(sampled) if sampled else 0

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n or len(self.policy_versions) not in (0, n):
            raise ValueError(
                f"Trajectory lengths disagree: response_ids={n}, loss_mask={len(self.loss_mask)}, "
                f"rollout_logprobs={len(self.rollout_logprobs)}, policy_versions={len(self.policy_versions)}"
            )
