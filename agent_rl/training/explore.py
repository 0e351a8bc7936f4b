"""The exploration pre-flight: can RL still learn from this start? Read from one batch of groups.

GRPO learns only from a group whose samples disagree on the reward (a flat group's advantage is
0 on every token), and only where the policy still samples more than one behaviour. Both are
visible in the first batch, before any update: the per-token entropy of the sampling
distribution, the share of groups whose rewards (or task metric: `algorithm.filter_metric`)
differ, pass@1 and pass@n, searches, and by question kind. `assess` turns them into a one-line
verdict and what to change; the floors are in `Thresholds`, with their sources (docs/explore.md).

Used by `agent-rl-train` on its first batch (`first_batch`, no extra rollouts;
`trainer.preflight`) and by `agent-rl-eval explore` on several checkpoints side by side. Pure:
trajectories in, figures out; no engine.

Entropy: a trajectory keeps only its sampled tokens' log-probs (`rollout_logprobs`, under the
sampling temperature: agent_rl/rollout/engine.py), not whole distributions. The mean of
−log p(sampled token) is an unbiased Monte Carlo estimate of the sampling distribution's
per-token entropy (E_x[−log p(x)] = H(p)), so the figure is named for what it is, `token_nll`;
the actor's exact entropy on the same batch is step 1's `actor/entropy`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from agent_rl.types import Trajectory

Group = Sequence[Trajectory]
"""The samples of one prompt."""


@dataclass(frozen=True)
class Thresholds:
    """Where the verdict turns, in one place. Every figure is read against the sampling the run
    uses (its temperature and n)."""

    entropy_floor: float = 0.18
    """Nats per sampled token under which a start is at risk. arXiv 2606.18487 (Qwen2.5-3B, 3
    seeds, as issue 102 cites it): SFT checkpoints under ~0.18 nats are at high risk of RL doing
    nothing or worse; deeper SFT raised pass@1 but cut post-RL pass@10 from 0.806 to 0.481."""
    entropy_target: float = 0.3
    """Nats the advice aims at when raising the temperature: AceReason-Nemotron sets the rollout
    temperature so that the entropy sits near 0.3 (as issue 102 cites it)."""
    informative_floor: float = 0.25
    """Share of groups whose samples disagree under which a start is at risk. A flat group adds
    no policy gradient under a group baseline (DAPO, arXiv 2503.14476, drops them). The number
    is this project's provisional choice (issue 102): between the benchmark's start that learned
    nothing (11-21% of groups holding both strategies) and the demo's that learned (50-62% of
    sequences with a non-zero advantage); issue 102 item 4 settles it on dev KB 7."""


THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Figures:
    """The pre-flight's figures over a set of groups (a batch, or one question kind of it)."""

    groups: int
    """Groups (prompts) read."""
    samples: int
    """Trajectories read."""
    token_nll: float | None
    """Mean −log p of the sampled tokens (nats): the entropy estimate (module docstring); None
    without sampled tokens."""
    fork_token_nll: float | None
    """The same at the tokens where a group's samples first diverge (the first response position
    whose token differs within the group): the decisions RL can move. None when no group diverges."""
    reward_differs: float
    """Share of groups whose rewards are not all equal (they carry a policy gradient)."""
    metric_differs: float
    """Share of groups whose task metric (`acc`: EM / F1 alone) is not all equal."""
    pass_at_1: float
    """Mean task metric over the samples."""
    pass_at_n: float
    """Mean over groups of the best sample's task metric (with EM: the share of groups with any success)."""
    signal: float
    """Mean over groups of the task metric's within-group variance, p(1−p) with p the group's
    pass rate for EM: its expectation over draws is the triage's p(1−p)(g−1)/g (arXiv
    2606.18487), 0 for a flat group, at most 0.25."""
    signal_at_pass_rate: float
    """p(1−p)(g−1)/g with p = pass@1 and g the mean group size: the signal if every question had
    the batch's pass rate. Well above `signal`, the questions are each answered one way."""
    searches: float
    """Mean searches per sample."""
    multi_strategy: float | None
    """Share of the groups with a strategy told (see `summarize`) that sample more than one;
    None without a classifier or where none is told."""

    def value(self, name: str) -> float | None:
        return getattr(self, name)


