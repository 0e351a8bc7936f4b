"""The command line: its parser (`--help` shows the package's docstring), the checks that refuse a
bad combination before anything runs, and `main`, which runs the mode on every KB."""

from __future__ import annotations

import argparse
import sys
import time

from agent_rl.demo import stages
from benchmarks import records
from benchmarks.rl_vs_sft import __doc__ as ABOUT
from benchmarks.rl_vs_sft.compat import check_settings, earlier_rows, host_kind_of
from benchmarks.rl_vs_sft.modes import report_cells, run_kb
from benchmarks.rl_vs_sft.settings import DEV_KB_SEEDS, Settings, kb_workdir
from benchmarks.rl_vs_sft_tables import ARMS

PROG = "python -m benchmarks.rl_vs_sft"


def parser() -> argparse.ArgumentParser:
    """The command's flags, each default Settings' own."""
    d = Settings()
    ap = argparse.ArgumentParser(prog=PROG, description=ABOUT, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-seed", type=int, nargs="+", default=d.kb_seed,
                    help="knowledge base seed(s); every --seeds runs on each (cells = KB x seed); not the kind's "
                         "dev KB (DEV_KB_SEEDS); default 101")
    ap.add_argument("--kb-kind", default=d.kb_kind,
                    help="knowledge base kind, passed to `agent-rl-prep synthetic --kind` (default standard; "
                         "lookalike: the kind with room above imitation, benchmarks/kb_headroom.py)")
    ap.add_argument("--seeds", type=int, nargs="+", default=d.seeds, help="SFT, data order and sampling seeds")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=d.arms,
                    help="the arms each cell runs from its start (default all: sft_more rft grpo sft_all)")
    ap.add_argument("--start-steps", type=int, default=d.start_steps,
                    help="steps of the start SFT (default 60 on both host kinds, chosen per kind on the dev KB; START_STEPS)")
    ap.add_argument("--start-rule", choices=("steps", "explore"), default=d.start_rule,
                    help="steps: the start is SFT's model after --start-steps (default); explore: SFT to "
                         "--start-steps keeps a checkpoint every --start-every steps and the start is the latest "
                         "whose exploration pre-flight passes every floor (docs/explore.md, the handover rule)")
    ap.add_argument("--start-every", type=int, default=d.start_every,
                    help="with --start-rule explore: SFT steps between the checkpoints compared (default 10)")
    ap.add_argument("--minutes", type=float, default=d.minutes,
                    help="minutes of each arm, every second from its first step counted (default 10)")
    ap.add_argument("--sft-lr", type=float, default=d.sft_lr,
                    help="the sft_more arm's learning rate (default: the SFT config's, configs/sft/demo_cpu.yaml)")
    ap.add_argument("--sft-epochs", type=int, default=d.sft_epochs,
                    help="the sft_more arm's epochs over the demonstrations (default: until its minutes end)")
    ap.add_argument("--rft-lr", type=float, default=d.rft_lr,
                    help="the rft arm's learning rate (default: the GRPO config's, or the lr of the key=value overrides)")
    ap.add_argument("--demos", type=int, default=d.demos, help="training questions to build demonstrations from")
    ap.add_argument("--eval-limit", type=int, default=d.eval_limit, help="held-out questions of the report (seeded sample)")
    ap.add_argument("--val-n", type=int, default=d.val_n, help="held-out questions of the running evaluation (kept apart)")
    ap.add_argument("--val-every", type=int, default=d.val_every, help="RL arms' steps between running evaluations")
    ap.add_argument("--best-of-val", action="store_true",
                    help="also compare each arm's best checkpoint by the running-evaluation questions")
    ap.add_argument("--sft-val-every", type=int, default=d.sft_val_every,
                    help="with --best-of-val: SFT arms' steps between their checkpoints (default 10)")
    ap.add_argument("--log-batches", action="store_true",
                    help="the RL arms write every step's whole batch (<arm>/rollouts) and the row says, within "
                         "GRPO's groups, what each search strategy earned and the advantage it got (group_strategy)")
    ap.add_argument("--gain", type=float, default=d.gain, help="the lead over the SFT arm that time to gain waits for")
    ap.add_argument("--demo-args", default=d.demo_args, help="extra arguments of `agent-rl-prep demos` (quoted), e.g. the wording")
    ap.add_argument("--workdir", default=d.workdir,
                    help="the KB's workdir (default runs/rl_vs_sft/kb<K>); with several KB seeds, the folder of "
                         "theirs and of the run's results")
    ap.add_argument("--json", default=d.json, help="write the result here too")
    ap.add_argument("--start-curve", type=int, nargs=2, metavar=("EVERY", "STEPS"), default=d.start_curve,
                    help="instead of the arms: each seed's start SFT to STEPS, evaluated every EVERY steps "
                         "(choose --start-steps with it, on the dev KB; on the lookalike kind also what the "
                         "start's searches earn by strategy)")
    ap.add_argument("--choose", action="store_true",
                    help="instead of the arms: the pre-registered choice of --sft-lr, --sft-epochs and --rft-lr "
                         "on the kind's dev KB (one --kb-seed, the dev one; one seed): every grid point of "
                         "benchmarks/rl_vs_sft_choice.py as its arm, its best checkpoint on the --val-n questions")
    ap.add_argument("--with", dest="with_json", nargs="+", default=d.with_json, metavar="JSON",
                    help="count the rows of earlier runs' rl_vs_sft.json too (other cells, same settings "
                         "and host kind)")
    ap.add_argument("overrides", nargs="*", help="GRPO config overrides of both RL arms, key=value")
    records.add_args(ap)
    return ap


