"""What one command of the benchmark runs: the settings (`cli.parse` builds them once from the
command line), the constants the defaults come from, and the folders the settings choose."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.rl_vs_sft_tables import ARMS

ROOT = Path(__file__).resolve().parents[2]

DEV_KB_SEEDS = {"standard": 0, "lookalike": 7}
"""Each KB kind's knowledge base every design decision was tuned on (the lookalike kind's is
benchmarks/kb_headroom.py's DEV_KB_SEED): never report on it."""
DEV_KB_SEED = DEV_KB_SEEDS["standard"]

START_STEPS = 60
"""The start SFT's steps (`--start-steps` overrides): on each host kind's start curve on the dev
KB, two seeds, the smallest checkpoint after which the mean EM rises by no more than 2 points
(docs/real_data.md); both kinds' curves gave 60."""

CLOCK = "every second"
"""What an arm's minutes count (settings.json's `clock`): every second from its first step."""


@dataclass
class Settings:
    """One command's settings. A record keeps them as its settings (`vars`, record_dir aside) in
    this order, the command line's, so a record of this version reads as one of the script's."""

    kb_seed: list[int] = field(default_factory=lambda: [101])
    """The knowledge bases' seeds, each once (cells = KB x seed); the start curve and the choice take one."""
    kb_kind: str = "standard"
    """`agent-rl-prep synthetic --kind` of every KB (lookalike: the kind with room above imitation)."""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """The run seeds of each KB: the start's SFT, data order and sampling."""
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    """The arms each cell runs from its start, in ARMS's order."""
    start_steps: int = START_STEPS
    """Steps of the start SFT (with start_rule explore: its most)."""
    start_rule: str = "steps"
    """"steps": the start is SFT's model after start_steps; "explore": SFT keeps a checkpoint every
    start_every steps and the start is the one the handover rule picks by their pre-flights
    (agent_rl.training.explore.choose_start, docs/explore.md)."""
    start_every: int = 10
    """With start_rule explore: SFT steps between the checkpoints the start is chosen among."""
    minutes: float = 10.0
    """Each arm's minutes, every second from its first step counted (CLOCK)."""
    sft_lr: float | None = None
    """The sft_more arm's lr; None: the SFT config's."""
    sft_epochs: int | None = None
    """The sft_more arm's epochs over the demonstrations; None: until its minutes end."""
    rft_lr: float | None = None
    """The rft arm's lr; None: the GRPO config's, or the overrides' lr."""
    demos: int = 1500
    """Training questions the grounded demonstrations are built from."""
    eval_limit: int = 200
    """Held-out questions of the report (a seeded sample)."""
    val_n: int = 50
    """Held-out questions of the running evaluation, none of them the report's."""
    val_every: int = 2
    """RL arms' steps between running evaluations (and checkpoints, with best_of_val)."""
    best_of_val: bool = False
    """Also compare each arm's best checkpoint by the running-evaluation questions."""
    sft_val_every: int = 10
    """With best_of_val: SFT arms' steps between their checkpoints."""
    log_batches: bool = False
    """RL arms write every step's whole batch (<arm>/rollouts), which group_strategy reads."""
    gain: float = 0.05
    """The lead over the SFT arm that time to gain waits for."""
    demo_args: str = ""
    """Extra arguments of `agent-rl-prep demos`, as one string."""
    workdir: str | None = None
    """The KB's workdir, or with several KB seeds the folder of theirs; None: under runs/rl_vs_sft."""
    json: str | None = None
    """Also write the result here."""
    start_curve: list[int] | None = None
    """[EVERY, STEPS]: the start curve instead of the arms."""
    choose: bool = False
    """The pre-registered choice of sft_lr, sft_epochs and rft_lr instead of the arms."""
    with_json: list[str] = field(default_factory=list)
    """Earlier runs' rl_vs_sft.json whose rows count with this run's."""
    overrides: list[str] = field(default_factory=list)
    """GRPO config overrides (key=value) of both RL arms."""
    record_dir: str | None = None
    """Where the run's record goes; None: the run's output folder."""
    clock: str = CLOCK
    """What an arm's minutes count, recorded so that a workdir of another rule is refused."""

    @property
    def mode(self) -> str:
        """"curve", "choice" or "arms": what the command runs (compat.SETTINGS's group)."""
        return "curve" if self.start_curve else "choice" if self.choose else "arms"


def kb_workdir(s: Settings, kb_seed: int) -> Path:
    """KB `kb_seed`'s workdir (its model, KB, index, demonstrations, cells): `--workdir` itself
    with one KB seed, `--workdir`/<name> with several, else runs/rl_vs_sft/<name>; the name is
    kb<K>, or <kind>_kb<K> for a kind other than standard."""
    name = f"kb{kb_seed}" if s.kb_kind == "standard" else f"{s.kb_kind}_kb{kb_seed}"
    if s.workdir is None:
        return (ROOT / "runs" / "rl_vs_sft" / name).resolve()
    return Path(s.workdir).resolve() / ("" if len(s.kb_seed) == 1 else name)


def out_dir(s: Settings) -> Path:
    """Where the run's table, JSON, plot and record go: its one KB's workdir, or with several KB
    seeds `--workdir` (default runs/rl_vs_sft/<kind>_kbs<K1>_<K2>...)."""
    if len(s.kb_seed) == 1:
        return kb_workdir(s, s.kb_seed[0])
    name = f"{s.kb_kind}_kbs" + "_".join(map(str, s.kb_seed))
    return Path(s.workdir).resolve() if s.workdir else (ROOT / "runs" / "rl_vs_sft" / name).resolve()