# name, label, format: the figures as the table shows them, in this order
ROWS: tuple[tuple[str, str, str], ...] = (
    ("groups", "groups x samples", "size"),
    ("token_nll", "entropy est. (nats, mean -log p)", "{:.3f}"),
    ("fork_token_nll", "  at first divergence", "{:.3f}"),
    ("reward_differs", "groups whose reward differs", "{:.0%}"),
    ("metric_differs", "groups whose task metric differs", "{:.0%}"),
    ("pass_at_1", "pass@1", "{:.3f}"),
    ("pass_at_n", "pass@n", "{:.3f}"),
    ("signal", "signal: mean p(1-p) per group", "{:.3f}"),
    ("signal_at_pass_rate", "  at the pass rate: p(1-p)(g-1)/g", "{:.3f}"),
    ("searches", "searches per sample", "{:.2f}"),
    ("multi_strategy", "groups sampling >1 strategy", "{:.0%}"),
)


def token_nlls(tr: Trajectory) -> list[float]:
    """−log p of each token the policy sampled (loss_mask 1)."""
    return [-lp for lp, m in zip(tr.rollout_logprobs, tr.loss_mask) if m]


def fork_nlls(group: Group) -> list[float]:
    """−log p of each sample's token at the first response position where the group's samples
    differ (a sample that already ended counts as different there); sampled tokens only. Empty
    when every sample is the same sequence."""
    longest = max(len(tr.response_ids) for tr in group)
    for j in range(longest):
        seen = {tr.response_ids[j] if j < len(tr.response_ids) else None for tr in group}
        if len(seen) > 1:
            return [-tr.rollout_logprobs[j] for tr in group if j < len(tr.response_ids) and tr.loss_mask[j]]
    return []


def _differs(values: Sequence[float]) -> bool:
    return max(values) - min(values) > 0  # exact, as algos.filter_groups' default atol


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _variance(values: Sequence[float]) -> float:
    mu = sum(values) / len(values)
    return sum((v - mu) ** 2 for v in values) / len(values)


def summarize(groups: Sequence[Group], strategy_of: Callable[[Trajectory], str | None] | None = None) -> Figures:
    """The figures of `groups` (each the scored samples of one prompt: `reward` and `acc` set).
    `strategy_of`: which strategy a sample followed, None where it cannot be told (no search,
    a question without strategies); the agent_rl package has no classifier of its own
    (benchmarks/strategy.py's `trajectory_strategy` is one a caller may pass)."""
    groups = [g for g in groups if g]
    if not groups:
        raise ValueError("pre-flight: no groups to read")
    samples = [tr for g in groups for tr in g]
    forks = [x for g in groups for x in fork_nlls(g)]
    pass_at_1 = sum(tr.acc for tr in samples) / len(samples)
    mean_size = len(samples) / len(groups)
    multi = None
    if strategy_of is not None:
        told = [s for s in ({strategy_of(tr) for tr in g} - {None} for g in groups) if s]
        multi = sum(len(s) > 1 for s in told) / len(told) if told else None
    return Figures(
        groups=len(groups),
        samples=len(samples),
        token_nll=_mean([x for tr in samples for x in token_nlls(tr)]),
        fork_token_nll=_mean(forks),
        reward_differs=sum(_differs([tr.reward for tr in g]) for g in groups) / len(groups),
        metric_differs=sum(_differs([tr.acc for tr in g]) for g in groups) / len(groups),
        pass_at_1=pass_at_1,
        pass_at_n=sum(max(tr.acc for tr in g) for g in groups) / len(groups),
        signal=sum(_variance([tr.acc for tr in g]) for g in groups) / len(groups),
        signal_at_pass_rate=pass_at_1 * (1 - pass_at_1) * (mean_size - 1) / mean_size,
        searches=sum(tr.num_searches for tr in samples) / len(samples),
        multi_strategy=multi,
    )


@dataclass(frozen=True)
class Preflight:
    """One start's pre-flight: its figures, by kind, and the verdict read from them."""

    overall: Figures
    by_kind: dict[str, Figures]
    informative: float
    """The share of groups the verdict reads: those whose `informative_on` differs (before the
    group filter, where one ran)."""
    informative_on: str
    """"score" (the reward) | "acc" (the task metric): algorithm.filter_metric."""
    risks: list[str]
    advice: list[str]
    note: str = ""
    """What the reader must know about how the figures were taken (a filter before them)."""
    thresholds: Thresholds = field(default=THRESHOLDS)

    @property
    def verdict(self) -> str:
        return "can learn" if not self.risks else "at risk: " + "; ".join(self.risks)

    def metrics(self) -> dict[str, float]:
        """explore/<figure>, explore/<kind>/<figure> (figures that exist), explore/informative,
        explore/can_learn (1 or 0)."""
        out = {"explore/informative": self.informative, "explore/can_learn": float(not self.risks)}
        for prefix, figs in (("explore", self.overall), *((f"explore/{_key(k)}", f) for k, f in self.by_kind.items())):
            for f in fields(Figures):
                v = figs.value(f.name)
                if v is not None:
                    out[f"{prefix}/{f.name}"] = float(v)
        return out

    def block(self, heading: str) -> str:
        """The printed form: heading, the figures overall and by kind, the verdict, the advice."""
        lines = [heading, render_table({"all": self.overall, **self.by_kind})]
        if self.note:
            lines.append(f"note: {self.note}")
        lines.append(f"verdict: {self.verdict}")
        lines += [f"  to change: {a}" for a in self.advice]
        return "\n".join(lines) + "\n"