def parse(argv: list[str] | None = None) -> Settings:
    """The settings of a command line, built once: a combination the modes cannot run is refused
    (argparse's error, exit 2) before anything runs; the arms in ARMS's order, each KB seed once."""
    ap = parser()
    args = ap.parse_args(argv)
    refuse = refusal(args)
    if refuse:
        ap.error(refuse)
    if args.choose:
        check_choice_host(ap)
    args.arms = [a for a in ARMS if a in args.arms]
    args.kb_seed = list(dict.fromkeys(args.kb_seed))
    return Settings(**vars(args))  # clock: the one rule (settings.CLOCK)


def refusal(a: argparse.Namespace) -> str | None:
    """Why the parsed command cannot run as given, or None."""
    if a.start_curve and (a.start_curve[0] < 1 or a.start_curve[1] < a.start_curve[0]):
        return "--start-curve EVERY STEPS: 1 <= EVERY <= STEPS"
    if a.start_curve and len(a.kb_seed) > 1:
        return "--start-curve runs on one --kb-seed (the dev KB)"
    if a.start_rule == "explore" and not 1 <= a.start_every <= a.start_steps:
        return "--start-every: between 1 and --start-steps"
    if a.sft_val_every < 1:
        return "--sft-val-every: at least 1"
    if a.sft_epochs is not None and a.sft_epochs < 1:
        return "--sft-epochs: at least 1"
    if a.choose and (a.start_curve or a.with_json):
        return "--choose runs alone (no --start-curve, no --with)"
    if a.choose and (a.kb_seed != [DEV_KB_SEEDS.get(a.kb_kind)] or len(a.seeds) != 1):
        return (f"--choose chooses on the {a.kb_kind} kind's dev KB only: --kb-seed "
                f"{DEV_KB_SEEDS.get(a.kb_kind)} and one --seeds")
    if a.choose and any(v is not None for v in (a.sft_lr, a.sft_epochs, a.rft_lr)):
        return "--choose chooses --sft-lr, --sft-epochs and --rft-lr: give none of them"
    if a.start_curve and a.with_json:
        return "--with counts earlier arms' rows; the start curve has none"
    return None


def check_choice_host(ap: argparse.ArgumentParser) -> None:
    """`--choose` runs on a CPU of the native-bf16 kind only: the arms' minutes hold another number
    of steps on another kind, so a choice made there is not the reported cells' choice."""
    from data_prep.hardware import default_device, native_bf16

    native, why = native_bf16("cpu")
    if default_device() != "cpu":
        native, why = False, "a GPU"
    if not native:
        ap.error("--choose chooses on a CPU of the native-bf16 kind, where the reported CPU cells run "
                 f"(docs/preregistration/rl_beyond_imitation.md); this host has {why}")


def main(argv: list[str] | None = None) -> int:
    """Run the command: every KB's workdir checked first, then each KB's mode; the arms' result over
    every cell (this run's and `--with`'s). 130 when interrupted (a re-run goes on)."""
    s = parse(argv)
    dev = DEV_KB_SEEDS.get(s.kb_kind)
    if dev in s.kb_seed and s.mode == "arms":
        print(f"rl_vs_sft: KB seed {dev} is the {s.kb_kind} kind's dev KB the recipe was tuned on; report on "
              "another (its numbers would not be a result)", file=sys.stderr)
    from data_prep.hardware import hardware_line

    host = hardware_line()
    earlier = earlier_rows(s.with_json, s, host_kind_of(host))
    for k in s.kb_seed:  # every KB's workdir before anything runs
        check_settings(kb_workdir(s, k), s, k)
    stages.stop_on_sigterm()
    t0 = time.time()
    rows = []
    try:
        for k in s.kb_seed:
            rows += run_kb(k, s, host)
    except KeyboardInterrupt:
        print("\n[rl_vs_sft] interrupted (a re-run with the same --workdir goes on)", file=sys.stderr)
        return 130
    if s.mode == "arms":
        report_cells(sorted(earlier + rows, key=lambda r: (r["kb_seed"], r["seed"])), s, host, t0)
    return 0