def _key(kind: str) -> str:
    """A kind as a metric name part (no slashes or spaces)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", kind) or "_"


def assess(figures: Figures, informative_on: str = "score", filter_on: bool = False,
           thresholds: Thresholds = THRESHOLDS, informative: float | None = None) -> tuple[float, list[str], list[str]]:
    """(informative share, risks, advice) of a start's `figures`. `informative_on`: what a group
    must disagree on ("score": the reward; "acc": the task metric), `informative`: that share when
    the caller knows it better (the trainer's before its group filter), `filter_on`: the run
    already drops flat groups (algorithm.filter_groups), so the advice does not suggest it."""
    if informative_on not in ("score", "acc"):
        raise ValueError(f"pre-flight: informative_on must be score or acc, got {informative_on!r}")
    if informative is None:
        informative = figures.reward_differs if informative_on == "score" else figures.metric_differs
    t = thresholds
    risks: list[str] = []
    advice: list[str] = []
    if figures.token_nll is not None and figures.token_nll < t.entropy_floor:
        risks.append(f"entropy {figures.token_nll:.3f} nats < {t.entropy_floor} (arXiv 2606.18487)")
        advice.append(f"start from an earlier SFT checkpoint, or raise actor_rollout_ref.rollout.temperature "
                      f"until the entropy sits near {t.entropy_target} nats (AceReason-Nemotron)")
    if informative < t.informative_floor:
        what = "rewards" if informative_on == "score" else "task metric"
        risks.append(f"{informative:.0%} of groups differ in {what} < {t.informative_floor:.0%}")
        if figures.pass_at_1 >= 0.5:
            advice.append(f"pass@1 {figures.pass_at_1:.2f}: most groups are all right; an earlier SFT checkpoint "
                          "or harder questions")
        else:
            advice.append(f"pass@1 {figures.pass_at_1:.2f}: most groups are all wrong; a later SFT checkpoint "
                          "or easier questions")
        advice.append("a larger actor_rollout_ref.rollout.n (a group of n at pass rate p is flat with "
                      "probability p^n + (1-p)^n)")
        if not filter_on:
            advice.append("algorithm.filter_groups=true: drop flat groups and draw more prompts (DAPO, arXiv 2503.14476)")
    return informative, risks, advice


def preflight(groups: Sequence[Group], kind_of: Callable[[Trajectory], str | None] | None = None,
              strategy_of: Callable[[Trajectory], str | None] | None = None, informative_on: str = "score",
              filter_on: bool = False, informative: float | None = None, note: str = "",
              thresholds: Thresholds = THRESHOLDS) -> Preflight:
    """The pre-flight of one batch of scored `groups`: `summarize` overall and per kind
    (`kind_of` a group's first sample; groups without a kind count overall only), then `assess`."""
    overall = summarize(groups, strategy_of)
    by_kind: dict[str, list[Group]] = {}
    if kind_of is not None:
        for g in groups:
            kind = kind_of(g[0]) if g else None
            if kind:
                by_kind.setdefault(kind, []).append(g)
    share, risks, advice = assess(overall, informative_on, filter_on, thresholds, informative)
    return Preflight(overall, {k: summarize(gs, strategy_of) for k, gs in sorted(by_kind.items())}, share,
                     informative_on, risks, advice, note, thresholds)


def render_table(columns: Mapping[str, Figures]) -> str:
    """A markdown table, one row per figure (`ROWS`), one column per label (kinds, or checkpoints);
    a figure nobody has is left out, "n/a" where one column lacks it."""
    labels = list(columns)
    header = ["figure", *labels]
    body = []
    for name, label, fmt in ROWS:
        cells = []
        for figs in columns.values():
            v = figs.value(name)
            cells.append(f"{figs.groups} x {figs.samples / figs.groups:.3g}" if fmt == "size"
                         else "n/a" if v is None else fmt.format(v))
        if any(c != "n/a" for c in cells):
            body.append([label, *cells])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)])


def comparison(results: Mapping[str, Preflight]) -> str:
    """Several starts side by side (`agent-rl-eval explore`): one table of their figures, one per
    question kind (the starts that have it), then each start's verdict and advice."""
    parts = [render_table({label: r.overall for label, r in results.items()})]
    kinds = sorted({k for r in results.values() for k in r.by_kind})
    for kind in kinds:
        parts.append(f"kind {kind}:\n" + render_table({label: r.by_kind[kind] for label, r in results.items()
                                                        if kind in r.by_kind}))
    for label, r in results.items():
        parts.append("\n".join([f"{label}: {r.verdict}", *(f"  to change: {a}" for a in r.advice)]))
    return "\n\n".join(parts) + "\n"


def choose_start(results: Mapping[str, Preflight]) -> tuple[str, str]:
    """The handover rule (docs/explore.md): among SFT checkpoints given in training order (the
    earliest first), the RL start is the latest whose pre-flight passes every floor (entropy and
    informative share); where none does, the one with the largest informative share (the
    earliest of equals: less SFT, more entropy). Not the highest SFT EM: more SFT raises pass@1
    and collapses the groups RL learns from. Returns (label, why)."""
    if not results:
        raise ValueError("choose_start: no checkpoints")
    passing = [label for label, r in results.items() if not r.risks]
    if passing:
        later = len(results) - 1 - list(results).index(passing[-1])
        return passing[-1], (f"the latest of {len(results)} that can learn"
                             + (f" ({later} later one(s) at risk)" if later else ""))
    best = max(results, key=lambda label: results[label].informative)  # max keeps the first of equals
    return best, (f"none of {len(results)} passes every floor: the largest informative share "
                  f"({results[best].informative:.0%})")


# ----------------------------------------------------------------------------- in agent-rl-train
def kinds_by_question(prompts: Sequence[Any]) -> Callable[[Trajectory], str | None] | None:
    """A trajectory's question kind from the training prompts' `stratum` (the `data.balance_by`
    column, e.g. the generated KB's `kind`), matched by question text; None without strata."""
    table = {p.question: p.stratum for p in prompts if p.stratum}
    return (lambda tr: table.get(tr.question)) if table else None


def first_batch(step: int, trajs: Sequence[Trajectory], step_metrics: Mapping[str, float], cfg: Any,
                prompts: Sequence[Any]) -> dict[str, float]:
    """agent-rl-train's pre-flight: at step 1 with trainer.preflight on, print the block for the
    step's batch (no extra rollouts) and return its explore/* metrics; {} otherwise. With
    algorithm.filter_groups on, the batch holds only the groups the filter kept, so the verdict
    reads the share the filter kept (`kept_share`) and the block says the other figures are the
    kept groups'."""
    if step != 1 or not cfg.trainer.preflight or not trajs:
        return {}
    from agent_rl.training.groups import GroupRules, group_trajectories

    rules = GroupRules.from_config(cfg)
    groups = group_trajectories(list(trajs))
    informative = kept_share(step_metrics, len(groups)) if rules.filter_on else None
    note = "" if informative is None else (
        f"algorithm.filter_groups kept {informative:.0%} of the groups it read; the figures above are the kept "
        "groups' (the flat ones were dropped before the batch)")
    result = preflight(groups, kinds_by_question(prompts), None, rules.filter_metric, rules.filter_on, informative,
                       note)
    r = cfg.actor_rollout_ref.rollout
    print(result.block(f"[preflight] exploration pre-flight on step 1's batch (rollout.n {r.n}, temperature "
                       f"{r.temperature}, protocol {r.protocol}; docs/explore.md)"), flush=True)
    return result.metrics()


def kept_share(step_metrics: Mapping[str, float], batch_groups: int) -> float | None:
    """The share of groups the group filter kept, from a collection's metrics: the sync
    collector's first round (filter/frac_groups_kept), else the batch's groups over those and
    the ones dropped as flat (filter/dropped_groups: the ahead collectors'); None without either."""
    if "filter/frac_groups_kept" in step_metrics:
        return float(step_metrics["filter/frac_groups_kept"])
    if "filter/dropped_groups" in step_metrics:
        return batch_groups / (batch_groups + float(step_metrics["filter/dropped_groups"]))
    return None
